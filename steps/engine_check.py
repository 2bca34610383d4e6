"""Gate 0 engine-check, run inside the engine image: does *this* engine build accept the plan?

It asks the engine's own code, never a list written here: its CLI parser is fed
the exact argv of :func:`gauntlet.steps.engine_cmd.engine_command` for every rank and for
every Gate 6 variant on this engine; its registries say whether the reasoning and
tool-call parsers and the architecture are known. Checks: the architecture is
registered; the parser accepts every planned flag and value (vLLM: its serve-args
validation and its attention-backend config too; SGLang: its speculative-algorithm
registry too); the ranks differ only in placement (node rank, rendezvous address,
host); each variant parses and changes one group of the engine's options; the
parser names are registered.

:class:`VllmAdapter` / :class:`SglangAdapter` / :class:`LlamaCppAdapter` do the importing (I/O);
:func:`collect` gathers facts through one; :func:`judge` is pure.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gauntlet.contract import Check
from gauntlet.params.models import Profile
from gauntlet.steps import Needs, _llamacpp
from gauntlet.steps._shared_options import engine_option
from gauntlet.steps.engine_cmd import Placement, apply_change, engine_command, engine_program
from gauntlet.steps.options import GateOptions, option

__all__ = ["NAME", "HELP", "NEEDS", "Options", "run", "ADAPTERS", "VllmAdapter", "SglangAdapter", "LlamaCppAdapter",
           "planned_argvs", "collect", "judge"]

NAME = "engine-check"
HELP = "Gate 0: the engine image registers the architecture and its own parser accepts every planned flag"
NEEDS = Needs(model_cache="read")
LEADER = "10.0.0.1:20000"     # placeholder rendezvous address: ranks share it, only its syntax is judged


class _ParseError(Exception):
    pass


def _raise(msg: str) -> None:
    raise _ParseError(msg)


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[argparse.Namespace | None, str | None]:
    parser.error = _raise  # type: ignore[method-assign]  # argparse would print usage and exit(2)
    try:
        return parser.parse_args(argv), None
    except _ParseError as exc:
        return None, str(exc)
    except SystemExit as exc:
        return None, f"parser exited with {exc.code}"
    except Exception as exc:  # a type= converter that raises its own error
        return None, f"{type(exc).__name__}: {exc}"


def _plain(v: Any) -> Any:
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return str(v)


def _flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """dest -> the action that owns it (the first one: deprecated aliases share a dest)."""
    out: dict[str, argparse.Action] = {}
    for a in parser._actions:
        if a.option_strings and a.dest not in ("help", argparse.SUPPRESS):
            out.setdefault(a.dest, a)
    return out


def _action(parser: argparse.ArgumentParser, flag: str) -> argparse.Action | None:
    return next((a for a in _flags(parser).values() if flag in a.option_strings), None)


def _options(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> dict[str, Any]:
    """The options the command sets away from the parser's defaults, keyed by their long flag."""
    out: dict[str, Any] = {}
    for dest, action in _flags(parser).items():
        v = getattr(ns, dest, None)
        if v != action.default:
            flag = next((o for o in action.option_strings if o.startswith("--")), action.option_strings[0])
            out[flag] = _plain(v)
    return out


