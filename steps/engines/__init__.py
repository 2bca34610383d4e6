"""The engines, each one module holding everything gauntlet knows about it, found through one registry.

An engine is an :class:`~gauntlet.steps.engines.adapter.Engine`: its command line (program, serving arguments, flags from an
:class:`~gauntlet.params.models.EngineSpec`), the flag that bounds one request's context, Gate 0's adapter
onto its own flag parser, its reply conventions, its Prometheus metric names, and the optional pieces only
some engines have (an env the args imply, a host-IP variable the pod fills, an expert distribution recorder,
a local conversion of the weights, a diagnostic bench client). :data:`ENGINES` maps each name to the module
that defines ``ENGINE``; the module is imported on first use. Adding an engine is one module here, one line
in :data:`ENGINES`, and its name in the params layer (``params/models.py`` ``ENGINE_NAMES``,
``params/engine_inputs.py`` ``TYPED_FLAGS``, an image in ``params/images.yaml``), which sits below steps;
tests/test_engine_registry.py keeps those in step.
"""

from __future__ import annotations

import importlib

from gauntlet.contract import UsageError
from gauntlet.steps.engines.adapter import REQUIRED, Engine
from gauntlet.steps.engines.replies import OPENAI, ReplyRules

__all__ = ["Engine", "ENGINES", "REQUIRED", "engine", "find", "rules_for", "metric_names",
           "diagnostic_clients"]

# engine name -> the module whose ENGINE it is (imported when first asked for)
ENGINES: dict[str, str] = {
    "sglang": "gauntlet.steps.engines.sglang",
    "vllm": "gauntlet.steps.engines.vllm",
    "llamacpp": "gauntlet.steps.engines.llamacpp",
}


def find(name: str) -> Engine | None:
    """The registered engine, or None for a name no module is registered for."""
    module = ENGINES.get(name)
    if module is None:
        return None
    eng = importlib.import_module(module).ENGINE
    if eng.name != name:
        raise UsageError(f"{module} defines engine {eng.name!r}, registered as {name!r}")
    return eng


def engine(name: str) -> Engine:
    """The registered engine; an unknown name is a one-line error naming the known ones."""
    eng = find(name)
    if eng is None:
        raise UsageError(f"unknown engine {name!r}: gauntlet knows {', '.join(ENGINES)}")
    return eng


def rules_for(name: str) -> ReplyRules:
    """The engine's reply conventions; OpenAI's for an engine not registered."""
    eng = find(name)
    return eng.replies if eng else OPENAI


def metric_names() -> dict[str, tuple[str, ...]]:
    """Engine-neutral gauge -> every registered engine's Prometheus names for it (one scrape has one engine's)."""
    out: dict[str, tuple[str, ...]] = {}
    for name in ENGINES:
        for key, metrics in engine(name).metrics.items():
            out[key] = out.get(key, ()) + tuple(m for m in metrics if m not in out.get(key, ()))
    return out


def diagnostic_clients() -> dict[str, Engine]:
    """Diagnostic client label -> the engine that ships it."""
    return {e.diagnostic_client: e for e in map(engine, ENGINES) if e.diagnostic_client and e.diagnostic_bench}

