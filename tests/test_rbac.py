"""The Roles grant exactly what the code calls: verbs read from the code and seen on the wire, nothing broader.

A server-side apply is a PATCH, and one that creates the object is also authorized as ``create``
(k8s.io/apiserver pkg/endpoints/handlers/patch.go runs the create validation under a ``Verb: "create"``
authorizer check): every apply needs ``create`` and ``patch``.
"""

from __future__ import annotations

import re
from pathlib import Path

import kubernetes_validate
import pytest
from k8s_double import FakeEngine, K8sDouble, running

from gauntlet.params import load_profile
from gauntlet.steps import (_cleanup_k8s, _deploy_k8s, _janitor_k8s, _network_launch, cleanup, deploy, network,
                            teardown)
from gauntlet.steps._k8s import rbac
from gauntlet.steps._k8s.api import connect
from gauntlet.steps._k8s.manager import KINDS, node_gpu_pods

ROOT = Path(__file__).resolve().parents[1]
K8S_CODE = [ROOT / "steps" / p for p in ("_k8s/api.py", "_k8s/apply.py", "_k8s/manager.py", "_deploy_k8s.py",
                                           "_cleanup_k8s.py", "network.py", "nodes.py")]
# what `gauntlet step janitor` imports and calls (it applies nothing)
JANITOR_CODE = [ROOT / "steps" / p for p in ("_k8s/api.py", "_k8s/manager.py", "_cleanup_k8s.py", "_janitor_k8s.py")]
KIMI = load_profile("kimi-k3-h20")
UID = "11111111-2222-4333-8444-555555555555"
VERB = {"read": "get", "list": "list", "patch": "patch", "delete": "delete", "create": "create",
        "replace": "update", "watch": "watch", "delete_collection": "deletecollection", "connect": "create"}
# generated-client method suffix -> (apiGroup, resource)
RESOURCE = {"namespaced_stateful_set": ("apps", "statefulsets"), "namespaced_stateful_set_scale": ("apps", "statefulsets/scale"),
            "namespaced_service": ("", "services"), "namespaced_job": ("batch", "jobs"),
            "namespaced_pod": ("", "pods"), "namespaced_pod_log": ("", "pods/log"),
            "pod_for_all_namespaces": ("", "pods"), "namespaced_custom_object": ("argoproj.io", "workflows")}


def granted(rules) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def calls_in_code(files: list[Path] = K8S_CODE) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) for every generated-client method the code names, directly or through KINDS."""
    found = set()
    method = re.compile(r"\.(read|list|patch|delete_collection|delete|create|replace|watch|connect_\w+?)_("
                        r"namespaced_\w+|pod_for_all_namespaces|\w+_for_all_namespaces)\b")
    for f in files:
        text = f.read_text()
        for verb, suffix in method.findall(text):
            found.add((*RESOURCE[suffix], VERB[verb.split("_")[0] if verb.startswith("connect") else verb]))
        # Manager._method("<verb>", kind) and apply's f"patch_{suffix}" go through KINDS; a patch sent as
        # server-side apply (APPLY content type) creates what is missing: authorized as create too
        applies = 'f"patch_{suffix}"' in text
        dynamic = set(re.findall(r'_method\("(\w+)"', text)) | ({"patch"} if applies else set()) | (
            {"create"} if applies and "_content_type=APPLY" in text else set())
        for verb in dynamic:
            for _attr, suffix in KINDS.values():
                found.add((*RESOURCE[suffix], VERB[verb]))
    return found


def test_role_is_exactly_what_the_code_calls():
    code = calls_in_code()
    assert code == granted(rbac.RULES) | granted(rbac.CLUSTER_RULES), (
        f"code calls but not granted: {code - granted(rbac.RULES) - granted(rbac.CLUSTER_RULES)}; "
        f"granted but never called: {granted(rbac.RULES) | granted(rbac.CLUSTER_RULES) - code}")


def test_apply_needs_create_and_patch():
    """deploy's first apply creates the StatefulSet and Services: a Role with patch alone gets 403."""
    code = calls_in_code()
    for _attr, suffix in KINDS.values():
        group, resource = RESOURCE[suffix]
        assert {(group, resource, "create"), (group, resource, "patch")} <= code
        assert {(group, resource, "create"), (group, resource, "patch")} <= granted(rbac.RULES)


def test_janitor_role_is_exactly_what_the_janitor_calls():
    code = calls_in_code(JANITOR_CODE)
    assert code == granted(rbac.JANITOR_RULES), (
        f"called but not granted: {code - granted(rbac.JANITOR_RULES)}; "
        f"granted but never called: {granted(rbac.JANITOR_RULES) - code}")
    # it reads workflows and never creates or patches anything but a scale
    assert {v for (_, r, v) in code if r != "statefulsets/scale"} <= {"get", "list", "delete"}
    assert ("argoproj.io", "workflows", "list") in code


def test_nothing_broad():
    for rule in rbac.RULES + rbac.CLUSTER_RULES + rbac.EXECUTOR_RULES + rbac.JANITOR_RULES:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
        assert not {"update", "deletecollection", "escalate", "bind", "impersonate"} & set(rule["verbs"])
        # create only where server-side apply needs it (with patch), or Argo's executor reporting outputs
        assert "create" not in rule["verbs"] or "patch" in rule["verbs"]
    assert granted(rbac.CLUSTER_RULES) == {("", "pods", "list")}          # cluster-wide: read one list only


