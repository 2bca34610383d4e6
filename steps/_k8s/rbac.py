"""The exact permissions the steps' Kubernetes calls need, and the documents that grant them.

``RULES`` is what ``steps/_k8s/apply.py`` and ``steps/_k8s/manager.py`` call, verb by verb
(tests/test_rbac.py derives the same list from the code and fails on any difference).
A server-side apply is a PATCH, but one that creates the object is also authorized as
``create`` (k8s.io/apiserver pkg/endpoints/handlers/patch.go: the create validation runs
under a ``Verb: "create"`` authorizer check), so what deploy applies needs both.
``JANITOR_RULES`` is what the janitor (``gauntlet step janitor``) calls: read Argo's
workflows to know which runs are over, then the same owned list/scale/delete/logs, and
delete a labelled pod that has no owner.
``CLUSTER_RULES`` is the one read the node gate makes across namespaces: listing the pods
on a node to name other teams' GPU work (read-only; nothing outside the namespace is ever
changed). ``EXECUTOR_RULES`` is what Argo's executor itself needs in the step pods.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RULES", "CLUSTER_RULES", "EXECUTOR_RULES", "JANITOR_RULES", "JANITOR_ACCOUNT", "role_manifests",
           "janitor_manifests"]

JANITOR_ACCOUNT = "gauntlet-janitor"

RULES: list[dict[str, list[str]]] = [
    {"apiGroups": ["apps"], "resources": ["statefulsets"], "verbs": ["create", "delete", "get", "list", "patch"]},
    {"apiGroups": ["apps"], "resources": ["statefulsets/scale"], "verbs": ["patch"]},
    {"apiGroups": [""], "resources": ["services"], "verbs": ["create", "delete", "get", "list", "patch"]},
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", "delete", "get", "list", "patch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
]

CLUSTER_RULES: list[dict[str, list[str]]] = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
]

# Argo v3.4+ executors report outputs through WorkflowTaskResults (Argo's docs, "Workflow RBAC").
EXECUTOR_RULES: list[dict[str, list[str]]] = [
    {"apiGroups": ["argoproj.io"], "resources": ["workflowtaskresults"], "verbs": ["create", "patch"]},
]


JANITOR_RULES: list[dict[str, list[str]]] = [
    {"apiGroups": ["argoproj.io"], "resources": ["workflows"], "verbs": ["list"]},
    {"apiGroups": ["apps"], "resources": ["statefulsets"], "verbs": ["delete", "get", "list"]},
    {"apiGroups": ["apps"], "resources": ["statefulsets/scale"], "verbs": ["patch"]},
    {"apiGroups": [""], "resources": ["services"], "verbs": ["delete", "get", "list"]},
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["delete", "get", "list"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["delete", "get", "list"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
]


def janitor_manifests(namespace: str) -> list[dict[str, Any]]:
    """ServiceAccount, Role + RoleBinding of the janitor (namespaced; its pod also reports outputs to Argo)."""
    labels = {"app.kubernetes.io/part-of": "gauntlet"}
    meta = {"name": JANITOR_ACCOUNT, "namespace": namespace, "labels": labels}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": dict(meta)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": dict(meta),
         "rules": [dict(r) for r in JANITOR_RULES + EXECUTOR_RULES]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": dict(meta),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": JANITOR_ACCOUNT},
         "subjects": [{"kind": "ServiceAccount", "name": JANITOR_ACCOUNT, "namespace": namespace}]},
    ]


def role_manifests(namespace: str, service_account: str) -> list[dict[str, Any]]:
    """ServiceAccount, Role + RoleBinding (namespaced rules), ClusterRole + ClusterRoleBinding (read-only)."""
    labels = {"app.kubernetes.io/part-of": "gauntlet"}
    meta = {"name": service_account, "namespace": namespace, "labels": labels}
    subject = [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}]
    cluster_name = f"{service_account}-{namespace}-node-pods"
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": dict(meta)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": dict(meta),
         "rules": [dict(r) for r in RULES + EXECUTOR_RULES]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": dict(meta),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": service_account},
         "subjects": subject},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": cluster_name, "labels": labels}, "rules": [dict(r) for r in CLUSTER_RULES]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": cluster_name, "labels": labels},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_name},
         "subjects": subject},
    ]
