"""NCCL's and Gloo's fabric settings for each node: the profile's where it sets them, else what Gate 1 found.

``nodes`` resolves one node's env (:func:`node_env`) and writes it as its ``nccl_env`` output (a flat JSON
object); ``network`` gets every node's as ``--nccl-env NODE=JSON`` and passes them on as its own
``nccl_env`` output (``{node: env}``), which ``deploy`` gets as ``--nccl-env``. The engine and probe pods
export them by node name (:mod:`gauntlet.steps.backends.kubernetes.manifests`).

Keys, as NCCL reads them: ``NCCL_SOCKET_IFNAME`` and ``GLOO_SOCKET_IFNAME`` (the bootstrap/socket interface),
``NCCL_IB_HCA`` (``=dev:port,...``: ``=`` matches the names exactly, so mlx5_1 does not also take mlx5_10),
``NCCL_IB_GID_INDEX`` (RoCE only; unset, NCCL 2.28 picks a RoCE v2 GID itself: net_ib.cc ncclIbGetGidIndex).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gauntlet.contract import UsageError
from gauntlet.params.models import Profile

__all__ = ["ENV_KEYS", "socket_env", "fabric_env", "roce_v2_gid_index", "detected_hca", "node_env", "parse_node_envs",
           "encode"]

ENV_KEYS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX")


def _read(p: Path) -> str | None:
    try:
        return p.read_text().strip()
    except OSError:        # sysfs answers EINVAL for an unused GID slot
        return None


def roce_v2_gid_index(root: Path, device: str, port: int, limit: int = 256) -> int | None:
    """The first GID of a RoCE port whose type is RoCE v2 and whose address is an IPv4-mapped one
    (``0000:...:ffff:0a00:0001``): what NCCL_IB_GID_INDEX should name on a routed RoCE fabric; None otherwise."""
    base = Path(root) / "sys/class/infiniband" / device / "ports" / str(port)
    for i in range(limit):
        kind = _read(base / "gid_attrs" / "types" / str(i))
        if kind is None and not (base / "gids" / str(i)).exists():
            break
        gid = (_read(base / "gids" / str(i)) or "").lower()
        if kind == "RoCE v2" and gid.startswith("0000:0000:0000:0000:0000:ffff:"):
            return i
    return None


def detected_hca(rdma: list[dict[str, Any]]) -> str | None:
    """NCCL_IB_HCA for the ACTIVE ports of an inventory's ``rdma`` list: ``=mlx5_0:1,mlx5_1:1``."""
    ports = [f"{p['device']}:{p['port']}" for p in rdma if p.get("state") == "ACTIVE"]
    return "=" + ",".join(ports) if ports else None


def node_env(profile: Profile, socket_ifname: str | None, rdma: list[dict[str, Any]],
             gid_index: int | None) -> dict[str, str]:
    """One node's settings: the profile's ``hardware.network.socket_ifname`` / ``hardware.fabric`` where set,
    else what was found there; a key with neither is left out (NCCL's default)."""
    fab = profile.hardware.fabric
    ifname = profile.hardware.network.socket_ifname or socket_ifname
    hca = fab.ib_hca or detected_hca(rdma)
    gid = fab.ib_gid_index if fab.ib_gid_index is not None else gid_index
    env = {"NCCL_SOCKET_IFNAME": ifname, "GLOO_SOCKET_IFNAME": ifname, "NCCL_IB_HCA": hca,
           "NCCL_IB_GID_INDEX": None if gid is None else str(gid)}
    return {k: v for k, v in env.items() if v}


def encode(env: dict[str, Any]) -> str:
    """Compact JSON, keys sorted: what an output parameter carries."""
    return json.dumps(env, sort_keys=True, separators=(",", ":"))


def _env_of(flag: str, text: str) -> dict[str, str]:
    if not text.strip():
        return {}           # the output's default: the step wrote none (a stand-in, an older step image)
    try:
        env = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{flag}: not JSON ({exc.msg} at character {exc.pos}): {text[:80]!r}") from None
    if not isinstance(env, dict) or not all(isinstance(k, str) and k in ENV_KEYS and isinstance(v, str)
                                            for k, v in env.items()):
        raise UsageError(f"{flag}: expected an object of {', '.join(ENV_KEYS)} -> text, got {text[:80]!r}")
    return env


def parse_node_envs(values: tuple[str, ...] | None, profile: Profile, flag: str = "--nccl-env") -> dict[str, dict[str, str]]:
    """``NODE=JSON`` words (network's input) or one ``{node: env}`` JSON word (deploy's) -> ``{node: env}``;
    UsageError, one line naming the flag, for anything else or a node the profile does not have."""
    nodes = [n.name for n in profile.hardware.nodes]
    out: dict[str, dict[str, str]] = {}
    for word in values or ():
        if word.lstrip().startswith("{") or not word.strip():
            try:
                whole = json.loads(word) if word.strip() else {}
            except json.JSONDecodeError as exc:
                raise UsageError(f"{flag}: not JSON ({exc.msg} at character {exc.pos}): {word[:80]!r}") from None
            if not isinstance(whole, dict):
                raise UsageError(f"{flag}: expected an object of node -> env, got {word[:80]!r}")
            pairs = [(k, encode(v) if isinstance(v, dict) else str(v)) for k, v in whole.items()]
        else:
            node, sep, text = word.partition("=")
            if not sep:
                raise UsageError(f"{flag}: expected NODE=JSON, got {word[:80]!r}")
            pairs = [(node, text)]
        for node, text in pairs:
            if node not in nodes:
                raise UsageError(f"{flag}: {node[:63]!r} is not a node of profile {profile.name} "
                                 f"(has {', '.join(nodes) or 'none'})")
            out[node] = _env_of(f"{flag} {node}", text)
    return out


def socket_env(profile: Profile) -> dict[str, str]:
    """NCCL/GLOO socket interface when the profile fixes one for every node."""
    ifn = profile.hardware.network.socket_ifname
    return {"NCCL_SOCKET_IFNAME": ifn, "GLOO_SOCKET_IFNAME": ifn} if ifn else {}


def fabric_env(profile: Profile) -> dict[str, str]:
    """What the profile fixes for every node: the socket interface, NCCL_IB_HCA, NCCL_IB_GID_INDEX."""
    fab = profile.hardware.fabric
    return {**socket_env(profile), **({"NCCL_IB_HCA": fab.ib_hca} if fab.ib_hca else {}),
            **({"NCCL_IB_GID_INDEX": str(fab.ib_gid_index)} if fab.ib_gid_index is not None else {})}
