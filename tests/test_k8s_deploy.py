"""Gate 2 on Kubernetes against the API double: deploy, readiness, fail fast, idempotency, teardown."""

from __future__ import annotations

import argparse
import json

import pytest
from k8s_double import running

from gauntlet.params import load_profile
from gauntlet.steps.backends.kubernetes import deploy as _deploy_k8s
from gauntlet.steps.gates import deploy
from gauntlet.steps.gates import teardown
from gauntlet.steps.runner import run_step

UID = "9e0d4c2a-1111-2222-3333-444455556666"
KIMI = load_profile("kimi-k3-h20")
SGLANG_LOG = ("[2026-12-02 10:00:00 TP0] Load weight end. type=KimiK3ForCausalLM, dtype=torch.bfloat16, "
              "avail mem=38.20 GB, mem usage=97.31 GB.\n[TP0] KV Cache is allocated. #tokens: 412000, K size: 9.1 GB\n"
              "[TP0] The server is fired up and ready to roll!\n")


@pytest.fixture
def cluster(api_double, monkeypatch):
    d, eng = api_double
    d.pod_log = lambda pod, c: SGLANG_LOG if c == "engine" else "marker present\n"
    yield d, eng


def args(engine="sglang", profile=KIMI, **kw):
    return deploy.Options(profile=profile, engine=engine, variant=kw.get("variant"), run_id=kw.get("run_id", UID),
                          backend="kubernetes")


def down(engine="sglang", profile=KIMI):
    return teardown.Options(profile=profile, engine=engine, run_id=UID, backend="kubernetes")


def by_name(checks):
    return {c.name: c for c in checks}


def test_deploy_through_the_step_writes_endpoint_and_evidence(cluster, tmp_path):
    d, eng = cluster
    out = tmp_path / "deploy"
    ns = argparse.Namespace(profile="kimi-k3-h20", out=str(out), engine="sglang", backend="kubernetes",
                            run_id=UID, variant=None)
    assert run_step(deploy, ns) == 0
    endpoint = (out / "outputs" / "endpoint").read_text()
    assert endpoint == "http://g-sglang-9e0d4c2a.gauntlet.svc.cluster.local:30000"
    assert d.names("statefulsets") == ["g-sglang-9e0d4c2a"]
    assert d.names("services") == ["g-sglang-9e0d4c2a", "g-sglang-9e0d4c2a-hl"]
    assert eng.calls == ["GET /health", "POST /v1/completions max_tokens=1"]
    rec = json.loads((out / "deploy.json").read_text())
    assert rec["image_digest"].startswith("sha256:") and rec["image"].endswith(rec["image_digest"])
    assert len(rec["argv_per_rank"]) == 2 and rec["env"]["NCCL_CUMEM_ENABLE"] == "1"
    assert {r["node"] for r in rec["ranks"].values()} == {"h20-node-01", "h20-node-02"}
    assert any("mem usage=97.31 GB" in ln for ln in rec["ranks"]["g-sglang-9e0d4c2a-1"]["gpu_memory"])
    assert (out / "logs" / "g-sglang-9e0d4c2a-1.engine.log").read_text() == SGLANG_LOG
    assert (out / "logs" / "g-sglang-9e0d4c2a-0.require-marker.log").exists()
    v = json.loads((out / "verdict.json").read_text())
    assert {c["name"]: c["status"] for c in v["checks"]} == {"applied": "pass", "one_rank_per_node": "pass",
                                                             "ready": "pass"}


def test_deploy_is_idempotent_under_retry(cluster, tmp_path):
    d, _ = cluster
    checks1, _ = _deploy_k8s.deploy(args(), tmp_path / "a")
    uid1 = d.get("statefulsets", "gauntlet", "g-sglang-9e0d4c2a")["metadata"]["uid"]
    checks2, m2 = _deploy_k8s.deploy(args(), tmp_path / "b")          # the Argo retry
    sts = d.get("statefulsets", "gauntlet", "g-sglang-9e0d4c2a")
    assert sts["metadata"]["uid"] == uid1 and sts["metadata"]["managedFields"][0]["manager"] == "gauntlet"
    assert d.names("statefulsets") == ["g-sglang-9e0d4c2a"] and len(d.names("pods")) == 2
    assert all(c.status == "pass" for c in checks1 + checks2) and m2["outputs"]["endpoint"]


