"""What NCCL says it did, read from its own ``NCCL_DEBUG=INFO`` lines: the network each rank chose and why, and
the transport of every channel it connected (between nodes: NET/IB, with GPUDirect RDMA or not, or NET/Socket;
within a node: P2P/CUMEM, P2P/IPC, P2P/direct, SHM).

The formats are NCCL's (v2.28.9-1, the version the H200 run printed; tests/fixtures/nccl/README.md):

* every line: ``host:pid:tid [cudaDev] NCCL INFO msg`` (src/debug.cc 349, 363); WARN lines add ``file:line``
  and may start with a ``[timestamp]``;
* ``<func> comm %p rank %d nranks %d cudaDev %d nvmlDev %d ... - Init START`` (src/init.cc 1561/1574): which
  rank a process is;
* ``Using network %s`` (src/init.cc 428); ``NET/IB : No device found.`` and ``NET/IB : Using [0]mlx5_0:1/RoCE
  ...; OOB eth0:...`` (src/transport/net_ib.cc 826, 839); ``NET/Socket : Using [0]eth0:10.0.0.1<0>``
  (src/transport/net_socket.cc 76); ``Failed to initialize NET plugin %s`` (src/plugin/net.cc 225);
* channels: ``Channel %02d/%d : %d[%d] -> %d[%d] [send|receive] via NET/%s/%d[(proxy)][/GDRDMA][(PCI)][/Shared]``
  (src/transport/net.cc 313, 317, 359), ``Channel %02d/%01d : %d[%d] -> %d[%d] via P2P/...``
  (src/transport/p2p.cc 386-406), ``Channel %02d : %d[%d] -> %d[%d] via SHM/%s/%s`` (src/transport/shm.cc 128).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Link", "NcclLog", "parse", "rank_summary"]

_LINE = re.compile(r"(?P<host>[\w.-]+):(?P<pid>\d+):\d+ \[\d+\] (?:\S+:\d+ )?NCCL (?P<level>INFO|WARN) (?P<msg>.*?)\s*$")
_INIT = re.compile(r" comm 0x[0-9a-f]+ rank (?P<rank>\d+) nranks (?P<n>\d+) .*Init START")
_CHANNEL = re.compile(r"^Channel (?P<ch>\d+)(?:/\d+)? : (?P<src>\d+)\[\d+\] -> (?P<dst>\d+)\[\d+\]"
                      r"(?: \[(?P<dir>send|receive)\])? via (?P<via>\S.*)$")
_NETWORK = re.compile(r"^Using network (?P<net>\S+)")
_SOCKET = re.compile(r"^NET/Socket : Using (?P<ifs>.+)$")
_IB_WHY = re.compile(r"^(NET/IB : No device found\.|Failed to initialize NET plugin IB|NET/IB : Using .*)$")


@dataclass(frozen=True)
class Link:
    """One connection NCCL set up: ``src`` -> ``dst`` on a channel, the transport it printed."""

    channel: int
    src: int
    dst: int
    transport: str          # NET/IB, NET/Socket, P2P/CUMEM, P2P/IPC, P2P/direct, P2P/indirect, SHM ...
    gdr: bool               # NET with /GDRDMA: the NIC reads and writes GPU memory directly
    rank: int               # the rank whose process printed it (the receiver for a [receive] line)
    line: str
    host: str = ""          # the host of the process that printed it

    @property
    def label(self) -> str:
        return f"{self.transport}/GDRDMA" if self.gdr else self.transport

    @property
    def net(self) -> bool:
        return self.transport.startswith("NET/")


@dataclass
class NcclLog:
    """Everything the lines said, keyed by process (``host:pid``) where a process printed it."""

    links: list[Link] = field(default_factory=list)
    ranks: dict[str, int] = field(default_factory=dict)          # host:pid -> rank
    hosts: dict[int, str] = field(default_factory=dict)          # rank -> host
    networks: dict[str, str] = field(default_factory=dict)       # host:pid -> IB / Socket / a plugin's name
    socket_ifs: dict[str, str] = field(default_factory=dict)     # host:pid -> "[0]eth0:192.0.2.2<0>"
    ib_lines: dict[str, list[str]] = field(default_factory=dict)  # host:pid -> NET/IB's own lines
    warnings: list[str] = field(default_factory=list)

    def inter(self, link: Link) -> bool:
        """Between nodes: the two ranks' hosts differ where both are known, else a NET transport."""
        a, b = self.hosts.get(link.src), self.hosts.get(link.dst)
        return a != b if a is not None and b is not None else link.net


def _transport(via: str) -> tuple[str, bool]:
    parts = via.split("/")
    if parts[0] == "NET" and len(parts) > 1:
        return f"NET/{parts[1]}", "/GDRDMA" in via
    if parts[0] == "P2P" and len(parts) > 1:
        return f"P2P/{parts[1].split()[0]}", False
    return parts[0], False


def parse(log: str) -> NcclLog:
    """Every NCCL INFO/WARN line of ``log`` (several processes' lines interleaved, other output around them)."""
    out = NcclLog()
    pending: list[tuple[str, re.Match[str], str]] = []
    for raw in log.splitlines():
        m = _LINE.search(raw)
        if not m:
            continue
        proc, msg = f"{m['host']}:{m['pid']}", m["msg"]
        if m["level"] == "WARN":
            out.warnings.append(msg)
        elif init := _INIT.search(msg):
            out.ranks[proc] = int(init["rank"])
            out.hosts[int(init["rank"])] = m["host"]
        elif ch := _CHANNEL.match(msg):
            pending.append((proc, ch, msg))
        elif net := _NETWORK.match(msg):
            out.networks[proc] = net["net"]
        elif sock := _SOCKET.match(msg):
            out.socket_ifs[proc] = sock["ifs"]
        elif _IB_WHY.match(msg):
            out.ib_lines.setdefault(proc, []).append(msg)
    for proc, ch, msg in pending:
        transport, gdr = _transport(ch["via"])
        src, dst = int(ch["src"]), int(ch["dst"])
        out.links.append(Link(int(ch["ch"]), src, dst, transport, gdr, dst if ch["dir"] == "receive" else src, msg,
                              proc.split(":")[0]))
    return out


def rank_summary(nl: NcclLog, across_nodes: bool = True) -> dict[str, dict[str, Any]]:
    """Per rank, keyed ``host/rank`` (one world per node repeats the ranks): the network its process chose, the
    interface NET/Socket listed, and its channels' transports between nodes and within a node (label -> count).
    A process that printed no Init line is keyed ``host/pid``. ``across_nodes`` False: the world is one node
    (Gate 1's intra phase), so every channel is within it."""
    out: dict[str, dict[str, Any]] = {}

    def row(key: str) -> dict[str, Any]:
        return out.setdefault(key, {"network": None, "socket_if": None, "inter": {}, "intra": {}})
    for proc in sorted({*nl.ranks, *nl.networks}, key=lambda p: (nl.ranks.get(p, 1 << 30), p)):
        host, pid = proc.split(":")
        r = row(f"{host}/{nl.ranks[proc]}" if proc in nl.ranks else f"{host}/pid {pid}")
        r["network"], r["socket_if"] = nl.networks.get(proc), nl.socket_ifs.get(proc)
    for link in nl.links:
        side = row(f"{link.host}/{link.rank}")["inter" if across_nodes and nl.inter(link) else "intra"]
        side[link.label] = side.get(link.label, 0) + 1
    return out
