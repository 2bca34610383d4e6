"""The rendered RBAC and label policy on the box's REAL kube-apiserver (marker ``argo``; tests/box).

Only the control plane is needed (no kubelet, no workflow): the rendered ``*.rbac.yaml`` of the
kimi-k3-h20 profile, moved to a namespace of its own, is applied as admin; then

- the API server's own authorizer (SubjectAccessReview) says, for every account, that it holds exactly
  its role's grants (steps/backends/kubernetes/rbac.py ROLES) plus Argo's executor's, and nothing of the others;
- with real service-account tokens (TokenRequest), the janitor and the manager are denied by the
  ValidatingAdmissionPolicy (its message names the object) on objects without ``gauntlet.dev/run``,
  and allowed on labelled ones.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from gauntlet.params import load_profile
from gauntlet.steps.backends.kubernetes import rbac
from gauntlet.workflows.render import render_documents, template_name

pytestmark = pytest.mark.argo

NS = "gauntlet-rbac"
UID = "11111111-2222-4333-8444-555555555555"
APPLY = "application/apply-patch+yaml"
SSAR_GROUPS = ["system:serviceaccounts", f"system:serviceaccounts:{NS}", "system:authenticated"]


def _path(doc: dict[str, Any]) -> str:
    group_version, kind, name = doc["apiVersion"], doc["kind"], doc["metadata"]["name"]
    plural = {"ServiceAccount": "serviceaccounts", "Role": "roles", "RoleBinding": "rolebindings",
              "ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings",
              "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
              "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings", "StatefulSet": "statefulsets",
              "Pod": "pods", "Namespace": "namespaces"}[kind]
    base = f"/api/{group_version}" if "/" not in group_version else f"/apis/{group_version}"
    ns = doc["metadata"].get("namespace")
    return f"{base}/namespaces/{ns}/{plural}/{name}" if ns else f"{base}/{plural}/{name}"


def _apply(cp, doc: dict[str, Any], token: str | None = None, dry: bool = False) -> tuple[int, Any]:
    q = "?fieldManager=gauntlet&force=true" + ("&dryRun=All" if dry else "")
    return cp.request("PATCH", _path(doc) + q, json.dumps(doc), content_type=APPLY, token=token)


def _sts(name: str, labelled: bool, replicas: int = 0) -> dict[str, Any]:
    labels = {"app": name, **({rbac.RUN_LABEL_KEY: UID} if labelled else {})}
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name, "namespace": NS, "labels": labels},
            "spec": {"replicas": replicas, "serviceName": name, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": labels}, "spec": {
                         "automountServiceAccountToken": False, "nodeSelector": {"gauntlet.dev/nowhere": "x"},
                         "containers": [{"name": "c", "image": "registry.invalid/none:1"}]}}}}


def _pod(name: str, labelled: bool) -> dict[str, Any]:
    labels = {rbac.RUN_LABEL_KEY: UID} if labelled else {"app": name}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS, "labels": labels},
            "spec": {"serviceAccountName": "gauntlet", "automountServiceAccountToken": False,
                     "nodeSelector": {"gauntlet.dev/nowhere": "x"},
                     "containers": [{"name": "c", "image": "registry.invalid/none:1"}]}}


def _token(cp, account: str) -> str:
    status, out = cp.request("POST", f"/api/v1/namespaces/{NS}/serviceaccounts/{account}/token",
                             {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                              "spec": {"expirationSeconds": 3600}})
    assert status == 201, (status, out)
    return out["status"]["token"]


def _allowed(cp, account: str, verb: str, group: str, resource: str, namespace: str | None,
             name: str | None = None) -> bool:
    res, _, sub = resource.partition("/")
    attrs = {"verb": verb, "group": group, "resource": res, **({"subresource": sub} if sub else {}),
             **({"namespace": namespace} if namespace else {}), **({"name": name} if name else {})}
    status, out = cp.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": f"system:serviceaccount:{NS}:{account}", "groups": SSAR_GROUPS, "resourceAttributes": attrs}})
    assert status == 201, (status, out)
    return bool(out["status"].get("allowed"))


@pytest.fixture(scope="module")
def applied(control_plane):
    cp = control_plane
    profile = load_profile("kimi-k3-h20").model_copy(update={"namespace": NS})
    docs = render_documents(profile)[f"{template_name(profile)}.rbac.yaml"]
    for d in [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}, *docs]:
        status, out = _apply(cp, d)
        assert status < 300, (d["kind"], d["metadata"]["name"], status, str(out)[:400])
    return cp, profile, docs


def _grants(rules) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def test_each_account_holds_its_roles_grants_and_nothing_of_the_others(applied):
    cp, profile, _docs = applied
    every = set().union(*(_grants(ns) | _grants(cl) for ns, cl in rbac.ROLES.values())) | {
        ("", "secrets", "get"), ("", "pods", "create"), ("apps", "statefulsets", "update"), ("", "pods", "watch"),
        ("batch", "jobs", "deletecollection"), ("", "pods/exec", "create")}
    executor = _grants(rbac.EXECUTOR_RULES)
    # the admission role reads three objects by name (resourceNames): asked for each by its name, and refused another
    named = {"namespaces": NS, "validatingadmissionpolicies": rbac.policy_name(NS, profile.service_account),
             "validatingadmissionpolicybindings": rbac.policy_name(NS, profile.service_account)}
    for role, (ns_rules, cluster_rules) in rbac.ROLES.items():
        acct = rbac.account(profile.service_account, role)

        def name_of(g: tuple[str, str, str], role: str | None = role) -> str | None:
            return named.get(g[1]) if role == "admission" else None
        want_ns = _grants(ns_rules) | _grants(cluster_rules) | executor
        got_ns = {g for g in every | executor if _allowed(cp, acct, g[2], g[0], g[1], NS, name_of(g))}
        assert got_ns == want_ns, (acct, got_ns ^ want_ns)
        got_cluster = {g for g in every if _allowed(cp, acct, g[2], g[0], g[1], None, name_of(g))}
        assert got_cluster == _grants(cluster_rules), (acct, got_cluster ^ _grants(cluster_rules))
        if role == "admission":
            assert not any(_allowed(cp, acct, "get", g[0], g[1], None, "someone-else") for g in _grants(cluster_rules))
        assert not _allowed(cp, acct, "list", "", "pods", "default") or cluster_rules   # nothing in another namespace


def _wait_policy_active(cp, token: str) -> None:
    """The policy and its binding reach the API server's admission a moment after they are created: a dry-run
    delete of an unlabelled object, until it is denied."""
    deadline = time.monotonic() + 60
    while True:
        status, out = cp.request("DELETE", f"/apis/apps/v1/namespaces/{NS}/statefulsets/theirs?dryRun=All", token=token)
        if status == 403 and "ValidatingAdmissionPolicy" in str(out):
            return
        assert time.monotonic() < deadline, f"the label policy never denied: {status} {out}"
        time.sleep(0.5)


def test_the_label_policy_denies_what_is_not_labelled_and_allows_what_is(applied):
    cp, profile, docs = applied
    pol = next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicy")["metadata"]["name"]
    for obj in (_sts("theirs", False, 1), _sts("ours", True, 1), _pod("bare-theirs", False), _pod("bare-ours", True)):
        status, out = _apply(cp, obj)
        assert status < 300, (obj["metadata"]["name"], status, str(out)[:300])
    janitor = _token(cp, rbac.account(profile.service_account, "janitor"))
    manager = _token(cp, rbac.account(profile.service_account, "manage"))
    _wait_policy_active(cp, janitor)

    def denied(status: int, out: Any, what: str) -> None:
        text = str(out.get("message") if isinstance(out, dict) else out)
        assert status == 403 and f"ValidatingAdmissionPolicy '{pol}'" in text and what in text, (status, text)

    sts, pods = f"/apis/apps/v1/namespaces/{NS}/statefulsets", f"/api/v1/namespaces/{NS}/pods"
    # the janitor: delete an unlabelled StatefulSet and pod -> denied by the policy (RBAC allows both verbs)
    denied(*cp.request("DELETE", f"{sts}/theirs", token=janitor), f"DELETE statefulsets {NS}/theirs")
    denied(*cp.request("DELETE", f"{pods}/bare-theirs", token=janitor), f"DELETE pods {NS}/bare-theirs")
    # scale: the Scale object carries no labels, so the policy allows scaling to 0 only, never up
    scale = json.dumps({"spec": {"replicas": 3}})
    denied(*cp.request("PATCH", f"{sts}/ours/scale", scale, "application/merge-patch+json", token=janitor),
           "scales to 0 only")
    status, out = cp.request("PATCH", f"{sts}/ours/scale", json.dumps({"spec": {"replicas": 0}}),
                             "application/merge-patch+json", token=janitor)
    assert status == 200, (status, out)
    # the manager: server-side apply onto someone else's object, or creating one without the label -> denied
    denied(*_apply(cp, _sts("theirs", False, 2), token=manager), f"UPDATE statefulsets {NS}/theirs")
    denied(*_apply(cp, _sts("new-unlabelled", False), token=manager), "would not carry the label")
    denied(*cp.request("DELETE", f"{sts}/theirs", token=manager), f"DELETE statefulsets {NS}/theirs")
    status, out = _apply(cp, _sts("new-ours", True), token=manager)
    assert status < 300, (status, str(out)[:300])
    # labelled objects: deleted
    for path in (f"{sts}/ours", f"{sts}/new-ours", f"{pods}/bare-ours"):
        status, out = cp.request("DELETE", path, token=janitor)
        assert status in (200, 202), (path, status, str(out)[:300])
    # the unlabelled ones are still there, untouched
    assert cp.request("GET", f"{sts}/theirs")[1]["spec"]["replicas"] == 1
    assert cp.request("GET", f"{pods}/bare-theirs")[0] == 200
    # the residual (docs/cluster.md, "Permissions"): a Scale carries no labels (scaleFromStatefulSet copies name,
    # namespace, uid only), so the policy cannot refuse scaling someone else's StatefulSet down to 0
    status, out = cp.request("PATCH", f"{sts}/theirs/scale", json.dumps({"spec": {"replicas": 0}}),
                             "application/merge-patch+json", token=janitor)
    assert status == 200 and cp.request("GET", f"{sts}/theirs")[1]["spec"]["replicas"] == 0, (status, out)
    # the admin (not a gauntlet account) is not matched by the policy
    assert cp.request("DELETE", f"{sts}/theirs")[0] == 200
