"""Stop one engine after its sequence and wait until its resources are free."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gauntlet.contract import Check
from gauntlet.steps import Needs
from gauntlet.steps.backends import BACKENDS, backend_for
from gauntlet.steps._shared_options import engine_option
from gauntlet.steps.options import GateOptions, option

__all__ = ["NAME", "HELP", "NEEDS", "Options", "run"]

NAME = "teardown"
HELP = "stop the engine this run deployed (scale to 0 / stop the process group) and wait until freed"
NEEDS = Needs()


@dataclass(frozen=True, kw_only=True)
class Options(GateOptions):
    engine: str = option()
    backend: str | None = option(None, choices=tuple(BACKENDS))
    run_id: str | None = option(None)

    def __post_init__(self) -> None:
        super().__post_init__()
        engine_option(self, self.engine)


def run(opts: Options, out: Path) -> tuple[list[Check], dict[str, Any]]:
    return backend_for(opts.the_profile, opts.backend).teardown(opts, out)
