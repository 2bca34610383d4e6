"""Before a gate that judges the deployed engine: the engine is there, or it is brought back.

Argo's RETRY (``argo retry``, the UI's button) resets only the failed nodes: ``deploy`` stays Succeeded and is
not re-run, while the exit handler of the failed attempt has released the engine. So every gate that judges
the deployed engine (``Needs.engine_ranks``: smoke, perf, longctx, experiment-baseline) first asks the
resource back end whether the run's baseline engine runs (:meth:`gauntlet.steps.backends.protocol.EngineHost.deployed`); when it does not and
the run's exit handler released it, the gate deploys it again through the same back end, from the request
its sequence's deploy recorded (:data:`gauntlet.steps.gates.deploy.REQUEST`: the same engine, run id, per-node
NCCL env), so the names
and the endpoint do not change, and says so in its evidence (check ``engine_present``). A gate never runs,
and so never passes, against an engine that is absent:

- released by the exit handler (``<run-dir>/cleanup`` exists): redeployed; not ready, or at another
  endpoint than the gate was given: the gate fails without running;
- absent although nothing released it (it stopped on its own): the gate fails without running, nothing
  is redeployed (a crash stays visible);
- no deploy request in this run on the cluster: the deploy task did not run in this workflow, which is
  what ``argo resubmit --memoized`` does (it keeps the old run's deploy node and its endpoint): refused,
  exit 2, one line saying to resubmit without ``--memoized``.

Locally, a gate run by hand against an engine gauntlet did not deploy (no request recorded) is left alone.
The local runner cannot re-run a failed run (workflows/local.py walks the whole graph from the start, deploy
included), so nothing redeploys there: a gate re-run by hand after the exit handler released the engine fails
without running, saying to run the graph again (a redeploy nobody releases would hold the engine).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gauntlet.contract import Check, GauntletError, UsageError
from gauntlet.contract.layout import RunLayout
from gauntlet.steps.backends import backend_for
from gauntlet.steps.gates import deploy
from gauntlet.steps.gates.deploy import REQUEST

if TYPE_CHECKING:
    from gauntlet.params import Profile

__all__ = ["CHECK", "REQUEST", "ensure"]

CHECK = "engine_present"


def _reason(run: RunLayout) -> str | None:
    """Why the engine is gone, when the run released it: its exit handler ran (an earlier attempt's)."""
    if run.released():
        return "released by the exit handler of an earlier attempt"
    return None


def ensure(gate: str, profile: Profile, opts: Any, out: Path) -> tuple[Check | None, dict[str, Any]]:
    """(the ``engine_present`` check or None when the engine runs or is not ours to judge, its metrics).

    A check that is not ``pass`` means: do not run the gate. UsageError (exit 2): a memoized resubmission."""
    from gauntlet.steps.evidence.runmeta import run_dir_of

    engine, out = opts.engine, Path(out)
    seq = Path(getattr(opts, "run_dir", None) or RunLayout.dag_dir(out))
    in_cluster = os.environ.get("GAUNTLET_RUN_ID")
    backend = backend_for(profile, getattr(opts, "backend", None))
    try:
        req = json.loads((seq / "deploy" / REQUEST).read_text())
    except (OSError, ValueError):
        req = None
    if req is None:
        if in_cluster:
            raise UsageError(f"{gate}: this run has no deploy of {engine} ({seq / 'deploy' / REQUEST} is missing): "
                             "`argo resubmit --memoized` reuses another run's deploy and endpoint; resubmit "
                             "without --memoized (or use `argo retry`)")
        return None, {}
    if in_cluster and req.get("run_id") and req["run_id"] != in_cluster:
        raise UsageError(f"{gate}: the deploy of {engine} in {seq} belongs to run {req['run_id']}, not this run "
                         f"({in_cluster}): resubmit without --memoized (or use `argo retry`)")
    try:
        live = backend.deployed(profile, engine, run_dir=seq, run_id=req.get("run_id"))
    except GauntletError:
        return None, {}          # cannot be read (no API here): the gate's own checks judge the endpoint
    if live is not None:
        return None, {}
    want = "the deployed engine at the gate's start"
    why = _reason(RunLayout(run_dir_of(out)))
    if why is None:
        return Check(CHECK, "fail", want, "absent",
                     f"engine {engine} absent at the start of {gate} and not released by this run's exit "
                     f"handler: it stopped on its own; not redeployed (deploy's rank logs say why)"), {}
    if backend.name == "local":
        # the local runner has no retry; a gate re-run by hand would leave an engine nobody stops
        return Check(CHECK, "fail", want, "absent",
                     f"engine {engine} absent at the start of {gate} ({why}): the local back end does not "
                     "redeploy for one gate run by hand; run the whole graph again (`gauntlet run`)"), {}
    return _redeploy(gate, profile, opts, req, why, out)


def _redeploy(gate: str, profile: Profile, opts: Any, req: dict[str, Any], why: str,
              out: Path) -> tuple[Check, dict[str, Any]]:
    from gauntlet.steps.client.http import normalize_endpoint

    engine, evidence = opts.engine, out / "redeploy"
    want = "the deployed engine at the gate's start"
    t0 = time.monotonic()
    dopts = deploy.Options(profile=profile, engine=engine, backend=req.get("backend"), run_id=req.get("run_id"),
                           nccl_env=req.get("nccl_env"), run_dir=req.get("run_dir"))
    checks, metrics = backend_for(profile, dopts.backend).deploy(dopts, evidence)
    seconds = round(time.monotonic() - t0, 1)
    endpoint = (metrics.get("outputs") or {}).get("endpoint") or ""
    record = {"why": why, "seconds": seconds, "startup_s": metrics.get("startup_s"), "endpoint": endpoint,
              "evidence": str(evidence)}
    bad = [c for c in checks if c.status in ("fail", "error")]
    head = f"engine absent at the start of {gate} ({why})"
    if bad or not endpoint:
        detail = "; ".join(f"{c.name}: {c.detail}" for c in bad)[:400] or "no endpoint"
        return Check(CHECK, "fail", want, "redeploy failed",
                     f"{head}: redeploy failed ({detail}); evidence in {evidence}"), {"engine_redeployed": record}
    given = getattr(opts, "endpoint", None)
    if given and normalize_endpoint(given) != normalize_endpoint(endpoint):
        return Check(CHECK, "fail", want, endpoint,
                     f"{head}: redeployed at {endpoint}, but {gate} was given {given}: not the same engine"), \
            {"engine_redeployed": record}
    return Check(CHECK, "pass", want, "redeployed",
                 f"{head}: redeployed, ready in {seconds:.0f} s"), {"engine_redeployed": record}
