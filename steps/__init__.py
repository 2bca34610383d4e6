"""One module per gate. Each step module has the small face of :class:`Step`.

The registry maps a step name (what ``gauntlet step <name>`` and the Argo
containers run) to its module; modules import lazily so the CLI starts fast.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from gauntlet.contract import Check, GauntletError

if TYPE_CHECKING:
    from gauntlet.steps.options import GateOptions

__all__ = ["STEPS", "Step", "Needs", "GateImportError", "load_step", "needs_of"]


@dataclass(frozen=True)
class Needs:
    """What a gate needs from where it runs; render reads it to build the gate's container (mounts,
    secret, resources) and the runner to load the profile. Declared once, as the gate's ``NEEDS``."""

    profile: bool = True                                    # the runner loads --profile for it
    model_cache: Literal["read", "write"] | None = None     # the node's model cache: read-only, or to fill
    results_secret: bool = False                            # the results store's credentials (env)
    size: Literal["small", "large"] = "small"               # large: 2 CPUs, up to 16Gi (reads whole models)
    node_gpus: bool = False                                 # every GPU of its node (Gate 1's probe)


class Step(Protocol):
    """The face of a gate module (docs/architecture.md)."""

    NAME: str
    HELP: str
    NEEDS: Needs
    Options: type[GateOptions]      # typed options: the command line and the test's constructor

    def run(self, opts: Any, out: Path) -> tuple[list[Check], dict[str, Any]]: ...

    # optional: ``exit_code(verdict) -> int`` when the exit code means something other than the verdict
    # (cleanup and janitor: 0 unless something is still held)


# name -> module; the order is the order `gauntlet step --help` lists them
STEPS: dict[str, str] = {
    "prewarm": "gauntlet.steps.prewarm",
    "preflight": "gauntlet.steps.preflight",
    "preflight-compare": "gauntlet.steps.preflight_compare",
    "engine-check": "gauntlet.steps.engine_check",
    "nodes": "gauntlet.steps.nodes",
    "network": "gauntlet.steps.network",
    "deploy": "gauntlet.steps.deploy",
    "smoke": "gauntlet.steps.smoke",
    "perf": "gauntlet.steps.perf",
    "longctx": "gauntlet.steps.longctx",
    "experiment": "gauntlet.steps.experiment",
    "teardown": "gauntlet.steps.teardown",
    "report": "gauntlet.steps.report_step",
    "regress": "gauntlet.steps.regress",
    "cleanup": "gauntlet.steps.cleanup",
    "janitor": "gauntlet.steps.janitor",
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
