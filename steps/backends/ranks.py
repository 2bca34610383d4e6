"""Read the deployed engine's ranks, per back end, for the rank watch (:mod:`gauntlet.steps.cluster.rank_watch`).

- Kubernetes: the run's engine pods of that engine, the baseline's (no ``gauntlet.dev/variant`` label) or one
  Gate 6 variant's (``gauntlet.dev/variant=<name>``, the deploy's own selector): rank = the StatefulSet
  ordinal, identity = the pod's uid, restarts = its containers' restart counts, alive = Running and not
  being deleted.
- Local: the engine's state file in the run directory (written by the local deploy) when it records that
  variant (none: the baseline): one rank, identity = its process id, alive = a process of its group still
  carries this run's label (pids get reused).

``None`` means "no deployed engine to watch" (never deployed, or already released).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gauntlet.params.models import Profile
from gauntlet.steps.cluster.rank_watch import Rank

__all__ = ["kubernetes_ranks", "local_ranks"]


def _ordinal(name: str) -> int:
    tail = name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def kubernetes_ranks(profile: Profile, engine: str, variant: str | None = None) -> list[Rank] | None:
    from gauntlet.steps.backends.kubernetes import run_id_from
    from gauntlet.steps.backends.kubernetes.api import connect
    from gauntlet.steps.backends.kubernetes.manager import Manager, pod_state
    from gauntlet.steps.backends.kubernetes.manifests import engine_selector

    ns = os.environ.get("GAUNTLET_NAMESPACE") or profile.namespace
    mgr = Manager(connect(), ns, run_id_from(None))
    pods: list[dict[str, Any]] = mgr.pods(engine_selector(engine, variant))
    if not pods:
        return None
    out = []
    for p in pods:
        s = pod_state(p)
        meta = p.get("metadata") or {}
        out.append(Rank(_ordinal(s.name), str(meta.get("uid") or s.name), s.restarts,
                        s.phase == "Running" and not meta.get("deletionTimestamp"),
                        f"{s.name} on {s.node or '?'}"))
    return sorted(out, key=lambda r: r.rank)


def local_ranks(run_dir: Path, engine: str, variant: str | None = None) -> list[Rank] | None:
    from gauntlet.steps.backends.local.deploy import owned, state_path

    path = state_path(run_dir, engine)
    try:
        state = json.loads(path.read_text())
        pid, pgid = int(state["pid"]), int(state["pgid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if state.get("stopped") or (state.get("variant") or None) != (variant or None):
        return None
    return [Rank(0, str(pid), 0, owned(pgid, run_dir), f"pid {pid}")]
