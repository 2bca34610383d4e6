"""The exact permissions each step's Kubernetes calls need, per role, and the documents that grant them.

One service account per role (a gate declares its role as ``NEEDS.api``, steps/__init__.py; render gives
each template's pod the account of its step's role, :func:`account`):

- ``manage`` (deploy, teardown, longctx: it restarts the engine, smoke, perf, experiment-baseline: they
  redeploy an engine a retry finds released, experiment, network, cleanup): ``RULES``,
  what ``steps/backends/kubernetes/apply.py`` and ``steps/backends/kubernetes/manager.py`` call, verb by verb. A server-side apply is
  a PATCH, but one that creates the object is also authorized as ``create`` (k8s.io/apiserver
  pkg/endpoints/handlers/patch.go: the create validation runs under a ``Verb: "create"`` authorizer
  check), so what deploy applies needs both.
- ``nodes`` (Gate 1's node step): ``CLUSTER_RULES``, the one read across namespaces, listing the pods on
  a node to name other teams' GPU work. RBAC cannot filter fields: ``list`` returns whole pod specs
  (docs/cluster.md, "Permissions", says what that exposes); only this account holds it.
- ``janitor`` (``gauntlet step janitor``): ``JANITOR_RULES``, read Argo's workflows to know which runs
  are over, then the same owned list/scale/delete/logs, and delete a labelled pod that has no owner.
- ``admission`` (the ``params`` step, first of all): ``ADMISSION_RULES``, read three named cluster-scoped
  objects before any GPU is requested: the namespace (its Pod Security labels) and the label policy and its
  binding (:func:`label_policy`), each by ``resourceNames`` (steps/backends/kubernetes/admission.py).
- none (report, regress, preflight, ...): no API call of its own; the profile's ``service_account``.

``EXECUTOR_RULES`` is what Argo's executor itself needs in every step pod: each account has it.
(tests/test_rbac.py derives every account's rules from the code and the requests each step sends, and
fails on any difference.)

RBAC grants verbs, not objects: what the manager and the janitor may delete, apply or scale is narrowed
to objects labelled ``gauntlet.dev/run`` by the API server itself, with a ValidatingAdmissionPolicy
(:func:`label_policy`), not only by our code (``Manager`` reads the label before every change).
"""

from __future__ import annotations

from typing import Any

from gauntlet.steps.backends.kubernetes import RUN_LABEL

__all__ = ["RULES", "CLUSTER_RULES", "ADMISSION_RULES", "EXECUTOR_RULES", "JANITOR_RULES", "JANITOR_ACCOUNT", "ROLES",
           "RUN_LABEL_KEY", "account", "account_manifests", "access_manifests", "label_policy", "policy_name"]

JANITOR_ACCOUNT = "gauntlet-janitor"

RULES: list[dict[str, list[str]]] = [
    {"apiGroups": ["apps"], "resources": ["statefulsets"], "verbs": ["create", "delete", "get", "list", "patch"]},
    {"apiGroups": ["apps"], "resources": ["statefulsets/scale"], "verbs": ["patch"]},
    {"apiGroups": [""], "resources": ["services"], "verbs": ["create", "delete", "get", "list", "patch"]},
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", "delete", "get", "list", "patch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    # a StatefulSet whose pods the API server refuses (Pod Security, quota) has no pod to read a reason from:
    # its controller's FailedCreate event says why (steps/backends/kubernetes/stuck.py)
    {"apiGroups": [""], "resources": ["events"], "verbs": ["list"]},
]

CLUSTER_RULES: list[dict[str, list[str]]] = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
]

# read by name only (access_manifests adds resourceNames: the namespace, the label policy and its binding)
ADMISSION_RULES: list[dict[str, list[str]]] = [
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]},
    {"apiGroups": ["admissionregistration.k8s.io"],
     "resources": ["validatingadmissionpolicies", "validatingadmissionpolicybindings"], "verbs": ["get"]},
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


# role -> (namespaced rules, cluster-wide rules); None: no API call of its own (Argo's executor only)
ROLES: dict[str | None, tuple[list[dict[str, list[str]]], list[dict[str, list[str]]]]] = {
    "manage": (RULES, []),
    "nodes": ([], CLUSTER_RULES),
    "janitor": (JANITOR_RULES, []),
    "admission": ([], ADMISSION_RULES),
    None: ([], []),
}
_SUFFIX = {"manage": "-manager", "nodes": "-nodes", "admission": "-admission"}
# the ClusterRole (and its binding) of a role with cluster rules: <account>-<namespace>-<what it reads>
_CLUSTER_SUFFIX = {"nodes": "node-pods", "admission": "admission"}
RUN_LABEL_KEY = RUN_LABEL                    # the one run label, under the name this module's policy text uses
_LABELS = {"app.kubernetes.io/part-of": "gauntlet"}
_RBAC = "rbac.authorization.k8s.io/v1"
_ADMISSION = "admissionregistration.k8s.io/v1"


def account(service_account: str, role: str | None) -> str:
    """The service account of a role: the profile's ``service_account`` plus the role's suffix (none for a
    step without API calls), the janitor's own for the janitor."""
    if role not in ROLES:
        raise ValueError(f"unknown API role {role!r}: expected one of {[r for r in ROLES if r]} or None")
    return JANITOR_ACCOUNT if role == "janitor" else service_account + _SUFFIX.get(role or "", "")


