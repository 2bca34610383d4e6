"""A DAG's phase, judged the way Argo's controller judges it (pure).

Argo v4.0.5 (workflow/controller/dag.go ``assessDAGPhase``) looks only at the DAG's
*target* tasks: its ``target`` field, else its leaves (tasks no other task depends on).
It walks the DAG from its roots carrying a "branch phase": a task that completed
(Succeeded, Failed, Error) sets it, a Skipped or Omitted task inherits its parent's,
and a target reached along several branches keeps Failed/Error over Succeeded. The
DAG is Failed (or Error) when a target's phase is; otherwise Succeeded. So a Failed
task whose dependent ran and succeeded (``report`` after a failed ``regress``) does
not fail the DAG: that is why the report gate fails itself on a regression.

The local runner uses this so both back ends agree on a workflow's phase.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Mapping

__all__ = ["dag_phase", "targets", "COMPLETED"]

COMPLETED = ("Succeeded", "Failed", "Error")


def targets(tasks: Mapping[str, Collection[str]], target: str | None = None) -> list[str]:
    """The DAG's targets: ``target`` split on spaces, else the tasks no other task depends on (sorted)."""
    if target:
        return target.split()
    used = {d for ds in tasks.values() for d in ds}
    return sorted(n for n in tasks if n not in used)


def dag_phase(tasks: Mapping[str, Collection[str]], phases: Mapping[str, str], target: str | None = None) -> str:
    """``Succeeded``, ``Failed`` or ``Error`` for a finished DAG.

    ``tasks``: task name -> the names of the tasks it depends on (empty for a root; a task's
    :attr:`~gauntlet.workflows.graph.Task.upstream`); ``phases``: task name ->
    Succeeded/Failed/Error/Skipped/Omitted. A task with no phase (never reached) inherits, as an
    Omitted one does.
    """
    unknown = {d for ds in tasks.values() for d in ds} - set(tasks)
    if unknown:
        raise ValueError(f"depends on tasks not in the DAG: {sorted(unknown)}")
    deps = {n: set(ds) for n, ds in tasks.items()}
    children: dict[str, list[str]] = {n: [] for n in tasks}
    for n, ds in deps.items():
        for d in ds:
            children[d].append(n)
    goal = targets(tasks, target)
    deduced: dict[str, str] = {}
    queue = deque((n, "Succeeded") for n in tasks if not deps[n])
    seen: set[tuple[str, str]] = set()
    while queue:
        name, branch = queue.popleft()
        if (name, branch) in seen:
            continue
        seen.add((name, branch))
        phase = phases.get(name)
        if phase in COMPLETED:
            branch = phase
        if name in goal and deduced.get(name) not in ("Failed", "Error"):
            deduced[name] = branch
        queue.extend((c, branch) for c in children[name])
    for name in goal:                       # failFast (Argo's default): the first failed target decides
        if deduced.get(name) in ("Failed", "Error"):
            return deduced[name]
    return "Succeeded"
