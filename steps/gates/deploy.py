"""Gate 2: deploy one engine and wait until it really answers.

The back end comes from the profile (``hardware.kind``) unless ``--backend``
says otherwise (:func:`gauntlet.steps.backends.backend_for`): ``local`` starts a
subprocess (steps/backends/local/deploy.py), ``kubernetes`` server-side-applies a
StatefulSet (steps/backends/kubernetes/deploy.py). Either writes ``outputs/endpoint`` for the
later gates. Another gate that deploys (Gate 6) builds :class:`Options` and calls
:func:`run`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gauntlet.contract import Check, UsageError, write_json_atomic
from gauntlet.params.models import EngineSpec
from gauntlet.steps.gate import Needs
from gauntlet.steps.backends import backend_for
from gauntlet.steps.engines.commands import apply_change
from gauntlet.steps.gates.shared_options import backend_option, engine_option
from gauntlet.steps.options import GateOptions, option

__all__ = ["NAME", "HELP", "NEEDS", "Options", "REQUEST", "record_request", "run"]

NAME = "deploy"
HELP = "Gate 2: deploy the engine (local subprocess or Kubernetes StatefulSet) and wait for readiness"
NEEDS = Needs(api="manage")
REQUEST = "request.json"         # in deploy's --out: what a redeploy repeats (steps/gates/engine_present.py)


@dataclass(frozen=True, kw_only=True)
class Options(GateOptions):
    engine: str = option(help="engine name from the profile (sglang, vllm)")
    backend: str | None = backend_option()
    run_id: str | None = option(None, help="run id / workflow uid (labels what this run creates)")
    variant: str | None = option(None, help="Gate 6 variant to deploy instead of the baseline args")
    context_length: int | None = option(None, ge=1, le=2**31 - 1, help="serve at this context instead of args.context_length "
                                        "(Gate 5's restart for a longer rung; at most max_position_embeddings)")
    run_dir: str | None = option(None, help="the engine sequence's directory (local back end; default: the "
                                 "parent of --out)")
    nccl_env: str | None = option(None, help="Gate 1's per-node NCCL/GLOO env, JSON {node: {NCCL_IB_HCA: ...}} "
                                  "(network's nccl_env output); Kubernetes back end: exported by node name")

    def __post_init__(self) -> None:
        super().__post_init__()
        engine_option(self, self.engine)
        self.engine_spec()
        self.node_envs()

    def node_envs(self) -> dict[str, dict[str, str]]:
        """``--nccl-env`` as {node: env}; UsageError naming the flag when it is not that."""
        from gauntlet.steps.cluster.fabric import parse_node_envs
        return parse_node_envs((self.nccl_env,) if self.nccl_env is not None else None, self.the_profile)

    def engine_spec(self) -> EngineSpec:
        """The engine's spec, with ``--variant``'s one change and ``--context-length`` applied; UsageError naming
        the flag otherwise."""
        profile = self.the_profile
        spec = profile.engine(self.engine)
        if self.context_length is not None:
            limit = profile.model.architecture.max_position_embeddings
            if self.context_length < 1 or (limit is not None and self.context_length > limit):
                raise UsageError(f"--context-length {self.context_length}: expected 1 to the model's "
                                 f"max_position_embeddings ({limit})")
            spec = apply_change(spec, {"context_length": self.context_length})
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


def record_request(opts: Options, out: Path) -> None:
    """Write what a later gate needs to deploy the same baseline again (:data:`REQUEST` in ``out``)."""
    req = {"engine": opts.engine, "backend": opts.backend, "run_id": opts.run_id or os.environ.get("GAUNTLET_RUN_ID"),
           "nccl_env": opts.nccl_env, "run_dir": opts.run_dir}
    write_json_atomic(Path(out) / REQUEST, req)


def run(opts: Options, out: Path) -> tuple[list[Check], dict[str, Any]]:
    if not opts.variant and opts.context_length is None:
        # what a later gate repeats when a retry finds this engine released (steps/gates/engine_present.py)
        Path(out).mkdir(parents=True, exist_ok=True)
        record_request(opts, out)
    return backend_for(opts.the_profile, opts.backend).deploy(opts, out)
