"""Gate 0 engine-check, run inside the engine image: does *this* engine build accept the plan?

It imports the engine's own model registry and its own CLI parser (no help-text
grepping) and feeds it the exact argv of :func:`steps.engine_cmd.engine_command`
for every rank. Checks: the profile's architecture is registered, the parser
accepts every planned flag (and, for vLLM, the attention backend is one its
config knows), the reasoning and tool-call parser names are registered.

:class:`VllmAdapter` / :class:`SglangAdapter` do the importing (I/O);
:func:`collect` gathers facts through one; :func:`judge` is pure.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from params.models import Profile
from steps._evidence import Check, UsageError
from steps.engine_cmd import Placement, engine_command

__all__ = ["NAME", "HELP", "NEEDS_PROFILE", "add_arguments", "run", "ADAPTERS", "VllmAdapter", "SglangAdapter",
           "planned_argvs", "collect", "judge"]

NAME = "engine-check"
HELP = "Gate 0: the engine image registers the architecture and its own parser accepts every planned flag"
NEEDS_PROFILE = True


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


class VllmAdapter:
    """vLLM: ModelRegistry, the OpenAI server's make_arg_parser, Reasoning/ToolParserManager."""

    engine = "vllm"

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

    def architectures(self) -> list[str]:
        return sorted(self._registry.get_supported_archs())

    def parse(self, argv: list[str]) -> str | None:
        ns, err = _parse(self._parser, argv)
        if err:
            return err
        try:
            self._validate(ns)
        except Exception as exc:  # TypeError/ValueError with the engine's own message
            return f"{type(exc).__name__}: {exc}"
        if getattr(ns, "attention_backend", None):
            try:
                from vllm.config import AttentionConfig
                AttentionConfig(backend=ns.attention_backend)
            except ImportError:
                pass
            except Exception as exc:  # pydantic ValidationError: the engine's list of backends
                errs = exc.errors() if hasattr(exc, "errors") else [{"msg": str(exc)}]
                msg = str(errs[0].get("msg", exc)).removeprefix("Value error, ")
                return f"--attention-backend {ns.attention_backend}: {msg}"[:600]
        return None

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
    """SGLang: its model registry, ServerArgs.add_cli_args, ReasoningParser / FunctionCallParser maps."""

    engine = "sglang"

    def __init__(self) -> None:
        import sglang
        from sglang.srt.server_args import ServerArgs
        self.version = getattr(sglang, "__version__", None)
        self._parser = argparse.ArgumentParser(allow_abbrev=False)
        ServerArgs.add_cli_args(self._parser)

    def architectures(self) -> list[str]:
        from sglang.srt.models.registry import ModelRegistry
        return sorted(ModelRegistry.get_supported_archs())

    def parse(self, argv: list[str]) -> str | None:
        return _parse(self._parser, argv)[1]

    def reasoning_parsers(self) -> list[str]:
        try:
            from sglang.srt.parser.reasoning_parser import ReasoningParser
        except ImportError:
            from sglang.srt.reasoning_parser import ReasoningParser
        return sorted(ReasoningParser.DetectorMap)

    def tool_parsers(self) -> list[str]:
        from sglang.srt.function_call.function_call_parser import FunctionCallParser
        return sorted(FunctionCallParser.ToolCallParserEnum)


ADAPTERS = {"vllm": VllmAdapter, "sglang": SglangAdapter}


def planned_argvs(profile: Profile, engine: str, model_path: str) -> dict[str, list[str]]:
    """The flags each rank would get (the module prefix stripped): what the parser is fed."""
    spec = profile.engines[engine]
    n = max(1, len(profile.hardware.nodes)) if profile.hardware.kind == "kubernetes" else 1
    ranks = {"rank0": Placement()} if n == 1 else {
        f"rank{r}": Placement(nnodes=n, node_rank=r, dist_addr="10.0.0.1:29500") for r in (0, 1)}
    return {k: engine_command(engine, spec, model_path=model_path, served_name=profile.model.served_name,
                              placement=p)[3:] for k, p in ranks.items()}


def collect(adapter: Any, argvs: dict[str, list[str]]) -> dict[str, Any]:
    """Facts through one adapter; each query's failure is recorded, not raised."""
    facts: dict[str, Any] = {"engine": adapter.engine, "version": adapter.version, "parse": {}, "argv": argvs}
    for key, fn in (("architectures", adapter.architectures), ("reasoning_parsers", adapter.reasoning_parsers),
                    ("tool_parsers", adapter.tool_parsers)):
        try:
            facts[key] = fn()
        except Exception as exc:
            facts[key] = None
            facts[f"{key}_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    for rank, argv in argvs.items():
        facts["parse"][rank] = adapter.parse(argv)
    return facts


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
    bad = {rank: err for rank, err in facts["parse"].items() if err}
    checks.append(Check("cli-flags", "fail" if bad else "pass", "accepted", bad or "accepted",
                        "; ".join(f"{eng}'s own parser rejects the {rank} command: {err}" for rank, err in bad.items())
                        if bad else f"{eng}'s own parser accepts the planned command ({', '.join(facts['parse'])})"))
    spec = profile.engines[engine]
    checks.append(_registered("reasoning-parser", "reasoning parser", spec.reasoning_parser,
                              facts.get("reasoning_parsers"), facts.get("reasoning_parsers_error"), eng,
                              "reasoning_parser"))
    checks.append(_registered("tool-call-parser", "tool-call parser", spec.tool_call_parser,
                              facts.get("tool_parsers"), facts.get("tool_parsers_error"), eng, "tool_call_parser"))
    return checks


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", required=True, choices=sorted(ADAPTERS), help="which engine this image holds")
    p.add_argument("--model-path", default=None, help="model directory for the command line and, when the "
                   "profile leaves architectures null, its config.json (default: model.mount_path)")


def run(args: argparse.Namespace, out: Path) -> tuple[list[Check], dict[str, Any]]:
    profile: Profile = args.profile_obj
    engine = args.engine
    if engine not in profile.engines:
        raise UsageError(f"engine {engine!r} is not in profile {profile.name} (has {', '.join(profile.engines)})")
    model_path = Path(args.model_path or profile.model.mount_path)
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
