"""Stop one engine of the sequence and wait until its resources are free.

Without ``--variant`` it stops the baseline only (Gate 6 releases it before the variants, the sequence's
last task again at the end: that one passes, nothing left to stop, when it was released already); with
``--variant`` only that variant. One never stops the other.

The sequence's last teardown runs whatever happened before it (workflows/graph.py ``ANY_OUTCOME``): the GPUs
come back before the next engine's sequence deploys. Given ``--upstream`` (the phase of each task before it),
it releases first and then fails when one of them did not pass, naming each: it is the sequence's leaf, and
Argo judges a DAG by its leaves (shared_options.upstream_check).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gauntlet.contract import Check, UsageError
from gauntlet.steps.gate import Needs
from gauntlet.steps.backends import backend_for
from gauntlet.steps.gates.shared_options import (backend_option, carry_upstream, engine_option, upstream_option,
                                                  upstream_phases)
from gauntlet.steps.options import GateOptions, option

__all__ = ["NAME", "HELP", "NEEDS", "Options", "run"]

NAME = "teardown"
HELP = "stop the engine this run deployed (scale to 0 / stop the process group) and wait until freed"
NEEDS = Needs(api="manage", windowed=False)


@dataclass(frozen=True, kw_only=True)
class Options(GateOptions):
    engine: str = option()
    backend: str | None = backend_option()
    run_id: str | None = option(None)
    variant: str | None = option(None, help="stop this Gate 6 variant only (default: the baseline only)")
    upstream: tuple[str, ...] = upstream_option()

    def __post_init__(self) -> None:
        super().__post_init__()
        engine_option(self, self.engine)
        upstream_phases(self.upstream)
        if self.variant and self.variant not in {v.name for v in self.the_profile.experiments}:
            raise UsageError(f"--variant {self.variant}: not in profile {self.the_profile.name} (has "
                             f"{', '.join(v.name for v in self.the_profile.experiments) or 'none'})")


def run(opts: Options, out: Path) -> tuple[list[Check], dict[str, Any]]:
    return carry_upstream(backend_for(opts.the_profile, opts.backend).teardown(opts, out), opts.upstream,
                          f"the {opts.engine} sequence did not pass; its engine is released (above)")