def test_oom_killed_rank_fails_fast(cluster, tmp_path):
    d, eng = cluster

    def status(pod):
        if pod["metadata"]["name"].endswith("-1"):
            return {"phase": "Running", "containerStatuses": [{
                "name": "engine", "ready": False, "restartCount": 1, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}]}
        return running(pod)
    d.pod_status = status
    checks, metrics = _deploy_k8s.deploy(args(), tmp_path)
    c = by_name(checks)["ready"]
    assert c.status == "fail" and "g-sglang-9e0d4c2a-1: engine: OOMKilled" in c.detail
    assert eng.calls == []                                 # never waited on /health: failed on the pod state
    assert metrics["outputs"]["endpoint"] == ""
    assert (tmp_path / "logs" / "g-sglang-9e0d4c2a-1.engine.previous.log").exists()


def test_marker_refusal_fails_fast(cluster, tmp_path):
    d, _ = cluster

    def status(pod):
        return {"phase": "Pending", "initContainerStatuses": [{
            "name": "require-marker", "ready": False, "restartCount": 2,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"reason": "Error", "exitCode": 1}}}]}
    d.pod_status = status
    c = by_name(_deploy_k8s.deploy(args(), tmp_path)[0])["ready"]
    assert c.status == "fail" and "require-marker" in c.detail


def test_not_ready_within_timeout(cluster, tmp_path):
    d, eng = cluster
    eng.healthy = False
    spec = KIMI.engines["vllm"].model_copy(update={"ready_timeout_s": 1})
    p = KIMI.model_copy(update={"engines": {**KIMI.engines, "vllm": spec}})
    c = by_name(_deploy_k8s.deploy(args("vllm", p), tmp_path)[0])["ready"]
    assert c.status == "fail" and "not ready after 1s" in c.detail and "/health answered 503" in c.detail


def test_refuses_to_take_over_a_foreign_object(cluster, tmp_path):
    d, _ = cluster
    d.add({"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": "g-sglang-9e0d4c2a", "namespace": "gauntlet", "labels": {"team": "search"}},
           "spec": {"ports": [{"port": 80}]}})
    checks, _ = _deploy_k8s.deploy(args(), tmp_path)
    assert [c.name for c in checks] == ["names_free"] and checks[0].status == "fail"
    assert d.get("services", "gauntlet", "g-sglang-9e0d4c2a")["metadata"]["labels"] == {"team": "search"}
    assert d.names("statefulsets") == []


def test_teardown_scales_to_zero_and_waits_for_gpus(cluster, tmp_path):
    d, _ = cluster
    _deploy_k8s.deploy(args(), tmp_path / "deploy")
    _deploy_k8s.deploy(args("vllm"), tmp_path / "deploy-vllm")
    checks, metrics = _deploy_k8s.teardown(down(), tmp_path / "teardown")
    assert by_name(checks)["gpus_free"].status == "pass" and metrics["stopped"] == ["g-sglang-9e0d4c2a"]
    assert d.get("statefulsets", "gauntlet", "g-sglang-9e0d4c2a")["spec"]["replicas"] == 0
    assert [n for n in d.names("pods") if n.startswith("g-sglang")] == []
    assert len([n for n in d.names("pods") if n.startswith("g-vllm")]) == 2       # the other engine untouched
    assert (tmp_path / "teardown" / "logs" / "g-sglang-9e0d4c2a-0.engine.log").exists()
    again, _ = _deploy_k8s.teardown(down(), tmp_path / "teardown2")               # idempotent
    assert all(c.status == "pass" for c in again)
    redeploy, _ = _deploy_k8s.deploy(args(), tmp_path / "deploy2")               # apply brings replicas back
    assert d.get("statefulsets", "gauntlet", "g-sglang-9e0d4c2a")["spec"]["replicas"] == 2
    assert all(c.status == "pass" for c in redeploy)


