"""The janitor on Kubernetes: find labelled objects, judge their run by its workflow, release the over ones.

One list per kind with the ``gauntlet.dev/run`` existence selector (nothing without the
label is ever listed), one list of Argo's workflows in the namespace (looked up by uid),
then, for each run :func:`gauntlet.steps.backends.argo.judge_run` releases, the exit handler's own
:func:`gauntlet.steps.backends.kubernetes.cleanup.release_run` through the run's :class:`Manager` (logs, scale
to 0, delete, each object re-read and refused without the run's label), and a labelled
pod with no owner is deleted. If the workflows cannot be listed nothing is released:
a run that may still be running is never touched.
"""

from __future__ import annotations

import os
from datetime import datetime, UTC
from pathlib import Path
from typing import Any

from gauntlet.steps.backends.kubernetes.cleanup import ARGO_POD_LABEL, ApiErrors, held_pods, release_run
from gauntlet.contract import Check, write_json_atomic
from gauntlet.steps.backends.kubernetes import RUN_LABEL
from gauntlet.steps.backends.kubernetes.api import NotFound, call

__all__ = ["sweep", "labelled_runs", "WAIT_S"]

WAIT_S = 120          # per released run; the next janitor run picks up whatever is slower


def labelled_runs(api: Any, ns: str, err: ApiErrors) -> dict[str, list[str]] | None:
    """{run uid: ["Kind/name", ...]} of everything carrying the run label (Argo's own step pods excluded)."""
    runs: dict[str, list[str]] = {}
    lists = [("StatefulSet", api.apps.list_namespaced_stateful_set), ("Job", api.batch.list_namespaced_job),
             ("Service", api.core.list_namespaced_service), ("Pod", api.core.list_namespaced_pod)]
    ok = False
    for kind, fn in lists:
        data = err.guard(f"list {kind}", call, fn, ns, label_selector=RUN_LABEL, default=None)
        if data is None:
            continue
        ok = True
        items = data.get("items", [])
        if kind == "Pod":
            items = held_pods(items)           # a finished pod holds nothing; Argo's step pods are Argo's
        for o in items:
            labels = o.get("metadata", {}).get("labels") or {}
            uid = labels.get(RUN_LABEL)
            if uid:
                runs.setdefault(uid, []).append(f"{kind}/{o['metadata']['name']}")
    return runs if ok else None


def _workflows(api: Any, ns: str, err: ApiErrors) -> dict[str, dict[str, Any]] | None:
    data = err.guard("list workflows", call, api.custom.list_namespaced_custom_object,
                     "argoproj.io", "v1alpha1", ns, "workflows", default=None)
    if data is None:
        return None
    return {w["metadata"]["uid"]: w for w in data.get("items", []) if w.get("metadata", {}).get("uid")}


def _delete_bare_pods(api: Any, ns: str, run_id: str, err: ApiErrors) -> list[str]:
    """Delete the run's labelled pods that no StatefulSet/Job owns (their owners take the others)."""
    gone = []
    data = err.guard("list pods", call, api.core.list_namespaced_pod, ns, label_selector=f"{RUN_LABEL}={run_id}",
                     default=None) or {}
    for p in held_pods(data.get("items", [])):
        meta = p.get("metadata", {})
        if meta.get("ownerReferences") or (meta.get("labels") or {}).get(RUN_LABEL) != run_id:
            continue
        name = meta["name"]
        try:
            fresh = call(api.core.read_namespaced_pod, name, ns)
            labels = fresh.get("metadata", {}).get("labels") or {}
            if labels.get(RUN_LABEL) != run_id or ARGO_POD_LABEL in labels:
                continue                        # relabelled since the list: not ours to touch
            call(api.core.delete_namespaced_pod, name, ns)
            gone.append(name)
        except NotFound:
            continue
        except Exception as exc:  # noqa: BLE001 - recorded; the other pods still go
            err.items.append(f"delete Pod {name}: {type(exc).__name__}: {exc}")
    return gone


def sweep(namespace: str | None, out: Path, grace_s: float) -> tuple[list[Check], dict[str, Any]]:
    """Release the objects of every labelled run in ``namespace`` whose workflow is gone or over ``grace_s`` ago."""
    from gauntlet.steps.backends.kubernetes.api import connect
    from gauntlet.steps.backends.kubernetes.manager import Manager
    from gauntlet.steps.backends.argo import judge_run

    ns = namespace or os.environ.get("GAUNTLET_NAMESPACE") or "gauntlet"
    err = ApiErrors()
    api = err.guard("Kubernetes API", connect)
    runs = labelled_runs(api, ns, err) if api is not None else None
    workflows = _workflows(api, ns, err) if runs else {}
    base: dict[str, Any] = {"namespace": ns, "grace_s": grace_s, "released": {}, "kept": {}}
    if runs is None or workflows is None:
        what = "labelled objects" if runs is None else "Argo workflows"
        detail = f"could not list the {what} in {ns}: nothing released (a run that may be running is never touched)"
        return ([Check("listed", "fail", f"{what} listed", "; ".join(err.items), detail)],
                {**base, "held": [f"unknown: {what} not listed"], "transient": err.transient, "errors": err.items})
    now = datetime.now(UTC)
    checks: list[Check] = []
    held: list[str] = []
    for uid, objs in sorted(runs.items()):
        state = judge_run(workflows.get(uid), now, grace_s)
        if not state.release:
            base["kept"][uid] = {"reason": state.reason, "objects": objs}
            checks.append(Check(f"run {uid}", "pass", "kept while its run is live", objs,
                                f"left alone: {state.reason} ({len(objs)} object(s))"))
            continue
        bare: list[str] = []
        # bare pods go right after their logs are saved, before the wait for the run's pods to go
        r = release_run(Manager(api, ns, uid), Path(out) / uid, err, wait_s=WAIT_S,
                        before_release=lambda uid=uid, bare=bare: bare.extend(_delete_bare_pods(api, ns, uid, err)))
        if bare:
            r.final.update({f"Pod/{n}": "deleted" for n in bare})
            r.held = [h for h in r.held if h.removeprefix("Pod/") not in bare]
        held += [f"{uid}: {h}" for h in r.held]
        c = r.check("nothing left")
        checks.append(Check(f"run {uid}", c.status, c.expected, c.observed, f"{state.reason}: {c.detail}"))
        base["released"][uid] = {"reason": state.reason, "final": r.final, "actions": r.actions,
                                 "saved_logs": r.saved, "held": r.held}
    if not runs:
        checks.append(Check("swept", "pass", None, 0, f"no object in {ns} carries {RUN_LABEL}: nothing to do"))
    checks += [Check("api-error", "fail", "no API error", e, e) for e in err.items]
    err.guard("janitor.json", write_json_atomic, Path(out) / "janitor.json", base)
    return checks, {**base, "held": held, "transient": err.transient, "errors": err.items}
