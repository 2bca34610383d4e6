"""Gate 2: deploy one engine and wait until it really answers.

The back end comes from the profile (``hardware.kind``) unless ``--backend``
says otherwise (:func:`gauntlet.steps.backends.backend_for`): ``local`` starts a
subprocess (steps/_deploy_local.py), ``kubernetes`` server-side-applies a
StatefulSet (steps/_deploy_k8s.py). Either writes ``outputs/endpoint`` for the
later gates. Another gate that deploys (Gate 6) builds :class:`Options` and calls
:func:`run`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gauntlet.contract import Check, UsageError
from gauntlet.params.models import EngineSpec
from gauntlet.steps import Needs
from gauntlet.steps.backends import BACKENDS, backend_for
from gauntlet.steps.engine_cmd import apply_change
from gauntlet.steps._shared_options import engine_option
from gauntlet.steps.options import GateOptions, option

__all__ = ["NAME", "HELP", "NEEDS", "Options", "run"]

NAME = "deploy"
HELP = "Gate 2: deploy the engine (local subprocess or Kubernetes StatefulSet) and wait for readiness"
NEEDS = Needs()


@dataclass(frozen=True, kw_only=True)
class Options(GateOptions):
    engine: str = option(help="engine name from the profile (sglang, vllm)")
    backend: str | None = option(None, choices=tuple(sorted(BACKENDS)), help="default: the profile's hardware.kind")
    run_id: str | None = option(None, help="run id / workflow uid (labels what this run creates)")
    variant: str | None = option(None, help="Gate 6 variant to deploy instead of the baseline args")

    def __post_init__(self) -> None:
        super().__post_init__()
        engine_option(self, self.engine)
        self.engine_spec()

    def engine_spec(self) -> EngineSpec:
        """The engine's spec, with ``--variant``'s one change applied; UsageError naming the flag otherwise."""
        profile = self.the_profile
        spec = profile.engines[self.engine]
        if not self.variant:
            return spec
        v = next((x for x in profile.experiments if x.name == self.variant), None)
        if v is None:
            raise UsageError(f"--variant {self.variant}: not in profile {profile.name} "
                             f"(has {', '.join(x.name for x in profile.experiments) or 'none'})")
        try:
            return apply_change(spec, v.change)
        except ValueError as exc:
            raise UsageError(f"--variant {self.variant}: {str(exc).splitlines()[0]}") from None


def run(opts: Options, out: Path) -> tuple[list[Check], dict[str, Any]]:
    return backend_for(opts.the_profile, opts.backend).deploy(opts, out)