def test_teardown_with_nothing_deployed(cluster, tmp_path):
    checks, _ = _deploy_k8s.teardown(down(), tmp_path)
    assert checks[0].status == "pass" and "nothing to stop" in checks[0].detail


def test_variant_deploys_its_own_statefulset(cluster, tmp_path):
    d, _ = cluster
    checks, m = _deploy_k8s.deploy(args(variant="prefix-cache"), tmp_path)
    assert all(c.status == "pass" for c in checks)
    (name,) = d.names("statefulsets")
    assert "prefix-cache" in name
    script = d.get("statefulsets", "gauntlet", name)["spec"]["template"]["spec"]["containers"][0]["command"][2]
    assert "--disable-radix-cache" not in script          # the one variable the variant changes


def test_teardown_cli_dispatch(cluster, tmp_path):
    ns = argparse.Namespace(profile="kimi-k3-h20", out=str(tmp_path), engine="vllm", backend="kubernetes",
                            run_id=UID)
    assert run_step(teardown, ns) == 0


def test_missing_run_id_is_a_usage_error(cluster, tmp_path, monkeypatch):
    monkeypatch.delenv("GAUNTLET_RUN_ID", raising=False)
    ns = argparse.Namespace(profile="kimi-k3-h20", out=str(tmp_path), engine="vllm", backend="kubernetes",
                            run_id=None, variant=None)
    assert run_step(deploy, ns) == 2


def test_baseline_and_variant_teardowns_never_touch_each_other(cluster, tmp_path):
    """Gate 6's selectors against the double (which lists by `k=v` and `!k` terms as the API server does):
    releasing the baseline leaves a variant's pods, a variant's teardown leaves the baseline, and the
    sequence's final teardown passes when the baseline was released already."""
    d, _ = cluster
    _deploy_k8s.deploy(args(), tmp_path / "deploy")
    _deploy_k8s.deploy(args(variant="prefix-cache"), tmp_path / "variant")
    (var,) = [n for n in d.names("statefulsets") if "prefix-cache" in n]
    release = teardown.Options(profile=KIMI, engine="sglang", run_id=UID, backend="kubernetes")
    checks, m = _deploy_k8s.teardown(release, tmp_path / "release-baseline")
    assert m["stopped"] == ["g-sglang-9e0d4c2a"] and all(c.status == "pass" for c in checks)
    assert d.get("statefulsets", "gauntlet", var)["spec"]["replicas"] == 2
    assert sorted(n for n in d.names("pods") if n.startswith(var)) == [f"{var}-0", f"{var}-1"]
    assert (tmp_path / "release-baseline" / "logs" / "g-sglang-9e0d4c2a-0.engine.log").exists()
    _deploy_k8s.deploy(args(), tmp_path / "deploy-again")                  # the baseline back, beside the variant
    only_var = teardown.Options(profile=KIMI, engine="sglang", run_id=UID, backend="kubernetes", variant="prefix-cache")
    _, m = _deploy_k8s.teardown(only_var, tmp_path / "exp-teardown")
    assert m["stopped"] == [var] and d.get("statefulsets", "gauntlet", "g-sglang-9e0d4c2a")["spec"]["replicas"] == 2
    _deploy_k8s.teardown(release, tmp_path / "release-2")
    final, m = _deploy_k8s.teardown(release, tmp_path / "teardown")        # released already: passes, says so
    assert all(c.status == "pass" for c in final) and "already at 0" in final[0].detail


def test_teardown_of_an_unknown_variant_is_a_usage_error(tmp_path, capsys):
    ns = argparse.Namespace(profile="kimi-k3-h20", out=str(tmp_path), engine="sglang", backend="kubernetes",
                            run_id=UID, variant="nope")
    assert run_step(teardown, ns) == 2
    assert capsys.readouterr().err.strip() == ("UsageError: --variant nope: not in profile kimi-k3-h20 "
                                               "(has prefix-cache, dspark, hicache, symm-mem)")
