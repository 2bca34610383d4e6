"""The network gate's Kubernetes launcher against the API double: Jobs applied, logs read, Jobs deleted."""

from __future__ import annotations

import json

import pytest
from k8s_double import K8sDouble

from gauntlet.params import load_profile
from gauntlet.steps.cluster import nccl_probe as _nccl_probe
from gauntlet.steps.backends.kubernetes import network as _network_launch
from gauntlet.steps.gates import network
from gauntlet.steps.gates import nodes
from gauntlet.steps.backends.kubernetes.api import connect
from gauntlet.steps.backends.kubernetes.manager import node_gpu_pods

UID = "3a4b5c6d-0000-4000-8000-000000000001"
KIMI = load_profile("kimi-k3-h20")


def probe_log(world: int, busbw: float, correct: bool = True) -> str:
    rows = [{"op": op, "bytes": b, "time_us": 10.0, "algbw_gbps": busbw, "busbw_gbps": busbw, "correct": correct,
             "error": None} for op in _nccl_probe.OPS for b in (1 << 20, 1 << 30)]
    res = {"world_size": world, "backend": "nccl", "nccl": "2.28.9", "results": rows}
    return ("NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n"
            "NCCL INFO Channel 00/0 : 8[0] -> 0[0] [receive] via NET/IB/0/GDRDMA\n"
            + _nccl_probe.RESULT_PREFIX + json.dumps(res) + "\n")


@pytest.fixture
def cluster(monkeypatch):
    with K8sDouble() as d:
        monkeypatch.setenv("GAUNTLET_KUBE_API", d.url)
        monkeypatch.setattr(_network_launch, "POLL_S", 0.02)
        d.pod_status = lambda pod: {"phase": "Succeeded", "containerStatuses": [
            {"name": "probe", "ready": False, "restartCount": 0, "state": {"terminated": {"exitCode": 0}}}]}
        yield d


def inventories(tmp_path, mtu=(4096, 4096)):
    dirs = []
    for i, m in enumerate(mtu):
        d = tmp_path / f"nodes-{i}"
        d.mkdir()
        (d / "inventory.json").write_text(json.dumps({
            "node": f"h20-node-0{i + 1}", "gpus": {"gpus": [{"name": "NVIDIA H20"}] * 8, "driver": "580.159.04"},
            "rdma": [{"device": "mlx5_0", "port": 1, "state": "ACTIVE", "netdev": "ib0"}],
            "nics": [{"name": "ib0", "mtu": m}], "socket_ifname": "ib0",
            "storage": {"shards": 96, "shard_bytes": 1, "marker": True}}))
        dirs.append(str(d))
    return dirs


def run(tmp_path, **kw):
    args = network.Options(profile=KIMI, run_id=UID, inputs=tuple(kw.get("inputs", ())), backend="kubernetes")
    out = tmp_path / "network"
    out.mkdir()
    return network.run(args, out), out


def test_intra_then_inter_jobs_judged_and_deleted(cluster, tmp_path):
    d = cluster
    d.pod_log = lambda pod, c: (probe_log(8, 400.0) if pod["metadata"]["labels"]["gauntlet.dev/component"]
                                .endswith("intra") else probe_log(16, 50.0) if pod["metadata"]["name"].endswith(
                                    "-0-x0") else "worker: no result line\n")
    (checks, metrics), out = run(tmp_path, inputs=inventories(tmp_path))
    c = {x.name: x for x in checks}
    assert c["intra_correct"].status == c["inter_correct"].status == "pass"
    assert c["intra_all_reduce_busbw"].status == "pass"                     # 400 >= 300
    assert c["inter_all_reduce_busbw"].status == "pass"                     # 50 >= 40
    assert c["nodes_agree_mtu"].status == "pass"
    assert metrics["phases"]["intra"]["where"] == ["h20-node-01", "h20-node-02"]
    assert metrics["phases"]["inter"]["world_size"] == [16]
    assert metrics["phases"]["inter"]["transports"] == {"NET/IB": 1, "P2P/CUMEM": 1}
    assert d.names("jobs") == [] and [n for n in d.names("services")] == []   # deleted after
    applied = [p for (m, p, _, _) in d.requests if m == "PATCH"]
    assert any(p.endswith("/jobs/g-netprobe-intra-3a4b5c6d") for p in applied)
    assert any(p.endswith("/services/g-netprobe-inter-3a4b5c6d-rdzv") for p in applied)
    assert (out / "probe-intra-g-netprobe-intra-3a4b5c6d-1-x1.log").exists()
    env = json.loads((out / "probe-env.json").read_text())
    assert env["NCCL_NVLS_ENABLE"] == "0" and env["NCCL_CUMEM_ENABLE"] == "1"     # NVLS as SGLang sets it


