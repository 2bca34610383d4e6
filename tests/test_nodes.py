"""Gate 1 per node: judgement on constructed inventories, each fault failing the right check."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, replace
from pathlib import Path

import sysfs_tree as T

from gauntlet.params import load_profile
from gauntlet.steps.cluster import gpu as _gpu
from gauntlet.steps.cluster import sysfs as _sysfs
from gauntlet.steps.gates import nodes
from gauntlet.steps.runner import run_step

KIMI = load_profile("kimi-k3-h20")


def h20(i: int, **kw) -> _gpu.GpuInfo:
    base = dict(index=i, name="NVIDIA H20", uuid=f"GPU-{i}", bus_id=f"00000000:{i + 10:02x}:00.0",
                memory_total_mib=143771, memory_used_mib=0, driver="580.159.04", persistence=True,
                ecc_uncorrected=0)
    base.update(kw)
    return _gpu.GpuInfo(**base)


def good_inventory(n: int = 8, driver: str = "580.159.04") -> _gpu.GpuInventory:
    return _gpu.GpuInventory(tuple(h20(i, driver=driver) for i in range(n)), driver=driver, cuda="13.0")


def good_probe(n: int = 8) -> list[_gpu.ProbeResult]:
    return [_gpu.ProbeResult(i, "NVIDIA H20", copy_tbps=3.9, bf16_tflops=140.0, allreduce_ok=i == 0 or None)
            for i in range(n)]


def node_tree(root: Path, fs: str = "xfs", mtu: int = 4096) -> None:
    T.nic(root, "eth0", mtu=1500, pci="0000:01:00.0")
    for i in range(4):
        T.nic(root, f"ibp{i}", mtu=mtu, pci=f"0000:1{i}:00.0")
        T.rdma(root, f"mlx5_{i}", f"ibp{i}", pci=f"0000:1{i}:00.0")
    T.nvme_mount(root, KIMI.model.mount_path, fs=fs)
    T.model_cache(root, KIMI.model.mount_path, shards=96, shard_bytes=10)


def judge(root: Path, inv=None, probe=None, profile=KIMI):
    st = _sysfs.read_storage(root, profile.model.mount_path, profile.model.marker)
    checks = nodes.judge_node(profile, inv or good_inventory(), probe if probe is not None else good_probe(),
                              _sysfs.read_nics(root), _sysfs.read_rdma(root), st)
    return {c.name: c for c in checks}


def failed(checks) -> set[str]:
    return {n for n, c in checks.items() if c.status == "fail"}


# the profile's byte count cannot be met by a fake tree; judge against the shards only
KIMI_NOBYTES = KIMI.model_copy(update={"model": KIMI.model.model_copy(update={"weight_bytes": None})})


def test_healthy_node_passes(tmp_path):
    node_tree(tmp_path)
    assert failed(judge(tmp_path, profile=KIMI_NOBYTES)) == set()


def test_seven_gpus_fail_count_only(tmp_path):
    node_tree(tmp_path)
    assert failed(judge(tmp_path, inv=good_inventory(7), probe=good_probe(7), profile=KIMI_NOBYTES)) == {"gpu_count"}


def test_driver_575_fails_driver_only(tmp_path):
    node_tree(tmp_path)
    checks = judge(tmp_path, inv=good_inventory(driver="575.57.08"), profile=KIMI_NOBYTES)
    assert failed(checks) == {"driver"} and checks["driver"].observed == "575.57.08"


def test_ext4_cache_fails_fs_only(tmp_path):
    node_tree(tmp_path, fs="ext4")
    checks = judge(tmp_path, profile=KIMI_NOBYTES)
    assert failed(checks) == {"cache_fs"} and checks["cache_fs"].observed == "ext4"


def test_slow_card_fails_probe_only(tmp_path):
    node_tree(tmp_path)
    probe = good_probe()
    probe[5] = replace(probe[5], bf16_tflops=60.0)
    checks = judge(tmp_path, probe=probe, profile=KIMI_NOBYTES)
    assert failed(checks) == {"gpu_bf16_matmul"} and "[5]" in checks["gpu_bf16_matmul"].detail


def test_foreign_gpu_pod_fails_and_is_named():
    pods = [{"namespace": "gauntlet", "name": "sglang-0", "gpus": 8, "run": "uid-1"},
            {"namespace": "search", "name": "embedder-7f9c", "gpus": 1, "run": None}]
    c = nodes.judge_foreign_pods(pods, "uid-1", "h20-node-01")
    assert c.status == "fail" and c.observed == ["search/embedder-7f9c (1 GPU)"]
    assert nodes.judge_foreign_pods(pods[:1], "uid-1", "h20-node-01").status == "pass"
    # a pod of another gauntlet run is foreign too
    other = [{"namespace": "gauntlet", "name": "sglang-0", "gpus": 8, "run": "uid-0"}]
    assert nodes.judge_foreign_pods(other, "uid-1", "h20-node-01").status == "fail"


def inventory_of(root: Path, node: str) -> dict:
    st = _sysfs.read_storage(root, KIMI.model.mount_path, KIMI.model.marker)
    nics, rdma = _sysfs.read_nics(root), _sysfs.read_rdma(root)
    return {"node": node, "gpus": good_inventory().to_dict(), "nics": [asdict(n) for n in nics],
            "rdma": [asdict(p) for p in rdma], "socket_ifname": _sysfs.choose_socket_ifname(nics, rdma, None),
            "storage": st.to_dict()}


def test_mtu_mismatch_between_nodes_fails_mtu_only(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    node_tree(a, mtu=4096)
    node_tree(b, mtu=2044)
    checks = {c.name: c for c in nodes.compare_nodes([inventory_of(a, "n1"), inventory_of(b, "n2")])}
    assert failed(checks) == {"nodes_agree_mtu"}
    assert checks["nodes_agree_mtu"].observed == {"n1": [4096], "n2": [2044]}
    same = nodes.compare_nodes([inventory_of(a, "n1"), inventory_of(a, "n2")])
    assert all(c.status == "pass" for c in same)


def test_step_writes_inventory_and_fails_without_gpus(tmp_path, monkeypatch):
    """The real step on a machine without nvidia-smi: a verdict naming the missing GPUs, no traceback."""
    root = tmp_path / "root"
    node_tree(root)
    monkeypatch.setenv("PATH", str(tmp_path))          # no nvidia-smi
    out = tmp_path / "out"
    args = argparse.Namespace(profile="kimi-k3-h20", out=str(out), node="h20-node-01", run_id="uid-1",
                              root=str(root), cache_path=None, no_probe=True, no_api=True)
    assert run_step(nodes, args) == 1
    verdict = json.loads((out / "verdict.json").read_text())
    checks = {c["name"]: c for c in verdict["checks"]}
    assert checks["gpu_count"]["status"] == "fail" and checks["gpu_count"]["observed"] == 0
    assert checks["rdma_devices"]["status"] == "pass" and checks["cache_fs"]["status"] == "pass"
    assert checks["no_foreign_gpu_pods"]["status"] == "skip"
    inv = json.loads((out / "inventory.json").read_text())
    assert inv["node"] == "h20-node-01" and len(inv["rdma"]) == 4 and inv["socket_ifname"] == "ibp0"
    assert (out / "outputs" / "socket_ifname").read_text() == "ibp0"


def test_unknown_node_is_a_usage_error(tmp_path):
    args = argparse.Namespace(profile="kimi-k3-h20", out=str(tmp_path), node="elsewhere", run_id=None,
                              root=str(tmp_path), cache_path=None, no_probe=True, no_api=True)
    assert run_step(nodes, args) == 2
