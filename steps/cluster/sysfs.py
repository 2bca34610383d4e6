"""NICs, RDMA devices and storage as the kernel reports them, and their pure judgement.

Every reader takes ``root`` (``/`` on a node; a fake tree built in ``tmp_path`` in
tests) and reads ``root/sys/class/net``, ``root/sys/class/infiniband``,
``root/proc/self/mountinfo`` and ``root/sys/dev/block``. The judges take the
dataclasses they return and the profile's :class:`gauntlet.params.models.Hardware`.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gauntlet.params.models import Hardware, ModelSpec
from gauntlet.contract import Check

__all__ = [
    "Nic", "RdmaPort", "Mount", "BlockDevice", "Storage",
    "read_nics", "read_rdma", "parse_mountinfo", "mount_for", "block_device", "read_storage",
    "choose_socket_ifname", "judge_network", "judge_storage",
]


def _read(p: Path) -> str | None:
    try:
        return p.read_text().strip()
    except OSError:  # sysfs answers EINVAL for e.g. the speed of a down link
        return None


@dataclass(frozen=True)
class Nic:
    name: str
    operstate: str | None
    mtu: int | None
    address: str | None = None
    speed_mbps: int | None = None
    physical: bool = False            # backed by a device (not lo, veth, bridges)
    ipv4: tuple[str, ...] = ()


@dataclass(frozen=True)
class RdmaPort:
    device: str                       # e.g. mlx5_0
    port: int
    state: str | None                 # ACTIVE, DOWN, ...
    phys_state: str | None            # LinkUp, Disabled, ...
    link_layer: str | None            # InfiniBand or Ethernet (RoCE)
    rate: str | None
    netdev: str | None                # the netdev this device maps to, if any


def read_nics(root: Path = Path("/")) -> list[Nic]:
    base = Path(root) / "sys/class/net"
    out = []
    for d in sorted(base.iterdir()) if base.is_dir() else []:
        speed = _read(d / "speed")
        out.append(Nic(
            name=d.name, operstate=_read(d / "operstate"),
            mtu=int(m) if (m := _read(d / "mtu")) and m.isdigit() else None,
            address=_read(d / "address"),
            speed_mbps=int(speed) if speed and speed.lstrip("-").isdigit() and int(speed) > 0 else None,
            physical=(d / "device").exists()))
    return out


def _state(text: str | None) -> str | None:
    """'4: ACTIVE' -> 'ACTIVE'."""
    return text.split(":", 1)[1].strip() if text and ":" in text else text


def read_rdma(root: Path = Path("/")) -> list[RdmaPort]:
    base = Path(root) / "sys/class/infiniband"
    out = []
    for dev in sorted(base.iterdir()) if base.is_dir() else []:
        netdevs = sorted(p.name for p in (dev / "device" / "net").iterdir()) if (dev / "device" / "net").is_dir() \
            else []
        for port in sorted((dev / "ports").iterdir(), key=lambda p: int(p.name)) if (dev / "ports").is_dir() else []:
            nd = _read(port / "gid_attrs" / "ndevs" / "0") or (netdevs[0] if netdevs else None)
            out.append(RdmaPort(dev.name, int(port.name), _state(_read(port / "state")),
                                _state(_read(port / "phys_state")), _read(port / "link_layer"),
                                _read(port / "rate"), nd))
    return out


def choose_socket_ifname(nics: list[Nic], rdma: list[RdmaPort], configured: str | None) -> str | None:
    """NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME: the profile's, else the first active RDMA port's netdev,
    else the first physical interface that is up."""
    if configured:
        return configured
    for p in rdma:
        if p.state == "ACTIVE" and p.netdev:
            return p.netdev
    up = [n for n in nics if n.physical and n.operstate == "up"]
    return up[0].name if up else None


def judge_network(nics: list[Nic], rdma: list[RdmaPort], hw: Hardware, node_ifname: str | None = None) -> list[Check]:
    """RDMA present and active, links up, MTU as the profile says, the chosen interface exists and is up."""
    net = hw.network
    checks = []
    active = [p for p in rdma if p.state == "ACTIVE" and p.phys_state in (None, "LinkUp")]
    ports = {f"{p.device}/{p.port}": {"state": p.state, "netdev": p.netdev, "link_layer": p.link_layer}
             for p in rdma}
    if net.rdma_required:
        want = net.rdma_devices_min or 1
        checks.append(Check("rdma_devices", "pass" if len(active) >= want else "fail", f">= {want} ACTIVE",
                            ports, f"{len(active)} active RDMA port(s)" if len(active) >= want else
                            f"{len(active)} active RDMA port(s) of {len(rdma)} under /sys/class/infiniband, "
                            f"want {want}: check the RDMA device plugin / host networking"))
    elif rdma:
        checks.append(Check("rdma_devices", "pass", "optional", ports, f"{len(active)} active RDMA port(s)"))
    else:
        checks.append(Check("rdma_devices", "skip", "optional", {}, "no RDMA devices; the profile does not need them"))
    by_name = {n.name: n for n in nics}
    ifname = choose_socket_ifname(nics, rdma, node_ifname or net.socket_ifname)
    nic = by_name.get(ifname or "")
    checks.append(Check("socket_ifname", "pass" if nic and nic.operstate in ("up", "unknown") else "fail",
                        "an interface that is up", ifname,
                        f"NCCL/GLOO socket interface {ifname} is {nic.operstate}" if nic
                        else f"socket interface {ifname!r} not found among {sorted(by_name)}"))
    rdma_nics = sorted({p.netdev for p in active if p.netdev})
    down = [n for n in rdma_nics if n in by_name and by_name[n].operstate not in ("up", "unknown")]
    if rdma_nics:
        checks.append(Check("rdma_links", "fail" if down else "pass", "up", {n: by_name[n].operstate
                            for n in rdma_nics if n in by_name}, f"RDMA netdevs {down} are not up" if down
                            else "RDMA netdevs up"))
    if net.mtu is not None:
        look = rdma_nics or ([ifname] if ifname else [])
        bad = {n: by_name[n].mtu for n in look if n in by_name and by_name[n].mtu != net.mtu}
        checks.append(Check("mtu", "fail" if bad else "pass", net.mtu, {n: by_name[n].mtu for n in look
                            if n in by_name}, f"MTU differs from {net.mtu}: {bad}" if bad else f"MTU {net.mtu}"))
    return checks


@dataclass(frozen=True)
class Mount:
    mount_point: str
    root: str
    fs_type: str
    source: str
    major_minor: str
    options: str = ""


def _unescape(s: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)


def parse_mountinfo(text: str) -> list[Mount]:
    """proc(5) mountinfo lines: ``id parent maj:min root mountpoint opts [optional...] - fstype source superopts``."""
    out = []
    for ln in text.splitlines():
        if " - " not in ln:
            continue
        left, right = ln.split(" - ", 1)
        a, b = left.split(), right.split()
        if len(a) < 6 or len(b) < 2:
            continue
        out.append(Mount(_unescape(a[4]), _unescape(a[3]), b[0], _unescape(b[1]), a[2], a[5]))
    return out


def mount_for(path: str, mounts: list[Mount]) -> Mount | None:
    """The mount a path lives on: the longest mount point that is a prefix of it (the last one mounted wins)."""
    path = os.path.normpath(path)
    best = None
    for m in mounts:
        mp = os.path.normpath(m.mount_point)
        if path == mp or path.startswith(mp.rstrip("/") + "/"):
            if best is None or len(mp) >= len(os.path.normpath(best.mount_point)):
                best = m
    return best


@dataclass(frozen=True)
class BlockDevice:
    name: str                                   # nvme0n1p1, dm-0, sda
    kind: str                                   # nvme, sata/scsi, virtio, unknown
    disks: tuple[str, ...] = ()                 # the whole disks underneath (through partitions, dm, md)


def _disk_kind(sys_path: str, name: str) -> str:
    if "/nvme/" in sys_path or name.startswith("nvme"):
        return "nvme"
    if "/virtio" in sys_path or name.startswith("vd"):
        return "virtio"
    if name.startswith("sd"):
        return "sata/scsi"
    return "unknown"


def block_device(root: Path, major_minor: str) -> BlockDevice | None:
    """Resolve ``/sys/dev/block/<maj:min>`` to the disks under it (through partitions and dm/md slaves)."""
    link = Path(root) / "sys/dev/block" / major_minor
    if not link.exists():
        return None
    real = link.resolve()

    def disks_of(p: Path, depth: int = 0) -> list[tuple[str, str]]:
        if depth > 8:
            return []
        slaves = p / "slaves"
        if slaves.is_dir() and any(slaves.iterdir()):
            out: list[tuple[str, str]] = []
            for s in sorted(slaves.iterdir()):
                out += disks_of(s.resolve(), depth + 1)
            return out
        disk = p.parent if (p / "partition").exists() else p
        return [(disk.name, _disk_kind(str(disk), disk.name))]
    found = disks_of(real)
    kinds = {k for _, k in found}
    return BlockDevice(real.name, kinds.pop() if len(kinds) == 1 else "mixed:" + ",".join(sorted(kinds)),
                       tuple(sorted({d for d, _ in found})))


@dataclass(frozen=True)
class Storage:
    path: str
    exists: bool
    mount: Mount | None = None
    device: BlockDevice | None = None
    marker: bool = False
    shards: int = 0
    shard_bytes: int = 0
    names: tuple[str, ...] = field(default=(), repr=False)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("names")
        return d


def read_storage(root: Path, cache_path: str, marker: str) -> Storage:
    """Where the model cache lives (mount, fs, disks) and what it holds (marker, shards, bytes)."""
    root = Path(root)
    p = root / cache_path.lstrip("/")
    mi = _read(root / "proc/self/mountinfo") or ""
    m = mount_for(cache_path, parse_mountinfo(mi))
    dev = block_device(root, m.major_minor) if m else None
    if not p.is_dir():
        return Storage(cache_path, False, m, dev)
    shards = sorted(x for x in p.iterdir() if x.suffix == ".safetensors" and x.is_file())
    return Storage(cache_path, True, m, dev, (p / marker).exists(), len(shards),
                   sum(x.stat().st_size for x in shards), tuple(x.name for x in shards))


def judge_storage(st: Storage, hw: Hardware, model: ModelSpec) -> list[Check]:
    """Cache on the profile's fs type and on NVMe (never a network fs), complete, with the profile's shards/bytes."""
    s = hw.storage
    if not st.exists:
        return [Check("cache_present", "fail", st.path, None,
                      f"{st.path} does not exist on this node: run the prewarm gate first")]
    checks = []
    fs = st.mount.fs_type if st.mount else None
    if s.fs_type != "any":
        checks.append(Check("cache_fs", "pass" if fs == s.fs_type else "fail", s.fs_type, fs,
                            f"{st.path} is on {fs} ({st.mount.source if st.mount else '?'}), not {s.fs_type}"
                            if fs != s.fs_type else f"{st.path} on {fs}"))
    if s.device_kind != "any":
        kind = st.device.kind if st.device else None
        checks.append(Check("cache_device", "pass" if kind == s.device_kind else "fail", s.device_kind,
                            {"kind": kind, "disks": list(st.device.disks) if st.device else []},
                            f"{st.path} is on {kind or 'no block device (network or virtual fs)'}, "
                            f"not {s.device_kind}" if kind != s.device_kind else f"on {', '.join(st.device.disks if st.device else [])}"))
    checks.append(Check("cache_marker", "pass" if st.marker else "fail", model.marker, st.marker,
                        "completion marker present" if st.marker else
                        f"{model.marker} missing in {st.path}: the copy is incomplete; rerun prewarm"))
    if model.shards is not None:
        checks.append(Check.compare("cache_shards", model.shards, st.shards))
    if model.weight_bytes is not None:
        checks.append(Check.compare("cache_bytes", model.weight_bytes, st.shard_bytes))
    return checks
