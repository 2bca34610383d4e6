"""Builders for a fake /sys and /proc tree under tmp_path, shaped like a real node's."""

from __future__ import annotations

import os
from pathlib import Path


def nic(root: Path, name: str, mtu: int = 1500, state: str = "up", physical: bool = True,
        speed: int | None = 100000, pci: str = "0000:17:00.0") -> None:
    d = root / "sys/class/net" / name
    d.mkdir(parents=True)
    (d / "mtu").write_text(f"{mtu}\n")
    (d / "operstate").write_text(f"{state}\n")
    (d / "address").write_text("02:00:00:00:00:01\n")
    if speed is not None:
        (d / "speed").write_text(f"{speed}\n")
    if physical:
        dev = root / "sys/devices/pci0000:00" / pci
        dev.mkdir(parents=True, exist_ok=True)
        os.symlink(dev, d / "device")


def rdma(root: Path, dev: str, netdev: str | None, state: str = "4: ACTIVE", layer: str = "InfiniBand",
         pci: str = "0000:17:00.0") -> None:
    d = root / "sys/class/infiniband" / dev
    p = d / "ports" / "1"
    p.mkdir(parents=True)
    (p / "state").write_text(f"{state}\n")
    (p / "phys_state").write_text("5: LinkUp\n" if "ACTIVE" in state else "3: Disabled\n")
    (p / "link_layer").write_text(f"{layer}\n")
    (p / "rate").write_text("400 Gb/sec (4X NDR)\n")
    pcidev = root / "sys/devices/pci0000:00" / pci
    (pcidev / "net").mkdir(parents=True, exist_ok=True)
    if netdev:
        (pcidev / "net" / netdev).mkdir(exist_ok=True)
    os.symlink(pcidev, d / "device")


def nvme_mount(root: Path, mount_point: str, fs: str = "xfs", majmin: str = "259:1", disk: str = "nvme0n1",
               partition: str | None = "nvme0n1p1", source: str | None = None) -> None:
    """A mountinfo line for `mount_point` on fs, and /sys/dev/block/<majmin> pointing at an NVMe partition."""
    (root / "proc/self").mkdir(parents=True, exist_ok=True)
    mi = root / "proc/self/mountinfo"
    prev = mi.read_text() if mi.exists() else "22 1 0:21 / / rw,relatime - overlay overlay rw\n"
    src = source or f"/dev/{partition or disk}"
    mi.write_text(prev + f"1{len(prev) % 97} 22 {majmin} / {mount_point} ro,relatime shared:1 - {fs} {src} rw\n")
    base = root / "sys/devices/pci0000:00/0000:04:00.0/nvme/nvme0" / disk
    target = base / partition if partition else base
    target.mkdir(parents=True, exist_ok=True)
    if partition:
        (target / "partition").write_text("1\n")
    (root / "sys/dev/block").mkdir(parents=True, exist_ok=True)
    os.symlink(target, root / "sys/dev/block" / majmin)


def model_cache(root: Path, path: str, shards: int, shard_bytes: int = 1024, marker: str | None = ".aik8s-complete"):
    d = root / path.lstrip("/")
    d.mkdir(parents=True, exist_ok=True)
    for i in range(shards):
        with open(d / f"model-{i + 1:05d}-of-{shards:05d}.safetensors", "wb") as fh:
            fh.truncate(shard_bytes)
    if marker:
        (d / marker).write_text("ok\n")
    return d
