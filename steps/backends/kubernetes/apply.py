"""Server-side apply under one field manager: re-applying the same manifest is a no-op,
so an Argo retry of a gate converges instead of failing on "already exists"."""

from __future__ import annotations

import os
from typing import Any

from gauntlet.steps.backends.kubernetes import FIELD_MANAGER, RUN_LABEL
from gauntlet.steps.backends.kubernetes.api import APPLY, Api, call
from gauntlet.steps.backends.kubernetes.manager import KINDS

__all__ = ["apply", "apply_all", "workflow_owner"]


def workflow_owner(namespace: str, run_id: str) -> dict[str, Any] | None:
    """The ownerReference to the run's Workflow ($GAUNTLET_WORKFLOW, uid $GAUNTLET_RUN_ID, in
    $GAUNTLET_NAMESPACE), so Kubernetes' garbage collector deletes the object with the workflow
    (`argo delete`, the workflow's TTL); None outside a workflow, for another run's label, or across namespaces.

    Only in the workflow's own namespace: a namespaced owner must be in its dependent's namespace, and the
    garbage collector treats a reference to one elsewhere as absent, so it would delete the engine at once
    (Kubernetes "Owners and dependents": cross-namespace owner references are disallowed by design;
    pkg/controller/garbagecollector: the owner is looked up in the dependent's namespace, not found, the
    dependent deleted). There the janitor stays the backstop. ``blockOwnerDeletion`` false: the workflow's
    deletion never waits on the engine, and setting it needs no ``workflows/finalizers`` permission
    (the OwnerReferencesPermissionEnforcement admission plugin asks for that only when it is true).
    """
    name, uid = os.environ.get("GAUNTLET_WORKFLOW"), os.environ.get("GAUNTLET_RUN_ID")
    if not name or uid != run_id or os.environ.get("GAUNTLET_NAMESPACE") != namespace:
        return None
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "name": name, "uid": uid,
            "controller": False, "blockOwnerDeletion": False}


def apply(api: Api, manifest: dict[str, Any]) -> dict[str, Any]:
    """PATCH (application/apply-patch+yaml, force) one labelled object; returns the server's object."""
    kind = manifest["kind"]
    if kind not in KINDS:
        raise ValueError(f"apply: a run creates only {sorted(KINDS)}, not {kind}")
    meta = manifest["metadata"]
    if RUN_LABEL not in (meta.get("labels") or {}):
        raise ValueError(f"apply: {kind} {meta['name']} carries no {RUN_LABEL} label: cleanup could not find it")
    owner = workflow_owner(meta["namespace"], meta["labels"][RUN_LABEL])
    if owner is not None:
        manifest = {**manifest, "metadata": {**meta, "ownerReferences": [owner]}}
    attr, suffix = KINDS[kind]
    fn = getattr(getattr(api, attr), f"patch_{suffix}")
    return call(fn, meta["name"], meta["namespace"], manifest, field_manager=FIELD_MANAGER, force=True,
                _content_type=APPLY)


def apply_all(api: Api, manifests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [apply(api, m) for m in manifests]
