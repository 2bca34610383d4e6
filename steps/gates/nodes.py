"""Gate 1, per node: GPUs, GPU health, NICs/RDMA, model cache storage, and no foreign GPU work.

Runs pinned to one node (host network, so sysfs shows the host's NICs). Collects
everything first (I/O), judges it with the pure functions of :mod:`gauntlet.steps.cluster.gpu`
and :mod:`gauntlet.steps.cluster.sysfs`, and writes ``inventory.json`` beside the verdict: the
network gate compares the nodes' inventories (MTU, RDMA device set, shards, bytes).
"""

from __future__ import annotations

import os
import socket
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gauntlet.contract import Check, UsageError, write_json_atomic
from gauntlet.params.models import Profile
from gauntlet.steps.gate import Needs
from gauntlet.steps.cluster import fabric as _fabric
from gauntlet.steps.cluster import gpu as _gpu
from gauntlet.steps.cluster import sysfs as _sysfs
from gauntlet.steps.options import GateOptions, option

NAME = "nodes"
HELP = "Gate 1 per node: GPU inventory and health probe, NICs/RDMA, NVMe model cache, no foreign GPU pods"
NEEDS = Needs(model_cache="read", node_gpus=True, transient=False, api="nodes", image="bench", host_network=True,
              per_node=True)

__all__ = ["NAME", "HELP", "NEEDS", "Options", "run", "judge_foreign_pods", "judge_node", "compare_nodes"]


@dataclass(frozen=True, kw_only=True)
class Options(GateOptions):
    node: str | None = option(None, help="Kubernetes node name (default: $NODE_NAME, else the hostname)")
    run_id: str | None = option(None, help="this run's id (default: $GAUNTLET_RUN_ID)")
    root: str = option("/", help="filesystem root holding sys/ and proc/ (default: /)")
    cache_path: str | None = option(None, help="model cache path to inspect (default: the profile's mount_path if "
                                               "present, else host path)")
    no_probe: bool = option(False, help="skip the torch GPU health probe")
    no_api: bool = option(False, help="skip the Kubernetes pod check (reported as skipped): e.g. on a lone GPU "
                                      "machine")

    def __post_init__(self) -> None:
        super().__post_init__()
        profile = self.the_profile
        known = [n.name for n in profile.hardware.nodes]
        if known and self.node_name not in known:
            raise UsageError(f"--node {self.node_name}: not a node of profile {profile.name} (has {', '.join(known)})")

    @property
    def node_name(self) -> str:
        return self.node or os.environ.get("NODE_NAME") or socket.gethostname()


def judge_foreign_pods(pods: list[dict[str, Any]], run_id: str | None, node: str) -> Check:
    """Pods asking for GPUs on this node that are not this run's: reported by name, never touched."""
    foreign = [p for p in pods if run_id is None or p.get("run") != run_id]
    names = [f"{p['namespace']}/{p['name']} ({p['gpus']} GPU)" for p in foreign]
    return Check("no_foreign_gpu_pods", "fail" if foreign else "pass", [], names,
                 f"other GPU work on {node}: {', '.join(names)}; free the node (gauntlet leaves them alone)"
                 if foreign else f"no pod outside this run requests nvidia.com/gpu on {node}")


def judge_node(profile: Profile, inv: _gpu.GpuInventory, probe: list[_gpu.ProbeResult] | None,
               nics: list[_sysfs.Nic], rdma: list[_sysfs.RdmaPort], storage: _sysfs.Storage,
               nvml: _gpu.GpuInventory | None = None, node_ifname: str | None = None) -> list[Check]:
    """Every per-node check, pure over what was collected."""
    hw = profile.hardware
    checks = _gpu.judge_inventory(inv, hw, nvml)
    if probe is not None:
        checks += _gpu.judge_probe(probe, hw.gpu_probe)
    checks += _sysfs.judge_network(nics, rdma, hw, node_ifname)
    checks += _sysfs.judge_storage(storage, hw, profile.model)
    return checks


