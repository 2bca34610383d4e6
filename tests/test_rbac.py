"""The Role grants exactly what the code calls: verbs read from the code and seen on the wire, nothing broader."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import kubernetes_validate
import pytest
from k8s_double import FakeEngine, K8sDouble, running

from params import load_profile
from steps import _cleanup_k8s, _deploy_k8s, network
from steps._k8s import rbac
from steps._k8s.api import connect
from steps._k8s.manager import KINDS, node_gpu_pods

ROOT = Path(__file__).resolve().parents[1]
K8S_CODE = [ROOT / "steps" / p for p in ("_k8s/api.py", "_k8s/apply.py", "_k8s/manager.py", "_deploy_k8s.py",
                                           "_cleanup_k8s.py", "network.py", "nodes.py")]
KIMI = load_profile("kimi-k3-h20")
UID = "11111111-2222-4333-8444-555555555555"
VERB = {"read": "get", "list": "list", "patch": "patch", "delete": "delete", "create": "create",
        "replace": "update", "watch": "watch", "delete_collection": "deletecollection", "connect": "create"}
# generated-client method suffix -> (apiGroup, resource)
RESOURCE = {"namespaced_stateful_set": ("apps", "statefulsets"), "namespaced_stateful_set_scale": ("apps", "statefulsets/scale"),
            "namespaced_service": ("", "services"), "namespaced_job": ("batch", "jobs"),
            "namespaced_pod": ("", "pods"), "namespaced_pod_log": ("", "pods/log"),
            "pod_for_all_namespaces": ("", "pods")}


def granted(rules) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def calls_in_code() -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) for every generated-client method the code names, directly or through KINDS."""
    found = set()
    method = re.compile(r"\.(read|list|patch|delete_collection|delete|create|replace|watch|connect_\w+?)_("
                        r"namespaced_\w+|pod_for_all_namespaces|\w+_for_all_namespaces)\b")
    for f in K8S_CODE:
        text = f.read_text()
        for verb, suffix in method.findall(text):
            found.add((*RESOURCE[suffix], VERB[verb.split("_")[0] if verb.startswith("connect") else verb]))
        # Manager._method("<verb>", kind) and apply's f"patch_{suffix}" go through KINDS
        dynamic = set(re.findall(r'_method\("(\w+)"', text)) | ({"patch"} if 'f"patch_{suffix}"' in text else set())
        for verb in dynamic:
            for _attr, suffix in KINDS.values():
                found.add((*RESOURCE[suffix], VERB[verb]))
    return found


def test_role_is_exactly_what_the_code_calls():
    code = calls_in_code()
    assert code == granted(rbac.RULES) | granted(rbac.CLUSTER_RULES), (
        f"code calls but not granted: {code - granted(rbac.RULES) - granted(rbac.CLUSTER_RULES)}; "
        f"granted but never called: {granted(rbac.RULES) | granted(rbac.CLUSTER_RULES) - code}")


def test_nothing_broad():
    for rule in rbac.RULES + rbac.CLUSTER_RULES + rbac.EXECUTOR_RULES:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
        assert not {"create", "update", "deletecollection", "escalate", "bind", "impersonate"} & set(rule["verbs"]) \
            or rule in rbac.EXECUTOR_RULES
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


def wire_to_rule(method: str, path: str) -> tuple[str, str, str]:
    if path == "/api/v1/pods":
        return ("", "pods", "list")
    m = re.match(r"^/apis?/(?:(apps|batch)/)?v1/namespaces/[^/]+/([a-z]+)(?:/([^/]+)(?:/([a-z]+))?)?$", path)
    assert m, path
    group, plural, name, sub = m.groups()
    resource = f"{plural}/{sub}" if sub else plural
    verb = {"GET": "get" if name else "list", "PATCH": "patch", "DELETE": "delete"}[method]
    return (group or "", resource, verb)


@pytest.fixture
def wire(monkeypatch, tmp_path):
    """Every gate that talks to the API, once, against the double; the requests it saw."""
    with K8sDouble() as d, FakeEngine() as eng:
        monkeypatch.setenv("GAUNTLET_KUBE_API", d.url)
        monkeypatch.setenv("GAUNTLET_READY_URL", eng.url)
        monkeypatch.setattr(_deploy_k8s, "POLL_S", 0.02)
        monkeypatch.setattr(network, "POLL_S", 0.02)
        a = argparse.Namespace(profile_obj=KIMI, engine="sglang", variant=None, run_id=UID)
        _deploy_k8s.deploy(a, tmp_path / "deploy")
        _deploy_k8s.teardown(a, tmp_path / "teardown")
        node_gpu_pods(connect(), "h20-node-01")
        d.pod_status = lambda pod: {"phase": "Succeeded", "containerStatuses": [
            {"name": "probe", "restartCount": 0, "state": {"terminated": {"exitCode": 0}}}]}
        (tmp_path / "network").mkdir()
        network.run(argparse.Namespace(profile_obj=KIMI, engine=None, run_id=UID, inputs=[], launcher="kubernetes",
                                       nproc=None, sizes=None), tmp_path / "network")
        d.pod_status = running
        _deploy_k8s.deploy(argparse.Namespace(profile_obj=KIMI, engine="vllm", variant=None, run_id=UID),
                           tmp_path / "deploy-vllm")
        _cleanup_k8s.cleanup(argparse.Namespace(profile_obj=KIMI, run_id=UID, workflow_status="Succeeded",
                                                failures="null", run_dir=str(tmp_path)), tmp_path / "cleanup")
        yield d.requests


def test_every_request_on_the_wire_is_granted(wire):
    seen = {wire_to_rule(m, p) for (m, p, _, _) in wire}
    assert seen <= granted(rbac.RULES) | granted(rbac.CLUSTER_RULES), seen - granted(rbac.RULES)
    # and the flows use every grant: nothing in the Role is dead weight
    assert seen == granted(rbac.RULES) | granted(rbac.CLUSTER_RULES)
