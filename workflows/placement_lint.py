"""Lint rules that need the profile beside its rendered documents: where pods may run, and the runs volume.

* The runs PVC (``runs_access_mode``): every step writes its evidence there, so ReadOnlyMany never works;
  anything but ReadWriteMany is refused when the graph mounts it on two nodes at once (two tasks pinned to
  different nodes, neither upstream of the other: preflight-0 and preflight-1).
* Pool placement: a container template whose pod mounts the nodes' model cache or asks for GPUs must be pinned
  to the profile's nodes and carry exactly the pool's tolerations (and priority class); any other pod carries
  neither (it would take the pool's capacity).

Each rule returns ``(path, rule, message)``; :mod:`gauntlet.workflows.lint` makes them findings.
"""

from __future__ import annotations

from typing import Any

from gauntlet.params.models import Profile

__all__ = ["runs_volume_problems", "placement_problems"]

HOSTNAME = "kubernetes.io/hostname"
_POOL_VOLUMES = {"model-cache", "model-cache-rw", "model-source"}


def _ancestors(by: dict[str, Any], name: str) -> set[str]:
    seen: set[str] = set()
    todo = list(by[name].upstream)
    while todo:
        cur = todo.pop()
        if cur in by and cur not in seen:
            seen.add(cur)
            todo.extend(by[cur].upstream)
    return seen


def _concurrent_nodes(profile: Profile) -> tuple[str, str, str, str] | None:
    """Two tasks of one DAG pinned to different nodes that may run at once: (task, node, task, node)."""
    from gauntlet.workflows.graph import build_graph
    graph = build_graph(profile, "argo")
    for dag in (graph.main, *graph.sequences):
        by = {t.name: t for t in dag.tasks}
        pinned = [t for t in dag.tasks if t.node]
        for i, a in enumerate(pinned):
            for b in pinned[i + 1:]:
                if a.node != b.node and a.name not in _ancestors(by, b.name) and b.name not in _ancestors(by, a.name):
                    return a.name, a.node or "", b.name, b.node or ""
    return None


def runs_volume_problems(profile: Profile) -> list[tuple[str, str, str]]:
    mode = profile.runs_access_mode
    if mode == "ReadOnlyMany":
        return [("runs_access_mode", "runs-access-mode",
                 f"runs_access_mode: ReadOnlyMany, but every step writes its evidence on PVC {profile.runs_pvc}: "
                 "use ReadWriteMany")]
    if mode == "ReadWriteMany":
        return []
    pair = _concurrent_nodes(profile)
    if pair is None:
        return []
    a, na, b, nb = pair
    return [("runs_access_mode", "runs-access-mode",
             f"runs_access_mode: {mode}, but {a} (on {na}) and {b} (on {nb}) mount PVC {profile.runs_pvc} at "
             "once: use ReadWriteMany (a StorageClass that gives RWX, docs/cluster.md)")]


def _pool_pod(tmpl: dict[str, Any]) -> bool:
    c = tmpl.get("container") or {}
    mounts = {vm.get("name") for vm in c.get("volumeMounts", []) or []}
    res = c.get("resources") or {}
    gpus = {**(res.get("requests") or {}), **(res.get("limits") or {})}.get("nvidia.com/gpu")
    return bool(mounts & _POOL_VOLUMES) or gpus not in (None, "0", 0)


def _pinned_to(tmpl: dict[str, Any]) -> set[str] | None:
    """The hostnames the template's required node affinity allows (None: not pinned by hostname)."""
    req = (((tmpl.get("affinity") or {}).get("nodeAffinity") or {})
           .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    allowed: set[str] = set()
    for term in req.get("nodeSelectorTerms", []) or []:
        exprs = [e for e in term.get("matchExpressions", []) or [] if e.get("key") == HOSTNAME
                 and e.get("operator") == "In"]
        if not exprs:
            return None         # a term without a hostname pin lets the pod anywhere
        allowed |= set(exprs[0].get("values") or [])
    return allowed or None


def placement_problems(profile: Profile, doc: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Pool pinning and tolerations of every container template of a WorkflowTemplate rendered from ``profile``."""
    hw = profile.hardware
    want_tol = [t.manifest() for t in hw.tolerations]
    nodes = {n.name for n in hw.nodes}
    out: list[tuple[str, str, str]] = []
    for i, t in enumerate((doc.get("spec") or {}).get("templates", []) or []):
        if "container" not in t:
            continue
        path, name = f"spec.templates[{i}]", t.get("name")
        tol = t.get("tolerations") or []
        pinned = _pinned_to(t)
        if _pool_pod(t) or pinned is not None:      # pinned to a tainted node: it must tolerate the taints
            if pinned is None or not pinned <= nodes:
                out.append((f"{path}.affinity", "pool-pinning",
                            f"template {name!r} mounts the model cache or takes GPUs but is not pinned to the "
                            f"profile's nodes {sorted(nodes)} (required node affinity on {HOSTNAME})"))
            if tol != want_tol:
                out.append((f"{path}.tolerations", "pool-tolerations",
                            f"template {name!r} runs on the pool but tolerates {tol} instead of "
                            f"hardware.tolerations {want_tol}"))
            if t.get("priorityClassName") != hw.priority_class_name:
                out.append((f"{path}.priorityClassName", "pool-priority",
                            f"template {name!r} runs on the pool with priorityClassName "
                            f"{t.get('priorityClassName')!r}, not hardware.priority_class_name "
                            f"{hw.priority_class_name!r}"))
        elif tol or t.get("priorityClassName"):
            out.append((path, "pool-outsider",
                        f"template {name!r} needs neither the model cache nor GPUs but carries the pool's "
                        "tolerations or priority class: it would take the pool's capacity"))
    return out
