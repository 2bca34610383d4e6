"""Engine-neutral :class:`EngineArgs` -> each engine's own command line and env, through the engine registry.

Pure functions: Gate 2 (both back ends), Gate 6 (variants) and the engine-check
(which feeds the flags to the engine's own argument parser) all use these. Each
engine's own part is its module's (:mod:`gauntlet.steps.engines`); these compose
them. Multi-node placement differs only in rank/address/NIC, never in the rest.
"""

from __future__ import annotations

import json
from typing import Any

from gauntlet.params.models import EngineArgs, EngineSpec
from gauntlet.steps.engines import engine as _engine
from gauntlet.steps.engines import find as _find
from gauntlet.steps.engines.argv import Placement, flag

__all__ = ["Placement", "engine_flags", "engine_program", "engine_command", "engine_env", "apply_change",
           "args_hash", "context_of"]


def engine_flags(engine: str, spec: EngineSpec) -> list[str]:
    """The engine's flags for the profile's args and parsers, then ``args.extra`` (no model/port/placement)."""
    f = _engine(engine).flags(spec)
    for k, v in sorted(spec.args.extra.items()):
        f += flag(k, v)
    return f


def engine_program(engine: str, python: str = "python3") -> list[str]:
    """The program part of the command (what engine-check strips to feed the rest to the parser)."""
    return _engine(engine).program(python)


def engine_command(engine: str, spec: EngineSpec, *, model_path: str, served_name: str, python: str = "python3",
                   host: str = "0.0.0.0", placement: Placement = Placement()) -> list[str]:
    """The full argv that starts one rank of the engine."""
    eng = _engine(engine)
    return [*eng.program(python), *eng.serve(spec, model_path=model_path, served_name=served_name, host=host,
                                              placement=placement), *engine_flags(engine, spec)]


def engine_env(engine: str, spec: EngineSpec, placement: Placement = Placement()) -> dict[str, str]:
    """The profile's env given in clear, then what the engine's own start-up sets from its args and that env
    (its ``Engine.env``: SGLang's NCCL_NVLS_ENABLE, say), which wins as it does in the engine's process;
    identical on every rank but the NIC. The env read from Secrets (``spec.secret_env``) is each back end's to
    pass: it never appears in a plan or a verdict."""
    implied = _engine(engine).env
    env = {**spec.clear_env, **(implied(spec) if implied else {})}
    env.update(placement.extra_env)
    return dict(sorted(env.items()))


def apply_change(spec: EngineSpec, change: dict[str, Any]) -> EngineSpec:
    """The spec with one EngineArgs variable changed (Gate 6); validated by the model."""
    (path, value), = change.items()
    args = spec.args.model_dump()
    keys = path.split(".")
    node = args
    for k in keys[:-1]:
        node = node.setdefault(k, {}) if isinstance(node.get(k), dict) or node.get(k) is None else node[k]
    node[keys[-1]] = value
    new_args = EngineArgs.model_validate(args)
    return spec.model_copy(update={"args": new_args})


def context_of(engine: str, argv: list[str]) -> int | None:
    """The context a running rank's argv serves (its last context flag: the engine's ``context_flags``, the one
    bounding a request's prompt + answer), or None when the argv sets none or the engine is not registered."""
    eng = _find(engine)
    flags = eng.context_flags if eng else ()
    found = None
    for i, a in enumerate(argv):
        name, eq, val = a.partition("=")
        if name in flags:
            raw = val if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            found = int(raw) if raw.isdigit() else found
    return found


def args_hash(engine: str, spec: EngineSpec) -> str:
    """A short stable hash of the flags and env: what 'same options' means for A/B and history."""
    import hashlib
    blob = json.dumps({"engine": engine, "flags": engine_flags(engine, spec), "env": engine_env(engine, spec)},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