def test_rendered_documents():
    docs = rbac.role_manifests("gauntlet", "gauntlet")
    assert [d["kind"] for d in docs] == ["ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"]
    for d in docs:
        kubernetes_validate.validate(d, "1.37.0", strict=True)
    role = docs[1]
    assert granted(role["rules"]) == granted(rbac.RULES) | granted(rbac.EXECUTOR_RULES)
    assert docs[2]["roleRef"]["name"] == role["metadata"]["name"] and docs[2]["subjects"][0]["name"] == "gauntlet"
    assert granted(docs[3]["rules"]) == granted(rbac.CLUSTER_RULES)
    jan = rbac.janitor_manifests("gauntlet")
    assert [d["kind"] for d in jan] == ["ServiceAccount", "Role", "RoleBinding"]
    for d in jan:
        kubernetes_validate.validate(d, "1.37.0", strict=True)
    assert granted(jan[1]["rules"]) == granted(rbac.JANITOR_RULES) | granted(rbac.EXECUTOR_RULES)
    assert jan[2]["subjects"][0]["name"] == rbac.JANITOR_ACCOUNT == jan[2]["roleRef"]["name"]


def wire_to_rules(method: str, path: str, ctype: str = "") -> set[tuple[str, str, str]]:
    if path == "/api/v1/pods":
        return {("", "pods", "list")}
    m = re.match(r"^/apis?/(?:(apps|batch|argoproj.io)/)?v1(?:alpha1)?/namespaces/[^/]+/([a-z]+)"
                 r"(?:/([^/]+)(?:/([a-z]+))?)?$", path)
    assert m, path
    group, plural, name, sub = m.groups()
    resource = f"{plural}/{sub}" if sub else plural
    verb = {"GET": "get" if name else "list", "PATCH": "patch", "DELETE": "delete"}[method]
    if method == "PATCH" and ctype.startswith("application/apply-patch"):
        return {(group or "", resource, "patch"), (group or "", resource, "create")}
    return {(group or "", resource, verb)}


@pytest.fixture
def wire(monkeypatch, tmp_path):
    """Every gate that talks to the API, once, against the double; the requests it saw."""
    with K8sDouble() as d, FakeEngine() as eng:
        monkeypatch.setenv("GAUNTLET_KUBE_API", d.url)
        monkeypatch.setenv("GAUNTLET_READY_URL", eng.url)
        monkeypatch.setattr(_deploy_k8s, "POLL_S", 0.02)
        monkeypatch.setattr(_network_launch, "POLL_S", 0.02)
        a = dict(profile=KIMI, engine="sglang", run_id=UID)
        _deploy_k8s.deploy(deploy.Options(**a), tmp_path / "deploy")
        _deploy_k8s.teardown(teardown.Options(**a), tmp_path / "teardown")
        node_gpu_pods(connect(), "h20-node-01")
        d.pod_status = lambda pod: {"phase": "Succeeded", "containerStatuses": [
            {"name": "probe", "restartCount": 0, "state": {"terminated": {"exitCode": 0}}}]}
        (tmp_path / "network").mkdir()
        network.run(network.Options(profile=KIMI, run_id=UID, inputs=(), launcher="kubernetes"), tmp_path / "network")
        d.pod_status = running
        _deploy_k8s.deploy(deploy.Options(profile=KIMI, engine="vllm", run_id=UID),
                           tmp_path / "deploy-vllm")
        _cleanup_k8s.cleanup(cleanup.Options(run_id=UID, workflow_status="Succeeded", run_dir=str(tmp_path)), KIMI,
                             tmp_path / "cleanup")
        yield d.requests


def test_every_request_on_the_wire_is_granted(wire):
    seen = set().union(*(wire_to_rules(m, p, c) for (m, p, _, c) in wire))
    assert seen <= granted(rbac.RULES) | granted(rbac.CLUSTER_RULES), seen - granted(rbac.RULES)
    # and the flows use every grant: nothing in the Role is dead weight
    assert seen == granted(rbac.RULES) | granted(rbac.CLUSTER_RULES)


WF_DONE = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
           "metadata": {"name": "gauntlet-kimi-k3-h20-done", "namespace": "gauntlet", "uid": UID},
           "status": {"phase": "Failed", "finishedAt": "2026-12-01T00:00:00Z"}}


def test_janitor_wire_is_granted_by_its_role(monkeypatch, tmp_path):
    """The janitor, once over a finished run with a StatefulSet, a Job, Services and a bare pod."""
    with K8sDouble() as d, FakeEngine() as eng:
        monkeypatch.setenv("GAUNTLET_KUBE_API", d.url)
        monkeypatch.setenv("GAUNTLET_READY_URL", eng.url)
        monkeypatch.setattr(_deploy_k8s, "POLL_S", 0.02)
        monkeypatch.setattr(_cleanup_k8s, "POLL_S", 0.02)
        _deploy_k8s.deploy(deploy.Options(profile=KIMI, engine="sglang", run_id=UID),
                           tmp_path / "deploy")
        d.add({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "probe", "namespace": "gauntlet",
               "labels": {"gauntlet.dev/run": UID}}, "spec": {"completions": 1, "template": {"spec": {
                   "containers": [{"name": "p", "image": "x"}]}}}})
        d.add({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bare", "namespace": "gauntlet",
               "labels": {"gauntlet.dev/run": UID}}, "spec": {"containers": [{"name": "c", "image": "x"}]},
               "status": {"phase": "Running"}})
        d.add(WF_DONE)
        d.requests.clear()
        checks, metrics = _janitor_k8s.sweep("gauntlet", tmp_path / "janitor", 60)
        assert metrics["held"] == [] and UID in metrics["released"], checks
    seen = set().union(*(wire_to_rules(m, p, c) for (m, p, _, c) in d.requests))
    assert seen == granted(rbac.JANITOR_RULES), (seen - granted(rbac.JANITOR_RULES),
                                                 granted(rbac.JANITOR_RULES) - seen)