class VllmAdapter:
    """vLLM: ModelRegistry, the OpenAI server's make_arg_parser, Reasoning/ToolParserManager."""

    engine = "vllm"
    # what may differ between ranks of one deployment (steps/engine_cmd.py engine_command)
    rank_flags = frozenset({"--node-rank", "--headless", "--master-addr", "--master-port", "--host"})

    def __init__(self) -> None:
        import vllm
        from vllm import ModelRegistry
        try:
            from vllm.utils.argparse_utils import FlexibleArgumentParser
        except ImportError:  # before 0.11
            from vllm.utils import FlexibleArgumentParser
        try:
            from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
        except ImportError:  # before 0.30
            from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
        self.version = getattr(vllm, "__version__", None)
        self._registry = ModelRegistry
        # no prefix matching: a misspelt flag must not pass as an abbreviation of a real one
        self._parser = make_arg_parser(FlexibleArgumentParser(allow_abbrev=False))
        self._validate = validate_parsed_serve_args
        self._groups = {a.dest: g.title or "" for g in self._parser._action_groups for a in g._group_actions}

    def architectures(self) -> list[str]:
        return sorted(self._registry.get_supported_archs())

    def default_of(self, flag: str) -> Any:
        a = _action(self._parser, flag)
        return _plain(a.default) if a else None

    def group_of(self, flag: str) -> str:
        """The engine's own option group of a flag (vLLM: the argparse group, one per config class)."""
        a = _action(self._parser, flag)
        return self._groups.get(a.dest if a else flag, "")

    def parse(self, argv: list[str]) -> tuple[str | None, dict[str, Any] | None]:
        ns, err = _parse(self._parser, argv)
        if err:
            return err, None
        try:
            self._validate(ns)
        except Exception as exc:  # TypeError/ValueError with the engine's own message
            return f"{type(exc).__name__}: {exc}", None
        if getattr(ns, "attention_backend", None):
            try:
                from vllm.config import AttentionConfig
                AttentionConfig(backend=ns.attention_backend)
            except ImportError:
                pass
            except Exception as exc:  # pydantic ValidationError: the engine's list of backends
                errs = exc.errors() if hasattr(exc, "errors") else [{"msg": str(exc)}]
                msg = str(errs[0].get("msg", exc)).removeprefix("Value error, ")
                return f"--attention-backend {ns.attention_backend}: {msg}"[:600], None
        return None, _options(self._parser, ns)

    def reasoning_parsers(self) -> list[str]:
        from vllm.reasoning import ReasoningParserManager
        m = ReasoningParserManager
        return sorted(m.list_registered() if hasattr(m, "list_registered") else m.reasoning_parsers)

    def tool_parsers(self) -> list[str]:
        try:
            from vllm.tool_parsers import ToolParserManager
        except ImportError:
            from vllm.entrypoints.openai.tool_parsers import ToolParserManager
        m = ToolParserManager
        return sorted(m.list_registered() if hasattr(m, "list_registered") else m.tool_parsers)


class SglangAdapter:
    """SGLang: ServerArgs' own parser, the parser registries, SpeculativeAlgorithm, the model registry's source.

    The reasoning and tool-call registries are imported *before* the parser is built: ServerArgs
    takes the ``--reasoning-parser``/``--tool-call-parser`` choices from those registries when they
    are loaded (otherwise from its dependency-free copies of their names). The model registry
    imports every model module with its CUDA kernels, so outside the engine image it is read from
    the modules' source (:mod:`gauntlet.steps._sglang_models`).
    """

    engine = "sglang"
    rank_flags = frozenset({"--node-rank", "--dist-init-addr", "--host"})

    def __init__(self) -> None:
        import sglang
        from sglang.srt.function_call.function_call_parser import FunctionCallParser
        from sglang.srt.parser.reasoning_parser import ReasoningParser
        from sglang.srt.server_args import ServerArgs
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
        self.version = getattr(sglang, "__version__", None)
        self._reasoning = sorted(ReasoningParser.DetectorMap)
        self._tools = sorted(FunctionCallParser.ToolCallParserEnum)
        self._spec = SpeculativeAlgorithm
        self._server_args = ServerArgs
        # as sglang.srt.server_args.prepare_server_args builds it, minus prefix matching
        self._parser = argparse.ArgumentParser(prog="sglang serve", allow_abbrev=False)
        ServerArgs.add_cli_args(self._parser)
        self._ns_by_field = getattr(ServerArgs, "_NS_BY_FIELD", {})
        # SGLang's cross-flag rules live in its resolution hooks; the model- and hardware-independent
        # one is run on each record. Its module imports sglang.srt.configs -> torchvision, which the
        # test environment leaves out (PyPI's torchvision breaks vLLM CPU): there it is reported, not run.
        self.rules: list[str] = []
        self.rules_missing: str | None = None
        try:
            from sglang.srt.arg_groups.kv_cache_hook import handle_cache_compatibility
            self._rules = [handle_cache_compatibility]
            self.rules = [f"{f.__module__}.{f.__name__}" for f in self._rules]
        except ImportError as exc:
            self._rules = []
            self.rules_missing = f"{type(exc).__name__}: {exc}"

    def architectures(self) -> list[str]:
        from gauntlet.steps._sglang_models import registered_architectures
        return sorted(registered_architectures())

    def default_of(self, flag: str) -> Any:
        a = _action(self._parser, flag)
        return _plain(a.default) if a else None

    def group_of(self, flag: str) -> str:
        """The engine's own option group of a flag (SGLang: the ServerArgs namespace holding its field)."""
        a = _action(self._parser, flag)
        dest = a.dest if a else flag
        ns = self._ns_by_field.get(dest)   # field -> its namespace path, e.g. "spec", "memory"
        return ns if isinstance(ns, str) else getattr(ns, "_NS_PATH", None) or dest

    def parse(self, argv: list[str]) -> tuple[str | None, dict[str, Any] | None]:
        ns, err = _parse(self._parser, argv)
        if err:
            return err, None
        algo = getattr(ns, "speculative_algorithm", None)
        if algo is not None:   # a free string in the parser; the scheduler resolves it like this
            try:
                self._spec.from_string(algo)
            except ValueError as exc:
                return f"--speculative-algorithm {algo}: {exc}", None
        try:
            record = self._server_args.from_cli_args(ns)   # the record sglang.launch_server builds from it
            for rule in self._rules:
                rule(record)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}", None
        return None, _options(self._parser, ns)

    def reasoning_parsers(self) -> list[str]:
        return self._reasoning

    def tool_parsers(self) -> list[str]:
        return self._tools


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
        self._program = _llamacpp.program_for(self._python)
        self._home = _llamacpp.home(self._python)
        # LLAMA_ARG_* variables would change what the parser sees: the plan is the argv alone
        self._env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
        try:
            h = subprocess.run([self._program, "--help"], capture_output=True, text=True, timeout=60, env=self._env)
        except OSError as exc:
            raise ImportError(f"{self._program}: {exc.strerror}") from None
        self._help = h.stdout + h.stderr
        self._table = _llamacpp.parse_help(self._help)
        if "--ctx-size" not in self._table:
            raise ImportError(f"{self._program} --help lists no --ctx-size: not llama.cpp's server")
        try:
            self.version = (self._home / "VERSION").read_text().strip()
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
        return None, _llamacpp.options_of(argv, self._table)

    def reasoning_parsers(self) -> list[str]:
        text = self._help           # the formats its --help lists under --reasoning-format
        at = text.find("--reasoning-format")
        block = text[at:text.find("(env:", at)] if at >= 0 else ""
        return sorted(set(re.findall(r"^\s+- ([\w-]+):", block, re.M)) | {"auto"})

    def tool_parsers(self) -> list[str]:
        return []


