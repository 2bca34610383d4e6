"""sysfs/procfs readers on fake trees built like a real node's, and their judgement."""

from __future__ import annotations

from pathlib import Path

from gauntlet.params import load_profile
from gauntlet.steps.cluster import sysfs as _sysfs
import sysfs_tree as T

KIMI = load_profile("kimi-k3-h20")


def by_name(checks):
    return {c.name: c for c in checks}


def test_nics_and_rdma_mapping(tmp_path: Path):
    T.nic(tmp_path, "lo", mtu=65536, state="unknown", physical=False, speed=None)
    T.nic(tmp_path, "eth0", mtu=1500, pci="0000:01:00.0")
    T.nic(tmp_path, "ibp23s0", mtu=4096, pci="0000:17:00.0")
    T.rdma(tmp_path, "mlx5_0", "ibp23s0", pci="0000:17:00.0")
    T.rdma(tmp_path, "mlx5_1", None, state="1: DOWN", pci="0000:18:00.0")
    nics = {n.name: n for n in _sysfs.read_nics(tmp_path)}
    assert nics["lo"].physical is False and nics["eth0"].physical is True
    assert nics["ibp23s0"].mtu == 4096 and nics["eth0"].speed_mbps == 100000
    ports = _sysfs.read_rdma(tmp_path)
    assert [(p.device, p.state, p.netdev) for p in ports] == [("mlx5_0", "ACTIVE", "ibp23s0"), ("mlx5_1", "DOWN", None)]
    assert ports[0].link_layer == "InfiniBand" and ports[0].phys_state == "LinkUp"
    assert _sysfs.choose_socket_ifname(list(nics.values()), ports, None) == "ibp23s0"
    assert _sysfs.choose_socket_ifname(list(nics.values()), [], None) == "eth0"
    assert _sysfs.choose_socket_ifname(list(nics.values()), ports, "bond0") == "bond0"


def test_network_judgement(tmp_path: Path):
    T.nic(tmp_path, "eth0")
    nics = _sysfs.read_nics(tmp_path)
    checks = by_name(_sysfs.judge_network(nics, [], KIMI.hardware))
    assert checks["rdma_devices"].status == "fail"            # the Kimi profile needs RDMA
    assert checks["socket_ifname"].status == "pass" and checks["socket_ifname"].observed == "eth0"
    one = by_name(_sysfs.judge_network(nics, [], load_profile("h200-1gpu").hardware))
    assert one["rdma_devices"].status == "skip"
    missing = by_name(_sysfs.judge_network(nics, [], KIMI.hardware, node_ifname="ens9"))
    assert missing["socket_ifname"].status == "fail" and "ens9" in missing["socket_ifname"].detail


def test_mtu_against_profile(tmp_path: Path):
    T.nic(tmp_path, "ib0", mtu=2044)
    T.rdma(tmp_path, "mlx5_0", "ib0")
    hw = KIMI.hardware.model_copy(update={"network": KIMI.hardware.network.model_copy(update={"mtu": 4096})})
    checks = by_name(_sysfs.judge_network(_sysfs.read_nics(tmp_path), _sysfs.read_rdma(tmp_path), hw))
    assert checks["mtu"].status == "fail" and checks["mtu"].observed == {"ib0": 2044}
    assert checks["rdma_devices"].status == "pass"


def test_mountinfo_parsing_and_longest_prefix():
    text = ("22 1 0:21 / / rw - overlay overlay rw\n"
            "30 22 259:1 /model-cache /models-nvme ro,relatime shared:1 master:2 - xfs /dev/nvme0n1p1 rw\n"
            "31 22 0:50 / /models\\040cfs rw - nfs4 cfs:/export rw\n")
    mounts = _sysfs.parse_mountinfo(text)
    assert mounts[1] == _sysfs.Mount("/models-nvme", "/model-cache", "xfs", "/dev/nvme0n1p1", "259:1", "ro,relatime")
    assert mounts[2].mount_point == "/models cfs"
    assert _sysfs.mount_for("/models-nvme/Kimi-K3/v1", mounts).fs_type == "xfs"
    assert _sysfs.mount_for("/models cfs/x", mounts).fs_type == "nfs4"
    assert _sysfs.mount_for("/models-nvmeX", mounts).fs_type == "overlay"   # a prefix of the name is not a parent


def test_block_device_through_partition_and_dm(tmp_path: Path):
    T.nvme_mount(tmp_path, "/data", majmin="259:1")
    dev = _sysfs.block_device(tmp_path, "259:1")
    assert dev == _sysfs.BlockDevice("nvme0n1p1", "nvme", ("nvme0n1",))
    # an LVM volume over an NVMe partition resolves to the NVMe disk
    dm = tmp_path / "sys/devices/virtual/block/dm-0"
    (dm / "slaves").mkdir(parents=True)
    (dm / "slaves" / "nvme0n1p1").symlink_to(tmp_path / "sys/dev/block/259:1")
    (tmp_path / "sys/dev/block/253:0").symlink_to(dm)
    assert _sysfs.block_device(tmp_path, "253:0").disks == ("nvme0n1",)
    assert _sysfs.block_device(tmp_path, "8:0") is None


def test_storage_read_and_judged(tmp_path: Path):
    m = KIMI.model
    T.nvme_mount(tmp_path, m.mount_path)
    T.model_cache(tmp_path, m.mount_path, shards=96, shard_bytes=10)
    st = _sysfs.read_storage(tmp_path, m.mount_path, m.marker)
    assert (st.exists, st.marker, st.shards, st.shard_bytes) == (True, True, 96, 960)
    checks = by_name(_sysfs.judge_storage(st, KIMI.hardware, m))
    assert checks["cache_fs"].status == checks["cache_device"].status == checks["cache_marker"].status == "pass"
    assert checks["cache_shards"].status == "pass"
    assert checks["cache_bytes"].status == "fail"          # 960 bytes is not the profile's 1.56 TB


def test_ext4_and_network_fs_fail(tmp_path: Path):
    m = KIMI.model
    T.nvme_mount(tmp_path, m.mount_path, fs="ext4")
    T.model_cache(tmp_path, m.mount_path, shards=96, marker=None)
    checks = by_name(_sysfs.judge_storage(_sysfs.read_storage(tmp_path, m.mount_path, m.marker), KIMI.hardware, m))
    assert checks["cache_fs"].status == "fail" and checks["cache_fs"].observed == "ext4"
    assert checks["cache_device"].status == "pass"
    assert checks["cache_marker"].status == "fail"
    nfs = tmp_path / "nfs"
    (nfs / "proc/self").mkdir(parents=True)
    (nfs / "proc/self/mountinfo").write_text(f"31 22 0:50 / {m.mount_path} ro - nfs4 cfs:/export rw\n")
    T.model_cache(nfs, m.mount_path, shards=96)
    c = by_name(_sysfs.judge_storage(_sysfs.read_storage(nfs, m.mount_path, m.marker), KIMI.hardware, m))
    assert c["cache_fs"].status == "fail" and c["cache_device"].status == "fail"
    assert "network or virtual" in c["cache_device"].detail


def test_missing_cache(tmp_path: Path):
    st = _sysfs.read_storage(tmp_path, "/nope", ".aik8s-complete")
    (c,) = _sysfs.judge_storage(st, KIMI.hardware, KIMI.model)
    assert c.name == "cache_present" and c.status == "fail"
