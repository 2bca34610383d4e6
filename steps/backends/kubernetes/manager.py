"""Manage what a run owns: list, scale, delete, read logs; refuse any object without the run's label.

Every mutating call first reads the object and checks ``metadata.labels[gauntlet.dev/run]``
equals this run's id (:class:`NotOurs` otherwise), and every list uses the run's
label selector, so another team's StatefulSet beside ours is never touched.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import Any

from gauntlet.contract import GauntletError, UsageError
from gauntlet.steps.backends.kubernetes import RUN_LABEL
from gauntlet.steps.backends.kubernetes.api import Api, NotFound, call
from gauntlet.steps.backends.kubernetes.stuck import stuck_cause

__all__ = ["NotOurs", "Manager", "PodState", "pod_state", "node_gpu_pods", "KINDS"]

# kind -> (api attribute, method suffix); the only kinds a run creates
KINDS = {
    "StatefulSet": ("apps", "namespaced_stateful_set"),
    "Service": ("core", "namespaced_service"),
    "Job": ("batch", "namespaced_job"),
}


class NotOurs(GauntletError):
    """The object exists but does not carry this run's label: it is left alone."""


@dataclass(frozen=True)
class PodState:
    name: str
    node: str | None
    phase: str | None
    ready: bool
    restarts: int
    problem: str | None             # OOMKilled, CrashLoopBackOff, exited 1, ...: fail fast on it
    labels: dict[str, str]
    stuck: str | None = None        # Unschedulable / image pull / config, verbatim: fail after a grace (StuckWatch)


# fail at once; an image that cannot be pulled or a missing ConfigMap/Secret may still come right: they
# fail the step only after a grace (gauntlet.steps.backends.kubernetes.stuck), as a pod the scheduler cannot place does
_BAD_WAITING = ("CrashLoopBackOff", "InvalidImageName", "CreateContainerError")


def pod_state(pod: dict[str, Any]) -> PodState:
    """What readiness and teardown need from one pod's status, as data."""
    meta, spec, st = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status", {}) or {}
    problems: list[tuple[int, str]] = []          # (priority, text): OOM beats an exit beats a waiting reason
    restarts = 0
    ready = True
    mains = st.get("containerStatuses") or []
    for cs in (st.get("initContainerStatuses") or []) + mains:
        restarts += int(cs.get("restartCount") or 0)
        if cs in mains:
            ready = ready and bool(cs.get("ready"))
        for key in ("state", "lastState"):
            s = cs.get(key) or {}
            t = s.get("terminated")
            if t:
                if t.get("reason") == "OOMKilled":
                    problems.append((0, f"{cs.get('name')}: OOMKilled"))
                elif int(t.get("exitCode") or 0) != 0:
                    problems.append((1, f"{cs.get('name')}: exited {t.get('exitCode')} ({t.get('reason', '')})"))
            w = s.get("waiting")
            if w and w.get("reason") in _BAD_WAITING:
                problems.append((2, f"{cs.get('name')}: {w['reason']}"))
    problem = min(problems)[1] if problems else None
    if not st.get("containerStatuses"):
        ready = False
    if st.get("phase") == "Failed":
        problem = problem or f"pod failed: {st.get('reason') or st.get('message') or 'unknown'}"
    if restarts and problem is None:
        problem = f"restarted {restarts} time(s)"
    stuck = stuck_cause(pod)
    return PodState(meta.get("name", ""), spec.get("nodeName"), st.get("phase"), ready and st.get("phase") ==
                    "Running", restarts, problem, dict(meta.get("labels") or {}), stuck[1] if stuck else None)


def _gpus(pod: dict[str, Any]) -> int:
    n = 0
    for c in (pod.get("spec", {}).get("containers") or []) + (pod.get("spec", {}).get("initContainers") or []):
        res = c.get("resources") or {}
        want = (res.get("limits") or {}).get("nvidia.com/gpu") or (res.get("requests") or {}).get("nvidia.com/gpu")
        n += int(want or 0)
    return n


def node_gpu_pods(api: Api, node: str) -> list[dict[str, Any]]:
    """Every live pod on the node that asks for nvidia.com/gpu (any namespace): name, namespace, GPUs, run label."""
    pods = call(api.core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={node}")
    out = []
    for p in pods.get("items", []):
        if (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        g = _gpus(p)
        if g:
            m = p.get("metadata", {})
            out.append({"namespace": m.get("namespace"), "name": m.get("name"), "gpus": g,
                        "run": (m.get("labels") or {}).get(RUN_LABEL)})
    return out


class Manager:
    """CRUD on the objects of one run in one namespace."""

    def __init__(self, api: Api, namespace: str, run_id: str):
        self.api, self.ns, self.run_id = api, namespace, run_id

    @property
    def selector(self) -> str:
        return f"{RUN_LABEL}={self.run_id}"

    def _method(self, verb: str, kind: str) -> Any:
        attr, suffix = KINDS[kind]
        return getattr(getattr(self.api, attr), f"{verb}_{suffix}")

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        """The object if it exists and is ours; None if absent; NotOurs if someone else's."""
        try:
            obj = call(self._method("read", kind), name, self.ns)
        except NotFound:
            return None
        if (obj.get("metadata", {}).get("labels") or {}).get(RUN_LABEL) != self.run_id:
            raise NotOurs(f"{kind} {self.ns}/{name} does not carry {self.selector}: left alone")
        return obj

    def list(self, kind: str, extra_selector: str | None = None) -> list[dict[str, Any]]:
        sel = self.selector + (f",{extra_selector}" if extra_selector else "")
        items = call(self._method("list", kind), self.ns, label_selector=sel).get("items", [])
        # a server that ignored the selector must still not make us touch foreign objects
        return [o for o in items if (o.get("metadata", {}).get("labels") or {}).get(RUN_LABEL) == self.run_id]

    def scale(self, name: str, replicas: int) -> bool:
        """Scale our StatefulSet; False when it does not exist."""
        if self.get("StatefulSet", name) is None:
            return False
        call(self.api.apps.patch_namespaced_stateful_set_scale, name, self.ns, {"spec": {"replicas": replicas}},
             _content_type="application/merge-patch+json")
        return True

    def delete(self, kind: str, name: str) -> bool:
        """Delete our object (pods go with it, in the background); False when already gone."""
        if self.get(kind, name) is None:
            return False
        try:
            call(self._method("delete", kind), name, self.ns, propagation_policy="Background")
        except NotFound:
            return False
        return True

    def pods(self, extra_selector: str | None = None) -> builtins.list[dict[str, Any]]:   # list: a method here
        sel = self.selector + (f",{extra_selector}" if extra_selector else "")
        items = call(self.api.core.list_namespaced_pod, self.ns, label_selector=sel).get("items", [])
        return [p for p in items if (p.get("metadata", {}).get("labels") or {}).get(RUN_LABEL) == self.run_id]

    def logs(self, pod: str, container: str | None = None, previous: bool = False) -> str:
        """A pod's log (of the previous instance too, when it restarted); '' when it has none yet."""
        kw: dict[str, Any] = {"container": container} if container else {}
        if previous:
            kw["previous"] = True
        try:
            return call(self.api.core.read_namespaced_pod_log, pod, self.ns, **kw)
        except (NotFound, UsageError):  # no such container instance yet (400) or pod gone: no log
            return ""