ADAPTERS = {"vllm": VllmAdapter, "sglang": SglangAdapter, "llamacpp": LlamaCppAdapter}


def planned_argvs(profile: Profile, engine: str, model_path: str) -> dict[str, list[str]]:
    """The flags each rank would get (the module prefix stripped), for the baseline and each variant.

    Keys: ``rank0``, ``rank1`` (two-node profiles), then ``<variant>/rank0`` ... for every Gate 6
    variant that runs on this engine.
    """
    spec = profile.engines[engine]
    n = max(1, len(profile.hardware.nodes)) if profile.hardware.kind == "kubernetes" else 1
    ranks = {"rank0": Placement()} if n == 1 else {
        f"rank{r}": Placement(nnodes=n, node_rank=r, dist_addr=LEADER) for r in range(n)}
    specs = {"": spec} | {f"{v.name}/": apply_change(spec, v.change) for v in profile.experiments
                          if v.engine in (None, engine)}
    skip = len(engine_program(engine))
    return {f"{label}{k}": engine_command(engine, s, model_path=model_path, served_name=profile.model.served_name,
                                          placement=p)[skip:]
            for label, s in specs.items() for k, p in ranks.items()}


def collect(adapter: Any, argvs: dict[str, list[str]]) -> dict[str, Any]:
    """Facts through one adapter; each query's failure is recorded, not raised."""
    facts: dict[str, Any] = {"engine": adapter.engine, "version": adapter.version, "parse": {}, "options": {},
                             "argv": argvs, "rank_flags": sorted(adapter.rank_flags), "groups": {}}
    for key, fn in (("architectures", adapter.architectures), ("reasoning_parsers", adapter.reasoning_parsers),
                    ("tool_parsers", adapter.tool_parsers)):
        try:
            facts[key] = fn()
        except Exception as exc:
            facts[key] = None
            facts[f"{key}_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    for key, argv in argvs.items():
        facts["parse"][key], facts["options"][key] = adapter.parse(argv)
    flags = {f for opts in facts["options"].values() if opts for f in opts}
    facts["groups"] = {f: adapter.group_of(f) for f in sorted(flags)}
    facts["defaults"] = {f: adapter.default_of(f) for f in sorted(flags)}
    facts["rules"] = getattr(adapter, "rules", None)
    facts["rules_missing"] = getattr(adapter, "rules_missing", None)
    return facts


def _diff(a: dict[str, Any], b: dict[str, Any], defaults: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """flag -> (value in a, value in b) for every flag set differently (absent: the parser's default)."""
    return {f: (a.get(f, defaults.get(f)), b.get(f, defaults.get(f))) for f in sorted(set(a) | set(b))
            if a.get(f, defaults.get(f)) != b.get(f, defaults.get(f))}


def _by_error(errs: dict[str, str]) -> list[tuple[list[str], str]]:
    """The same rejection on several ranks said once: [(ranks, error)] in the ranks' order."""
    out: dict[str, list[str]] = {}
    for rank, err in errs.items():
        out.setdefault(err, []).append(rank)
    return [(rs, e) for e, rs in out.items()]


def _show(d: dict[str, tuple[Any, Any]]) -> str:
    return ", ".join(f"{f} {x!r}->{y!r}" for f, (x, y) in d.items())


def _ranks_check(facts: dict[str, Any], ranks: list[str]) -> Check:
    eng, opts = facts["engine"], facts["options"]
    if len(ranks) < 2:
        return Check("ranks", "skip", None, None, "one rank: nothing to compare")
    if any(opts.get(r) is None for r in ranks):
        return Check("ranks", "skip", None, None, "a rank's command did not parse (see cli-flags)")
    allowed, dfl = set(facts["rank_flags"]), facts["defaults"]
    bad = {r: {f: v for f, v in _diff(opts[ranks[0]], opts[r], dfl).items() if f not in allowed} for r in ranks[1:]}
    bad = {r: d for r, d in bad.items() if d}
    if bad:
        return Check("ranks", "fail", sorted(allowed), {r: list(d) for r, d in bad.items()},
                     "; ".join(f"{ranks[0]} and {r} differ beyond placement as {eng} parses them: {_show(d)}"
                               for r, d in bad.items()))
    return Check("ranks", "pass", sorted(allowed), {r: _diff(opts[ranks[0]], opts[r], dfl) for r in ranks[1:]},
                 f"{eng}'s parser sees the {len(ranks)} ranks differ only in placement "
                 f"({', '.join(sorted({f for r in ranks[1:] for f in _diff(opts[ranks[0]], opts[r], dfl)}))})")


def _variant_check(facts: dict[str, Any], name: str, ranks: list[str]) -> Check:
    eng, opts = facts["engine"], facts["options"]
    check = f"variant-{name}"
    errs = {r: facts["parse"][f"{name}/{r}"] for r in ranks if facts["parse"][f"{name}/{r}"]}
    if errs:
        if all(facts["parse"].get(r) == e for r, e in errs.items()):
            return Check(check, "fail", "accepted", errs, f"variant {name!r} inherits the baseline command's "
                         f"rejection ({', '.join(errs)}; see cli-flags)")
        return Check(check, "fail", "accepted", errs, "; ".join(
            f"{eng}'s own parser rejects variant {name!r} ({', '.join(rs)}): {e}" for rs, e in _by_error(errs)))
    base = opts.get(ranks[0])
    if base is None:
        return Check(check, "skip", None, None, "the baseline command did not parse (see cli-flags)")
    d = _diff(base, opts[f"{name}/{ranks[0]}"], facts["defaults"])
    groups = sorted({facts["groups"].get(f, f) for f in d})
    if not d:
        return Check(check, "fail", "one change", {}, f"variant {name!r} parses to the baseline's options on "
                     f"{eng}: it changes nothing")
    if len(groups) > 1:
        return Check(check, "fail", "one group of options", d,
                     f"variant {name!r} changes {len(groups)} groups of {eng}'s options ({', '.join(groups)}): "
                     f"{_show(d)}; a variant changes one variable")
    return Check(check, "pass", "one group of options", d, f"{eng} accepts variant {name!r}: {_show(d)}")


def _expected_archs(profile: Profile, model_path: Path) -> tuple[list[str] | None, str]:
    if profile.model.architecture.architectures:
        return list(profile.model.architecture.architectures), "the profile"
    try:
        cfg = json.loads((model_path / "config.json").read_text())
        if isinstance(cfg.get("architectures"), list):
            return cfg["architectures"], f"{model_path}/config.json"
    except (OSError, ValueError, AttributeError):
        pass
    return None, ""


def _registered(name: str, label: str, want: str | None, have: list[str] | None, err: str | None,
                engine: str, field: str) -> Check:
    if want is None:
        return Check(name, "skip", None, None, f"the profile plans no {label} (engines.{engine}.{field})")
    if have is None:
        return Check(name, "error", want, None, f"cannot list {engine}'s {label}s: {err}")
    if want in have:
        return Check(name, "pass", want, want, f"{want!r} is registered in {engine}")
    return Check(name, "fail", want, None, f"{label} {want!r} is not registered in {engine} "
                 f"(engines.{engine}.{field}); registered: {', '.join(have)}")


def judge(facts: dict[str, Any], profile: Profile, engine: str, archs: list[str] | None,
          archs_source: str) -> list[Check]:
    """Pure: engine facts -> checks."""
    eng = facts["engine"]
    checks = [Check("engine-import", "pass", engine, facts.get("version"), f"{eng} {facts.get('version')} imported")]
    have = facts.get("architectures")
    if archs is None:
        checks.append(Check("architecture", "skip", None, None, "unknown expectation: fill "
                            "model.architecture.architectures (and no config.json to read it from)"))
    elif have is None:
        checks.append(Check("architecture", "error", archs, None,
                            f"cannot list {eng}'s registered architectures: {facts.get('architectures_error')}"))
    else:
        missing = [a for a in archs if a not in have]
        checks.append(Check("architecture", "fail" if missing else "pass", archs, [a for a in archs if a in have],
                            (f"{', '.join(missing)} (from {archs_source}) not in {eng}'s model registry "
                             f"({len(have)} architectures)") if missing
                            else f"{', '.join(archs)} registered in {eng} (from {archs_source})"))
    ranks = [k for k in facts["parse"] if "/" not in k]
    bad = {rank: err for rank in ranks if (err := facts["parse"][rank])}
    checks.append(Check("cli-flags", "fail" if bad else "pass", "accepted", bad or "accepted",
                        "; ".join(f"{eng}'s own parser rejects the {' and '.join(rs)} command{'s' * (len(rs) > 1)}: "
                                  f"{err}" for rs, err in _by_error(bad))
                        if bad else f"{eng}'s own parser accepts the planned command ({', '.join(ranks)})"))
    checks.append(_ranks_check(facts, ranks))
    if facts.get("rules_missing"):
        checks.append(Check("engine-rules", "skip", None, None, f"{eng}'s cross-flag rules were not run here: "
                            f"{facts['rules_missing']} (they run inside the engine image)"))
    elif facts.get("rules"):
        checks.append(Check("engine-rules", "pass", facts["rules"], facts["rules"],
                            f"{eng}'s own rules ran on every planned command: {', '.join(facts['rules'])}"))
    variants = list(dict.fromkeys(k.split("/")[0] for k in facts["parse"] if "/" in k))
    checks += [_variant_check(facts, v, ranks) for v in variants]
    spec = profile.engines[engine]
    checks.append(_registered("reasoning-parser", "reasoning parser", spec.reasoning_parser,
                              facts.get("reasoning_parsers"), facts.get("reasoning_parsers_error"), eng,
                              "reasoning_parser"))
    checks.append(_registered("tool-call-parser", "tool-call parser", spec.tool_call_parser,
                              facts.get("tool_parsers"), facts.get("tool_parsers_error"), eng, "tool_call_parser"))
    return checks


@dataclass(frozen=True, kw_only=True)
class Options(GateOptions):
    engine: str = option(choices=tuple(sorted(ADAPTERS)), help="which engine this image holds")
    model_path: str | None = option(None, help="model directory for the command line and, when the profile leaves "
                                               "architectures null, its config.json (default: model.mount_path)")

    def __post_init__(self) -> None:
        super().__post_init__()
        engine_option(self, self.engine)


def run(opts: Options, out: Path) -> tuple[list[Check], dict[str, Any]]:
    profile = opts.the_profile
    engine = opts.engine
    model_path = profile.model_dir(opts.model_path)
    argvs = planned_argvs(profile, engine, str(model_path))
    try:
        adapter = ADAPTERS[engine]()
    except ImportError as exc:
        image = profile.engines[engine].image
        return [Check("engine-import", "error", engine, None,
                      f"{engine} is not importable here ({exc}); engine-check must run inside the engine image "
                      f"(images/engines.yaml {image!r})")], {"argv": argvs}
    except Exception as exc:  # the engine is there but broken (torch/driver mismatch): still one line
        return [Check("engine-import", "error", engine, None,
                      f"importing {engine} failed: {type(exc).__name__}: {exc}".splitlines()[0])], {"argv": argvs}
    facts = collect(adapter, argvs)
    archs, source = _expected_archs(profile, model_path)
    checks = judge(facts, profile, engine, archs, source)
    (out / "engine-facts.json").write_text(json.dumps(facts, indent=1, default=str))
    return checks, {"engine": engine, "version": facts.get("version"), "argv": argvs}
