"""One module per gate. Each step module has the small face of :class:`Step`.

The registry maps a step name (what ``gauntlet step <name>`` and the Argo
containers run) to its module; modules import lazily so the CLI starts fast.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from gauntlet.contract import GauntletError
from gauntlet.steps.gate import Needs, Step

__all__ = ["STEPS", "Step", "Needs", "GateImportError", "load_step", "needs_of"]


# name -> module; the order is the order `gauntlet step --help` lists them
STEPS: dict[str, str] = {
    "params": "gauntlet.steps.gates.params",
    "prewarm": "gauntlet.steps.gates.prewarm",
    "preflight": "gauntlet.steps.gates.preflight",
    "preflight-compare": "gauntlet.steps.gates.preflight_compare",
    "engine-check": "gauntlet.steps.gates.engine_check",
    "nodes": "gauntlet.steps.gates.nodes",
    "pull": "gauntlet.steps.gates.pull",
    "network": "gauntlet.steps.gates.network",
    "deploy": "gauntlet.steps.gates.deploy",
    "smoke": "gauntlet.steps.gates.smoke",
    "perf": "gauntlet.steps.gates.perf",
    "longctx": "gauntlet.steps.gates.longctx",
    "experiment-baseline": "gauntlet.steps.gates.experiment_baseline",
    "experiment": "gauntlet.steps.gates.experiment",
    "teardown": "gauntlet.steps.gates.teardown",
    "report": "gauntlet.steps.gates.report",
    "regress": "gauntlet.steps.gates.regress",
    "cleanup": "gauntlet.steps.gates.cleanup",
    "janitor": "gauntlet.steps.gates.janitor",
}


class GateImportError(GauntletError):
    """A gate's module does not import: a crash (exit 1, traceback in the log), not a usage error."""


def load_step(name: str) -> ModuleType:
    """The gate's module; an ImportError inside it becomes :class:`GateImportError` naming the gate."""
    try:
        return importlib.import_module(STEPS[name])
    except ImportError as exc:
        raise GateImportError(f"gate {name}: its module {STEPS[name]} does not import "
                              f"({type(exc).__name__}: {exc})") from exc


def needs_of(module: ModuleType | str) -> Needs:
    """A gate's :class:`Needs` (a gate that declares none needs a profile and nothing else)."""
    mod = load_step(module) if isinstance(module, str) else module
    return getattr(mod, "NEEDS", Needs())