def account_manifests(namespace: str, name: str, rules: list[dict[str, list[str]]],
                      cluster_rules: list[dict[str, list[str]]] | None = None,
                      cluster_suffix: str = "node-pods") -> list[dict[str, Any]]:
    """ServiceAccount, Role + RoleBinding (``rules`` and Argo's executor's), and when ``cluster_rules``
    a ClusterRole + ClusterRoleBinding (read-only) ``<name>-<namespace>-<cluster_suffix>`` for one account."""
    meta = {"name": name, "namespace": namespace, "labels": dict(_LABELS)}
    subject = [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]
    docs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": dict(meta)},
        {"apiVersion": _RBAC, "kind": "Role", "metadata": dict(meta), "rules": [dict(r) for r in rules + EXECUTOR_RULES]},
        {"apiVersion": _RBAC, "kind": "RoleBinding", "metadata": dict(meta),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}, "subjects": subject},
    ]
    if cluster_rules:
        cluster_name = f"{name}-{namespace}-{cluster_suffix}"
        docs += [
            {"apiVersion": _RBAC, "kind": "ClusterRole", "metadata": {"name": cluster_name, "labels": dict(_LABELS)},
             "rules": [dict(r) for r in cluster_rules]},
            {"apiVersion": _RBAC, "kind": "ClusterRoleBinding", "metadata": {"name": cluster_name, "labels": dict(_LABELS)},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_name},
             "subjects": subject},
        ]
    return docs


def _has_label(obj: str) -> str:
    return f"has({obj}.metadata.labels) && '{RUN_LABEL_KEY}' in {obj}.metadata.labels"


def policy_name(namespace: str, service_account: str) -> str:
    """The label policy's name, and its binding's (:func:`label_policy`)."""
    return f"{service_account}-{namespace}-run-label"


def _named(rules: list[dict[str, list[str]]], names: dict[str, list[str]]) -> list[dict[str, list[str]]]:
    """``rules`` narrowed to the objects ``names`` gives per resource (RBAC's resourceNames)."""
    return [{**r, "resourceNames": sorted({n for res in r["resources"] for n in names[res]})} for r in rules]


def label_policy(namespace: str, service_account: str) -> list[dict[str, Any]]:
    """A ValidatingAdmissionPolicy + binding (GA since Kubernetes 1.30): in ``namespace``, the manager's and
    the janitor's accounts may delete, apply to or create only objects labelled ``gauntlet.dev/run``, and
    scale (the ``scale`` subresource, whose object carries no labels) only to 0. Denied with a message
    naming the account, the operation and the object."""
    name = policy_name(namespace, service_account)
    users = [f"system:serviceaccount:{namespace}:{account(service_account, r)}" for r in ("manage", "janitor")]
    who = "'gauntlet: ' + request.userInfo.username + ' may not ' + request.operation + ' ' + " \
          "request.resource.resource + (has(request.subResource) ? '/' + request.subResource : '') + ' ' + " \
          "request.namespace + '/' + (has(request.name) ? request.name : '')"
    # an absent field is an error in CEL, not '': the request of a whole object has no subResource
    scale = "(has(request.subResource) && request.subResource == 'scale')"
    rules = [{"apiGroups": g, "apiVersions": ["*"], "operations": ["CREATE", "UPDATE", "DELETE"], "resources": r}
             for g, r in ((["apps"], ["statefulsets", "statefulsets/scale"]), (["batch"], ["jobs"]),
                          ([""], ["pods", "services"]))]
    return [
        {"apiVersion": _ADMISSION, "kind": "ValidatingAdmissionPolicy", "metadata": {"name": name, "labels": dict(_LABELS)},
         "spec": {
             "failurePolicy": "Fail",
             "matchConstraints": {"resourceRules": rules},
             "matchConditions": [{"name": "gauntlet-accounts",
                                  "expression": f"request.userInfo.username in {users!r}"}],
             "validations": [
                 {"expression": f"request.operation == 'CREATE' || {scale} || ({_has_label('oldObject')})",
                  "messageExpression": f"{who} + ': it does not carry the label {RUN_LABEL_KEY}'", "reason": "Forbidden"},
                 {"expression": f"request.operation == 'DELETE' || {scale} || ({_has_label('object')})",
                  "messageExpression": f"{who} + ': the result would not carry the label {RUN_LABEL_KEY}'",
                  "reason": "Forbidden"},
                 {"expression": f"!({scale}) || !has(object.spec) || !has(object.spec.replicas) || "
                                "object.spec.replicas == 0",
                  "messageExpression": f"{who} + ': a gauntlet account scales to 0 only'", "reason": "Forbidden"},
             ]}},
        {"apiVersion": _ADMISSION, "kind": "ValidatingAdmissionPolicyBinding",
         "metadata": {"name": name, "labels": dict(_LABELS)},
         "spec": {"policyName": name, "validationActions": ["Deny"],
                  "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}}},
    ]


def access_manifests(namespace: str, service_account: str) -> list[dict[str, Any]]:
    """Every role's account (:data:`ROLES`), then the label policy: all that render writes to ``*.rbac.yaml``."""
    docs: list[dict[str, Any]] = []
    policy = policy_name(namespace, service_account)
    named = {"namespaces": [namespace], "validatingadmissionpolicies": [policy],
             "validatingadmissionpolicybindings": [policy]}
    for role, (rules, cluster_rules) in ROLES.items():
        if role == "admission":
            cluster_rules = _named(cluster_rules, named)
        docs += account_manifests(namespace, account(service_account, role), rules, cluster_rules,
                                  _CLUSTER_SUFFIX.get(role or "", "node-pods"))
    return docs + label_policy(namespace, service_account)