def test_wrong_values_and_slow_links_fail(cluster, tmp_path):
    d = cluster
    d.pod_log = lambda pod, c: probe_log(8, 100.0, correct=False)
    (checks, _), _ = run(tmp_path)
    c = {x.name: x for x in checks}
    assert c["intra_correct"].status == "fail" and c["intra_all_reduce_busbw"].status == "fail"


def test_probe_pod_that_cannot_pull_fails_fast(cluster, tmp_path, monkeypatch):
    """Stuck pulling for the grace (here 0 s): the probe stops waiting, names the cause, deletes its Job."""
    d = cluster
    monkeypatch.setenv("GAUNTLET_POD_STUCK_GRACE_S", "0")
    d.pod_status = lambda pod: {"phase": "Pending", "containerStatuses": [
        {"name": "probe", "ready": False, "restartCount": 0, "state": {"waiting": {"reason": "ImagePullBackOff"}}}]}
    d.pod_log = lambda pod, c: ""
    (checks, _), out = run(tmp_path)
    assert {x.name: x for x in checks}["intra_ran"].status == "fail"
    assert "ImagePullBackOff" in (out / "probe-intra-problem.txt").read_text()
    assert "ImagePullBackOff" in {x.name: x for x in checks}["intra_ran"].detail
    assert d.names("jobs") == []


def test_mtu_mismatch_across_nodes_fails(cluster, tmp_path):
    d = cluster
    d.pod_log = lambda pod, c: probe_log(8, 400.0)
    (checks, _), _ = run(tmp_path, inputs=inventories(tmp_path, mtu=(4096, 1500)))
    assert {x.name: x for x in checks}["nodes_agree_mtu"].status == "fail"


def test_foreign_gpu_pods_listed_from_the_api(cluster):
    d = cluster
    d.pod_status = lambda pod: {"phase": "Running"}
    d.add({"apiVersion": "apps/v1", "kind": "StatefulSet",
           "metadata": {"name": "embedder", "namespace": "search", "labels": {"app": "e"}},
           "spec": {"replicas": 1, "template": {"metadata": {"labels": {"app": "e"}}, "spec": {
               "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                   {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                          "values": ["h20-node-02"]}]}]}}},
               "containers": [{"name": "e", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}}})
    api = connect()
    assert node_gpu_pods(api, "h20-node-01") == []
    pods = node_gpu_pods(api, "h20-node-02")
    assert pods == [{"namespace": "search", "name": "embedder-0", "gpus": 2, "run": None}]
    c = nodes.judge_foreign_pods(pods, UID, "h20-node-02")
    assert c.status == "fail" and "search/embedder-0" in c.detail


def test_inter_phase_skipped_after_a_failed_intra_phase(cluster, tmp_path):
    d = cluster
    d.pod_log = lambda pod, c: probe_log(8, 400.0, correct=False)
    (checks, metrics), _ = run(tmp_path)
    c = {x.name: x for x in checks}
    assert c["intra_correct"].status == "fail" and c["inter_ran"].status == "skip"
    assert list(metrics["phases"]) == ["intra"]
    assert not [p for (m, p, _, _) in d.requests if m == "PATCH" and "netprobe-inter" in p]


def test_options_refuse_bad_flags_up_front():
    from gauntlet.contract import UsageError
    with pytest.raises(UsageError, match=r"^--engine trtllm"):
        network.Options(profile=KIMI, engine="trtllm")
    with pytest.raises(UsageError, match=r"^--sizes"):
        network.Options(profile=KIMI, sizes="1M,2M")
    with pytest.raises(UsageError, match=r"^--nproc"):
        network.Options(profile=KIMI, nproc=0)
    assert network.Options(profile=KIMI, sizes="4096,").sizes == "4096,"