def compare_nodes(inventories: list[dict[str, Any]]) -> list[Check]:
    """Both (all) nodes must agree: GPU count and model, driver, RDMA device set, MTU of the RDMA/socket
    interfaces, and the cache's shard count and bytes. Input: each node's ``inventory.json``."""
    if len(inventories) < 2:
        return [Check("nodes_agree", "skip", None, len(inventories), "fewer than two node inventories to compare")]

    def facts(inv: dict[str, Any]) -> dict[str, Any]:
        gpus = inv.get("gpus", {}).get("gpus", [])
        active = [p for p in inv.get("rdma", []) if p.get("state") == "ACTIVE"]
        look = sorted({p["netdev"] for p in active if p.get("netdev")} or {inv.get("socket_ifname")} - {None})
        mtus = {n["name"]: n["mtu"] for n in inv.get("nics", [])}
        st = inv.get("storage", {})
        return {
            "gpus": (len(gpus), sorted({g.get("name") for g in gpus})),
            "driver": inv.get("gpus", {}).get("driver"),
            "rdma_devices": sorted(f"{p['device']}/{p['port']}" for p in active),
            "mtu": sorted({mtus.get(n) for n in look}, key=str),
            "cache": (st.get("shards"), st.get("shard_bytes"), st.get("marker")),
        }
    per = {inv.get("node", f"node-{i}"): facts(inv) for i, inv in enumerate(inventories)}
    checks = []
    for key, label in (("gpus", "GPU count and model"), ("driver", "driver"), ("rdma_devices", "RDMA device set"),
                       ("mtu", "MTU"), ("cache", "cache shards, bytes, marker")):
        seen = {n: f[key] for n, f in per.items()}
        same = len({repr(v) for v in seen.values()}) == 1
        checks.append(Check(f"nodes_agree_{key}", "pass" if same else "fail", "identical on every node", seen,
                            f"{label} identical on {len(seen)} nodes" if same else f"nodes differ in {label}: {seen}"))
    return checks


def _cache_path(profile: Profile, given: str | None, root: Path) -> str:
    if given:
        return given
    m = profile.model
    return m.mount_path if (root / m.mount_path.lstrip("/")).is_dir() else m.host_cache_path


def run(opts: Options, out: Path) -> tuple[list[Check], dict[str, Any]]:
    profile = opts.the_profile
    node = opts.node_name
    known = {n.name: n for n in profile.hardware.nodes}
    root = Path(opts.root)
    raw: dict[str, str] = {}
    try:
        inv = _gpu.collect_inventory(raw)
    except (RuntimeError, OSError) as exc:
        inv = _gpu.GpuInventory((), source=f"none: {exc}")
    nvml = _gpu.inventory_from_nvml()
    for name, text in raw.items():
        (out / name).write_text(text)
    probe = None if opts.no_probe else _gpu.probe_gpus(profile.hardware.gpu_probe)
    nics, rdma = _sysfs.read_nics(root), _sysfs.read_rdma(root)
    storage = _sysfs.read_storage(root, _cache_path(profile, opts.cache_path, root), profile.marker_name)
    ifname = known[node].rdma_ifname if node in known else None
    checks = judge_node(profile, inv, probe, nics, rdma, storage, nvml, ifname)

    run_id = opts.run_id or os.environ.get("GAUNTLET_RUN_ID")
    pods: list[dict[str, Any]] | None = None
    if opts.no_api:
        checks.append(Check("no_foreign_gpu_pods", "skip", [], None, "--no-api: the Kubernetes pod list was not read"))
    else:
        from gauntlet.steps.backends import backend_for, require
        from gauntlet.steps.backends.protocol import ClusterInspector
        inspector = require(backend_for(profile), ClusterInspector, "nodes: the GPU pod check (--no-api skips it)")
        pods = inspector.node_gpu_pods(node)
        checks.append(judge_foreign_pods(pods, run_id, node))

    socket_if = _sysfs.choose_socket_ifname(nics, rdma, ifname or profile.hardware.network.socket_ifname)
    roce = [p for p in rdma if p.state == "ACTIVE" and p.link_layer == "Ethernet"]
    gid = _fabric.roce_v2_gid_index(root, roce[0].device, roce[0].port) if roce else None
    nccl_env = _fabric.node_env(profile, socket_if, [asdict(p) for p in rdma], gid)
    inventory = {
        "node": node, "gpus": inv.to_dict(), "nvml": nvml.to_dict() if nvml else None,
        "probe": [asdict(p) for p in probe] if probe is not None else None,
        "nics": [asdict(n) for n in nics], "rdma": [asdict(p) for p in rdma],
        "socket_ifname": socket_if, "roce_v2_gid_index": gid, "nccl_env": nccl_env,
        "storage": storage.to_dict(), "gpu_pods": pods,
    }
    write_json_atomic(out / "inventory.json", inventory)
    ok = [p for p in probe or [] if not p.error]
    metrics = {
        "node": node, "gpu_count": len(inv.gpus), "driver": inv.driver, "cuda": inv.cuda,
        "socket_ifname": socket_if,
        "copy_tbps_min": min((p.copy_tbps for p in ok if p.copy_tbps is not None), default=None),
        "bf16_tflops_min": min((p.bf16_tflops for p in ok if p.bf16_tflops is not None), default=None),
        "nccl_env": nccl_env,
        "outputs": {"socket_ifname": socket_if or "", "nccl_env": _fabric.encode(nccl_env)},
    }
    return checks, metrics
