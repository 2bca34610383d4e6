"""The exit handler on Kubernetes, against the API double, with another team's StatefulSet beside ours."""

from __future__ import annotations

import argparse
import copy
import json

import pytest
from k8s_double import FakeEngine, K8sDouble

from gauntlet.params import load_images, load_profile
from gauntlet.steps.backends.kubernetes import deploy as _deploy_k8s
from gauntlet.steps.gates import cleanup
from gauntlet.steps.gates import deploy
from gauntlet.steps.backends.kubernetes import manifests as M
from gauntlet.steps.runner import run_step

UID = "7c3e1a90-aaaa-bbbb-cccc-ddddeeeeffff"
OTHER_RUN = "0badc0de-0000-1111-2222-333344445555"
KIMI = load_profile("kimi-k3-h20")


def foreign_statefulset() -> dict:
    """Another team's GPU service in the same namespace, on the same nodes."""
    return {"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "search-embedder", "namespace": "gauntlet", "labels": {"app": "embedder"}},
            "spec": {"replicas": 2, "serviceName": "search-embedder", "selector": {"matchLabels": {"app": "embedder"}},
                     "template": {"metadata": {"labels": {"app": "embedder"}}, "spec": {
                         "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                             "nodeSelectorTerms": [{"matchExpressions": [{"key": "kubernetes.io/hostname",
                                                                          "operator": "In",
                                                                          "values": ["h20-node-01", "h20-node-02"]}]}]}}},
                         "containers": [{"name": "embedder", "image": "embedder:1",
                                         "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}


@pytest.fixture
def cluster(monkeypatch, tmp_path):
    with K8sDouble() as d, FakeEngine() as eng:
        monkeypatch.setenv("GAUNTLET_KUBE_API", d.url)
        monkeypatch.setenv("GAUNTLET_READY_URL", eng.url)
        monkeypatch.setattr(_deploy_k8s, "POLL_S", 0.02)
        d.add(foreign_statefulset())
        d.add({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "search-embedder", "namespace": "gauntlet", "labels": {"app": "embedder"}},
               "spec": {"selector": {"app": "embedder"}, "ports": [{"port": 80}]}})
        # another gauntlet run's engine: labelled, but not with our uid
        for o in M.engine_objects(KIMI, "vllm", OTHER_RUN, load_images()["vllm"].ref):
            d.add(o)
        for engine in ("sglang", "vllm"):
            a = deploy.Options(profile=KIMI, engine=engine, run_id=UID)
            assert all(c.status == "pass" for c in _deploy_k8s.deploy(a, tmp_path / f"deploy-{engine}")[0])
        (tmp_path / "deploy-sglang" / "verdict.json").write_text(json.dumps({"gate": "deploy", "status": "pass"}))
        yield d


def snapshot(d: K8sDouble, keep) -> dict:
    return {k: copy.deepcopy(v) for k, v in d.objects.items() if keep(v)}


def not_ours(o) -> bool:
    return (o["metadata"].get("labels") or {}).get("gauntlet.dev/run") != UID


def run_cleanup(tmp_path, name="cleanup"):
    out = tmp_path / name
    ns = argparse.Namespace(profile_ref="kimi-k3-h20", out=str(out), workflow_status="Failed",
                            failures='[{"displayName": "smoke", "message": "wrong answer"}]', backend="kubernetes",
                            run_id=UID, run_dir=str(tmp_path))
    rc = run_step(cleanup, ns)
    return rc, json.loads((out / "verdict.json").read_text()), out


def test_cleanup_saves_evidence_then_releases_only_ours(cluster, tmp_path):
    d = cluster
    before = snapshot(d, not_ours)
    assert len([k for k in before if k[0] == "pods"]) == 4          # 2 embedder pods + 2 of the other run
    rc, v, out = run_cleanup(tmp_path)
    assert rc == 0, v
    # ours: gone, after their logs were saved
    assert not [k for k, o in d.objects.items() if not not_ours(o)]
    logs = sorted(p.name for p in (out / "logs").iterdir())
    assert "g-sglang-7c3e1a90-1.engine.log" in logs and "g-vllm-7c3e1a90-0.require-marker.log" in logs
    objs = json.loads((out / "objects.json").read_text())
    assert sorted(o["metadata"]["name"] for o in objs["StatefulSet"]) == ["g-sglang-7c3e1a90", "g-vllm-7c3e1a90"]
    res = json.loads((out / "results.json").read_text())
    assert res["verdicts"] == {"deploy-sglang": "pass"} and res["failures"][0]["displayName"] == "smoke"
    # theirs: byte-for-byte as before (same resourceVersion: never patched, scaled or deleted)
    assert snapshot(d, not_ours) == before
    actions = v["metrics"]["actions"]
    assert {(a["kind"], a["name"], a["action"]) for a in actions} >= {
        ("StatefulSet", "g-sglang-7c3e1a90", "scaled to 0"), ("StatefulSet", "g-vllm-7c3e1a90", "deleted"),
        ("Service", "g-vllm-7c3e1a90-hl", "deleted")}
    assert all(UID[:8] in a["name"] for a in actions)
    touched = {path for (method, path, _, _) in d.requests if method in ("PATCH", "DELETE")}
    assert not [p for p in touched if "search-embedder" in p or OTHER_RUN[:8] in p]
    checks = {c["name"]: c for c in v["checks"]}
    assert checks["released"]["status"] == "pass" and checks["evidence_saved"]["status"] == "pass"


def test_cleanup_twice_is_harmless(cluster, tmp_path):
    d = cluster
    run_cleanup(tmp_path, "cleanup-1")
    before = snapshot(d, lambda o: True)
    rc, v, _ = run_cleanup(tmp_path, "cleanup-2")
    assert rc == 0 and v["metrics"]["actions"] == []
    assert "already clean" in {c["name"]: c for c in v["checks"]}["released"]["detail"]
    assert snapshot(d, lambda o: True) == before


def test_cleanup_never_lists_without_the_run_selector(cluster, tmp_path):
    d = cluster
    run_cleanup(tmp_path)
    lists = [(path, q) for (m, path, q, _) in d.requests
             if m == "GET" and path.endswith(("/statefulsets", "/jobs", "/services", "/pods"))]
    assert len(lists) >= 4
    assert all(q.get("labelSelector", [""])[0].startswith(f"gauntlet.dev/run={UID}") for _, q in lists), lists
