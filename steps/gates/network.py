"""Gate 1, network: NCCL all-reduce and all-to-all inside the engine image, with the engine's env.

First every node alone (all its GPUs, ``intra``), then one world across the nodes
(``inter``), each as an indexed Job labelled with the run: waited for, every pod's log
kept, deleted after. The probe (:mod:`gauntlet.steps.cluster.nccl_probe`) checks every result value and
reports algbw/busbw with nccl-tests' formulas; this step judges them against the
profile's minimums and also compares the node inventories Gate 1 wrote (MTU, RDMA
devices, cache). ``--backend local`` runs the same probe with torchrun on this machine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gauntlet.contract import Check, UsageError, write_json_atomic
from gauntlet.contract.layout import RunLayout
from gauntlet.params.models import NetworkSpec, Profile
from gauntlet.steps.gate import Needs
from gauntlet.steps.cluster import fabric as _fabric
from gauntlet.steps.cluster import nccl_log as _nccl_log
from gauntlet.steps.cluster import nccl_probe as _nccl_probe
from gauntlet.steps.backends import backend_for, capability
from gauntlet.steps.backends.protocol import ClusterInspector
from gauntlet.steps.gates.shared_options import backend_option, engine_option
from gauntlet.steps.engines.commands import engine_env
from gauntlet.steps.options import GateOptions, option

NAME = "network"
HELP = "Gate 1 network: NCCL all-reduce/all-to-all probe in the engine image (intra-node, then across nodes)"
NEEDS = Needs(api="manage")

__all__ = ["NAME", "HELP", "NEEDS", "Options", "run", "judge_phase", "judge_transport", "probe_env",
           "rdma_access_problems"]


@dataclass(frozen=True, kw_only=True)
class Options(GateOptions):
    engine: str | None = option(None, help="whose image and NCCL/GLOO env to use (default: the baseline)")
    run_id: str | None = option(None, help="this run's id (default: $GAUNTLET_RUN_ID)")
    inputs: tuple[str, ...] | None = option(None, nargs="*",
                                            help="Gate 1 node evidence dirs to compare (default: the nodes-* dirs "
                                                 "beside --out)")
    backend: str | None = backend_option("where the probe runs; default: the profile's hardware.kind")
    nproc: int | None = option(None, ge=1, le=1024, help="--backend local: ranks, 1 to 1024 (default: GPUs per node, min 2)")
    sizes: str | None = option(None, help="bytes per rank, comma-separated (default: the profile's)")
    nccl_env: tuple[str, ...] | None = option(None, nargs="*", help="NODE=JSON per node: what Gate 1's nodes resolved "
                                              "(its nccl_env output; default: the inventories' nccl_env)")

    def __post_init__(self) -> None:
        super().__post_init__()
        engine_option(self, self.engine)
        self.node_envs()
        if self.nproc is not None and self.nproc < 1:
            raise UsageError(f"--nproc must be at least 1, got {self.nproc}")
        if self.sizes and not all(x.strip().isdigit() for x in self.sizes.split(",") if x.strip()):
            raise UsageError(f"--sizes: expected comma-separated byte counts, got {self.sizes!r}")

    def node_envs(self) -> dict[str, dict[str, str]]:
        """``--nccl-env`` as {node: env}; UsageError naming the flag when a word is not NODE=JSON of a node."""
        return _fabric.parse_node_envs(self.nccl_env, self.the_profile)


def probe_env(profile: Profile, engine: str) -> dict[str, str]:
    """The engine's exact env (what its pods get) plus NCCL_DEBUG=INFO and the subsystems whose lines say which
    network and transports NCCL chose (steps/cluster/nccl_log.py): they only add log lines."""
    env = {**engine_env(engine, profile.engine(engine)), **_fabric.fabric_env(profile)}
    env.setdefault("NCCL_DEBUG", "INFO")
    env.setdefault("NCCL_DEBUG_SUBSYS", "INIT,ENV,NET,GRAPH")
    return env


def rdma_access_problems(profile: Profile) -> list[str]:
    """For a profile that declares RDMA (``rdma_required``): every pod its back end would run NCCL in that gets
    no RDMA device (:meth:`gauntlet.steps.backends.protocol.ClusterInspector.rdma_access_problems`): one line
    naming them, or none. A back end without pods to read (local) has none."""
    inspector = capability(backend_for(profile), ClusterInspector)
    return inspector.rdma_access_problems(profile) if inspector is not None else []


def judge_transport(phase: str, log: str, net: NetworkSpec) -> Check:
    """What NCCL really did, from its own lines (steps/cluster/nccl_log.py). ``inter``: the transport between nodes; on
    a profile that declares RDMA, NET/Socket (or no NET/IB at all) fails, naming the interface NCCL picked and
    NET/IB's own line saying why. ``intra``: within a node, P2P or SHM; a NET transport there fails."""
    nl = _nccl_log.parse(log)
    ranks = _nccl_log.rank_summary(nl, across_nodes=phase == "inter")
    name = f"{phase}_transport"
    if phase != "inter":
        labels = _count(nl.links)
        if not nl.links:
            return Check(name, "skip", "P2P or SHM within a node", ranks,
                         "NCCL connected no peers (one rank per world, or no NCCL_DEBUG=INFO lines)"
                         + (f"; it chose network {sorted(set(nl.networks.values()))}" if nl.networks else ""))
        netted = [x for x in nl.links if x.net]
        return Check(name, "fail" if netted else "pass", "P2P or SHM within a node", ranks,
                     f"GPUs of one node connected through {netted[0].label} ('{netted[0].line}'): NCCL found "
                     "neither P2P nor SHM between them" if netted else f"within a node: {labels}")
    inter = [x for x in nl.links if nl.inter(x)]
    want = "NET/IB between nodes" if net.rdma_required else "any NET transport between nodes"
    socket = [x for x in inter if x.transport == "NET/Socket"]
    chose = sorted(p for p, n in nl.networks.items() if n == "Socket")
    if not inter and not nl.networks:
        said = list(dict.fromkeys([*(x for v in nl.ib_lines.values() for x in v), *nl.warnings]))
        return Check(name, "fail" if net.rdma_required else "skip", want, ranks,
                     "NCCL chose no network; it said: " + "; ".join(f"'{x}'" for x in said[:4]) if said else
                     "no NCCL channel or 'Using network' line in the probe logs: which transport NCCL used between "
                     "nodes is unknown (NCCL_DEBUG=INFO unset, or NCCL never initialised)")
    on_socket = socket or (not any(x.net and x.transport != "NET/Socket" for x in inter) and chose)
    if on_socket:
        procs = sorted({p for p in nl.socket_ifs if p in chose} or set(nl.socket_ifs))
        ifs = sorted({nl.socket_ifs[p] for p in procs})
        what = (f"NCCL used NET/Socket between nodes on {len(socket)} channel(s) ('{socket[0].line}')" if socket
                else f"NCCL chose network Socket ('Using network Socket', {len(chose)} process(es))")
        why = list(dict.fromkeys(line for p in (chose or nl.ib_lines) for line in nl.ib_lines.get(p, [])))
        detail = (f"{what} over {', '.join(ifs) or 'an interface it did not name'}; NET/IB said: "
                  + ("; ".join(f"'{w}'" for w in why[:3]) if why else "nothing (NCCL_IB_DISABLE=1 or NCCL_NET=Socket?)"))
        if net.rdma_required:
            return Check(name, "fail", want, ranks, detail + "; the profile declares RDMA (rdma_required): give the "
                         "pods the RDMA device (hardware.fabric) and check NCCL_IB_HCA")
        return Check(name, "pass", want, ranks, detail + " (the profile does not require RDMA)")
    no_gdr = sorted({x.rank for x in inter if x.net and not x.gdr})
    return Check(name, "pass", want, ranks, f"between nodes: {_count(inter)}"
                 + (f"; without GPUDirect RDMA on ranks {no_gdr}: data is staged through host memory" if no_gdr else ""))


