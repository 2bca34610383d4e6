"""Pods that cannot start fail the step that waits on them, after a bounded grace, in the cluster's words.

A pod the scheduler cannot place stays Pending with ``PodScheduled=False``, reason ``Unschedulable`` and
the scheduler's message ("0/4 nodes are available: 1 Insufficient nvidia.com/gpu, ..."); a pod whose
image cannot be pulled waits in ``ErrImagePull``/``ImagePullBackOff``; one whose env or volumes name a
missing ConfigMap or Secret waits in ``CreateContainerConfigError``. A pod the API server refuses to create
(Pod Security admission, a quota, a missing service account) never exists at all: its StatefulSet or Job stays
short of pods and its controller records a ``FailedCreate`` event with the API server's answer
(:func:`failed_create`; the StatefulSet controller's "Create Pod <pod> in StatefulSet <sts> failed error: ...",
k8s.io/kubernetes pkg/controller/statefulset/stateful_pod_control.go ``recordPodEvent``; the Job controller's
"Error creating: ...", pkg/controller/controller_utils.go). Kubernetes never ends any of them
(a pod's ``activeDeadlineSeconds`` counts from its start on a node, which an unscheduled pod never
has), so a step that waits on its pods would wait its whole timeout. :class:`StuckWatch` fails it once
one pod has been in one of these states for :func:`grace_s` seconds in a row: long enough for a cluster
autoscaler's new node or a registry's hiccup, short beside a deploy's 90 minutes.

The grace is :data:`STUCK_GRACE_S`; ``$GAUNTLET_POD_STUCK_GRACE_S`` overrides it (the box sets it short).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["STUCK_GRACE_S", "GRACE_ENV", "StuckWatch", "grace_s", "stuck_cause", "failed_create", "refused"]

STUCK_GRACE_S = 300.0
GRACE_ENV = "GAUNTLET_POD_STUCK_GRACE_S"
# waiting reasons that do not end by themselves; the two of an image pull are one state (they alternate)
_WAITING = {"ErrImagePull": "image", "ImagePullBackOff": "image", "CreateContainerConfigError": "config"}


def grace_s() -> float:
    """The grace in seconds: $GAUNTLET_POD_STUCK_GRACE_S when set (a number), else STUCK_GRACE_S."""
    raw = os.environ.get(GRACE_ENV, "").strip()
    try:
        return max(0.0, float(raw)) if raw else STUCK_GRACE_S
    except ValueError:
        return STUCK_GRACE_S


def stuck_cause(pod: dict[str, Any]) -> tuple[str, str] | None:
    """(kind, text) when the pod cannot start by itself: the scheduler's Unschedulable condition, or a
    container waiting on its image or its configuration; the text is the reason and the message verbatim."""
    st = pod.get("status") or {}
    for c in st.get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable":
            return "unschedulable", f"Unschedulable: {c.get('message') or '(no message)'}"
    for cs in (st.get("initContainerStatuses") or []) + (st.get("containerStatuses") or []):
        w = (cs.get("state") or {}).get("waiting") or {}
        if w.get("reason") in _WAITING:
            msg = f": {w['message']}" if w.get("message") else ""
            return _WAITING[w["reason"]], f"{cs.get('name')}: {w['reason']}{msg}"
    return None


def failed_create(events: Iterable[dict[str, Any]]) -> str | None:
    """"FailedCreate: <message>" of the newest FailedCreate event among ``events`` (one controller's: core/v1
    Events whose involvedObject is its StatefulSet or Job), verbatim; None when there is none."""
    fc = [e for e in events if e.get("reason") == "FailedCreate"]
    if not fc:
        return None
    newest = max(fc, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime")
                                       or (e.get("metadata") or {}).get("creationTimestamp") or ""))
    return f"FailedCreate: {newest.get('message') or '(no message)'}"


def refused(mgr: Any, kind: str, name: str) -> str | None:
    """Why the run's ``kind`` ``name`` (a StatefulSet, a Job; ``mgr``: its Manager, which refuses another's) could not
    create a pod: :func:`failed_create` of the events about it, read by its uid; None when there is none."""
    from gauntlet.steps.backends.kubernetes.api import call

    obj = mgr.get(kind, name)
    if obj is None:
        return None
    uid = (obj.get("metadata") or {}).get("uid")
    events = call(mgr.api.core.list_namespaced_event, mgr.ns, field_selector=f"involvedObject.uid={uid}")
    return failed_create(e for e in events.get("items", []) if (e.get("involvedObject") or {}).get("uid") == uid)


class StuckWatch:
    """Polled with the pods of each round; says which pod has been stuck past the grace, and why."""

    def __init__(self, grace: float | None = None, clock: Callable[[], float] = time.monotonic):
        self.grace = grace_s() if grace is None else grace
        self.clock = clock
        self._since: dict[tuple[str, str], float] = {}

    def check(self, pods: Iterable[dict[str, Any]], missing: dict[str, str] | None = None) -> str | None:
        """None, or "<pod>: <cause> (for Ns)" for every pod stuck in the same state for the grace or longer.
        ``missing``: owner ("StatefulSet <name>") -> why its pods are not there (:func:`failed_create`), while
        it has fewer pods than it wants: stuck as long as it stays so."""
        now = self.clock()
        seen: dict[tuple[str, str], str] = {(owner, "create"): why for owner, why in (missing or {}).items()}
        for p in pods:
            if (p.get("metadata") or {}).get("deletionTimestamp"):
                continue
            cause = stuck_cause(p)
            if cause:
                seen[((p.get("metadata") or {}).get("name", "?"), cause[0])] = cause[1]
        self._since = {k: self._since.get(k, now) for k in seen}     # a pod that moved on starts over
        over = [f"{name}: {seen[(name, kind)]} (for {now - t:.0f}s)" for (name, kind), t in sorted(self._since.items())
                if now - t >= self.grace]
        return "; ".join(over) or None
