"""From Ready to teardown: an engine rank that restarts or exits fails the gate that is running.

A multi-node engine is one tensor-parallel group: a rank that crashes during perf is restarted by
its StatefulSet, cannot rejoin the group, and the run would later show a perf or long-context failure
with the wrong cause. So every gate that runs against the deployed engine (``Needs.engine_ranks``)
reads the engine's ranks before it starts and again when it ends, through the resource back end
(:meth:`gauntlet.steps.backends.Backend.ranks`: the pods' uids and restart counts on Kubernetes, the
process group locally), and :func:`judge` turns the two snapshots into one check, ``engine_ranks``,
whose failure says "rank 1 restarted during perf".

A gate that restarts the engine on purpose (Gate 5 serving a rung at a larger context) says so in its
metrics (``engine_restarts``: a non-empty list); then a replaced rank is expected, and only a rank that
restarted after that redeploy, or is gone, fails.

Pure judgement here; the snapshots come from the back ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gauntlet.contract import Check

__all__ = ["Rank", "judge", "CHECK"]

CHECK = "engine_ranks"


@dataclass(frozen=True)
class Rank:
    """One engine rank as the back end sees it."""

    rank: int
    ident: str          # pod uid / process id: a new one means the rank was replaced
    restarts: int       # container restarts of that pod (0 for a local process group: nothing restarts it)
    alive: bool         # running (not terminating, not exited)
    where: str          # pod name on its node / pid, for the message

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _by_rank(ranks: Sequence[Rank]) -> dict[int, Rank]:
    return {r.rank: r for r in ranks}


def judge(gate: str, before: Sequence[Rank] | None, after: Sequence[Rank] | None,
          redeployed: bool = False) -> Check:
    """The ``engine_ranks`` check of ``gate`` from the ranks read before it ran and after it ended."""
    if not before:
        return Check(CHECK, "skip", "every rank up from start to end", None,
                     f"no deployed engine rank found before {gate}: nothing to watch")
    problems: list[str] = []
    now = _by_rank(after or [])
    for r in sorted(before, key=lambda x: x.rank):
        a = now.get(r.rank)
        if a is None or not a.alive:
            problems.append(f"rank {r.rank} exited during {gate}" + (f" ({a.where})" if a else f" ({r.where} is gone)"))
        elif a.ident == r.ident:
            if a.restarts > r.restarts:
                problems.append(f"rank {r.rank} restarted during {gate} ({a.where}: restart count "
                                f"{r.restarts} -> {a.restarts})")
        elif not redeployed:
            problems.append(f"rank {r.rank} was replaced during {gate} ({r.where} -> {a.where}): deleted, "
                            "evicted or rescheduled; it cannot rejoin its group")
        elif a.restarts:
            problems.append(f"rank {r.rank} restarted during {gate} after the engine was redeployed "
                            f"({a.where}: restart count {a.restarts})")
    observed = {"before": [r.as_dict() for r in before], "after": [r.as_dict() for r in after or []]}
    if problems:
        return Check(CHECK, "fail", "every rank up from start to end", observed,
                     "; ".join(problems) + ": this gate's results are not the engine's (its logs say why)")
    how = " (redeployed by the gate on purpose)" if redeployed and any(
        now.get(r.rank) and now[r.rank].ident != r.ident for r in before) else ""
    return Check(CHECK, "pass", "every rank up from start to end", observed,
                 f"all {len(before)} rank(s) up from the start of {gate} to its end, none restarted{how}")