def _count(links: list[_nccl_log.Link]) -> str:
    seen: dict[str, int] = {}
    for x in links:
        seen[x.label] = seen.get(x.label, 0) + 1
    return ", ".join(f"{k} on {v} channel(s)" for k, v in sorted(seen.items()))


def _largest(rows: list[dict[str, Any]], op: str) -> dict[str, Any] | None:
    mine = [r for r in rows if r["op"] == op]
    return max(mine, key=lambda r: r["bytes"]) if mine else None


def judge_phase(phase: str, results: list[dict[str, Any] | None], net: NetworkSpec,
                where: list[str] | None = None, problem: str | None = None) -> list[Check]:
    """Correctness of every value, then busbw at the largest size against the phase's minimum; ``problem``:
    why the launcher stopped waiting (a pod that failed, or could not start), named in the ``_ran`` check."""
    where = where or [f"{phase}-{i}" for i in range(len(results))]
    missing = [w for w, r in zip(where, results, strict=True) if not r]
    checks = []
    if missing or not results:
        checks.append(Check(f"{phase}_ran", "fail", "a result from every probe", missing or "none",
                            f"no probe result from {missing or 'any pod'}: "
                            + (problem if problem else "see the probe logs beside the verdict")))
    got = [(w, r) for w, r in zip(where, results, strict=True) if r]
    if not got:
        return checks
    wrong = [(w, x["op"], x["bytes"], x.get("error")) for w, r in got for x in r["results"] if not x["correct"]]
    checks.append(Check(f"{phase}_correct", "fail" if wrong else "pass", "every result value right", wrong,
                        f"wrong collective results: {wrong}" if wrong else
                        f"all-reduce and all-to-all values right on {got[0][1]['world_size']} ranks ({len(got)} run(s))"))
    for op in ("all_reduce", "all_to_all"):
        minimum = getattr(net, f"{op.replace('_', '')}_busbw_gbps_min_{phase}", None)
        seen = {w: round(row["busbw_gbps"], 2) for w, r in got if (row := _largest(r["results"], op))}
        if not seen:
            continue
        name = f"{phase}_{op}_busbw"
        if minimum is None:
            checks.append(Check(name, "skip", None, seen, "no minimum in the profile: recorded, not judged"))
            continue
        low = {w: v for w, v in seen.items() if v < minimum}
        checks.append(Check(name, "fail" if low else "pass", f">= {minimum} GB/s", seen,
                            f"{op} busbw below {minimum} GB/s at the largest size: {low}" if low
                            else f"{op} busbw >= {minimum} GB/s"))
    return checks


