"""One module per gate. Each step module has the small face of :class:`Step`.

The registry maps a step name (what ``gauntlet step <name>`` and the Argo
containers run) to its module; modules import lazily so the CLI starts fast.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from steps._evidence import Check

__all__ = ["STEPS", "Step", "load_step"]


class Step(Protocol):
    NAME: str
    HELP: str
    NEEDS_PROFILE: bool

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace, out: Path) -> tuple[list[Check], dict[str, Any]]: ...

    # optional: ``exit_code(verdict) -> int`` when the exit code means something other than the verdict
    # (cleanup and janitor: 0 unless something is still held)


# name -> module; the order is the order `gauntlet step --help` lists them
STEPS: dict[str, str] = {
    "prewarm": "steps.prewarm",
    "preflight": "steps.preflight",
    "preflight-compare": "steps.preflight_compare",
    "engine-check": "steps.engine_check",
    "nodes": "steps.nodes",
    "network": "steps.network",
    "deploy": "steps.deploy",
    "smoke": "steps.smoke",
    "perf": "steps.perf",
    "longctx": "steps.longctx",
    "experiment": "steps.experiment",
    "teardown": "steps.teardown",
    "report": "steps.report_step",
    "regress": "steps.regress",
    "cleanup": "steps.cleanup",
    "janitor": "steps.janitor",
}


def load_step(name: str) -> ModuleType:
    return importlib.import_module(STEPS[name])
