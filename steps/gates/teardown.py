"""Stop one engine of the sequence and wait until its resources are free.

Without ``--variant`` it stops the baseline only (Gate 6 releases it before the variants, the sequence's
last task again at the end: that one passes, nothing left to stop, when it was released already); with
``--variant`` only that variant. One never stops the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gauntlet.contract import Check, UsageError
from gauntlet.steps.gate import Needs
from gauntlet.steps.backends import backend_for
from gauntlet.steps.gates.shared_options import backend_option, engine_option
from gauntlet.steps.options import GateOptions, option

__all__ = ["NAME", "HELP", "NEEDS", "Options", "run"]

NAME = "teardown"
HELP = "stop the engine this run deployed (scale to 0 / stop the process group) and wait until freed"
NEEDS = Needs(api="manage")


@dataclass(frozen=True, kw_only=True)
class Options(GateOptions):
    engine: str = option()
    backend: str | None = backend_option()
    run_id: str | None = option(None)
    variant: str | None = option(None, help="stop this Gate 6 variant only (default: the baseline only)")

    def __post_init__(self) -> None:
        super().__post_init__()
        engine_option(self, self.engine)
        if self.variant and self.variant not in {v.name for v in self.the_profile.experiments}:
            raise UsageError(f"--variant {self.variant}: not in profile {self.the_profile.name} (has "
                             f"{', '.join(v.name for v in self.the_profile.experiments) or 'none'})")


def run(opts: Options, out: Path) -> tuple[list[Check], dict[str, Any]]:
    return backend_for(opts.the_profile, opts.backend).teardown(opts, out)