def _inventories(inputs: tuple[str, ...] | None, out: Path) -> list[dict[str, Any]]:
    dirs = [Path(d) for d in inputs] if inputs is not None else RunLayout(RunLayout.dag_dir(out)).node_check_dirs()
    invs = []
    for d in dirs:
        f = d / "inventory.json"
        if not f.is_file():
            raise UsageError(f"--inputs {d}: no inventory.json (did the nodes gate run there?)")
        invs.append(json.loads(f.read_text()))
    return invs


def run(opts: Options, out: Path) -> tuple[list[Check], dict[str, Any]]:
    from gauntlet.steps.gates.nodes import compare_nodes

    profile = opts.the_profile
    engine = profile.engine_name(opts.engine)
    backend = backend_for(profile, opts.backend)
    launcher = backend.name
    inventories = _inventories(opts.inputs, out)
    checks = compare_nodes(inventories)
    node_env = opts.node_envs()
    if opts.nccl_env is None:           # run by hand: what the nodes gate wrote beside its inventory
        node_env = {i["node"]: i["nccl_env"] for i in inventories if i.get("nccl_env") and i.get("node") in
                    {n.name for n in profile.hardware.nodes}}
        opts = replace(opts, nccl_env=tuple(f"{n}={_fabric.encode(e)}" for n, e in node_env.items()))
    env = probe_env(profile, engine)
    write_json_atomic(out / "probe-env.json", env)
    found = backend.network(profile, engine, env, opts, out)
    metrics: dict[str, Any] = {"engine": engine, "launcher": launcher, "env": env, "nccl_env": node_env,
                               "phases": {}, "outputs": {"nccl_env": _fabric.encode(node_env)}}
    if launcher == "kubernetes" and len(profile.hardware.nodes) > 1 and "inter" not in found:
        checks.append(Check("inter_ran", "skip", "after a clean intra-node phase", None,
                            "the cross-node probe did not run: the intra-node phase failed first"))
    for phase, (results, where, log) in found.items():
        why = out / f"probe-{phase}-problem.txt"            # written by the Kubernetes launcher
        checks += judge_phase(phase, results, profile.hardware.network, where,
                              why.read_text().strip() if why.is_file() else None)
        transport = judge_transport(phase, log, profile.hardware.network)
        checks.append(transport)
        metrics["phases"][phase] = {
            "where": where, "transports": _nccl_probe.nccl_transports(log), "per_rank": transport.observed,
            "results": [r and r["results"] for r in results],
            "world_size": [r and r["world_size"] for r in results], "nccl": [r and r.get("nccl") for r in results],
        }
        if "GAUNTLET_NCCL_TESTS_BEGIN" in log:
            metrics["phases"][phase]["nccl_tests"] = _nccl_probe.parse_nccl_tests(log)
    write_json_atomic(out / "network.json", metrics)
    return checks, {k: v for k, v in metrics.items() if k != "env"}
