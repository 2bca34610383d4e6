"""Gate 1, network: NCCL all-reduce and all-to-all inside the engine image, with the engine's env.

First every node alone (all its GPUs, ``intra``), then one world across the nodes
(``inter``), each as an indexed Job labelled with the run: waited for, every pod's log
kept, deleted after. The probe (:mod:`gauntlet.steps._nccl_probe`) checks every result value and
reports algbw/busbw with nccl-tests' formulas; this step judges them against the
profile's minimums and also compares the node inventories Gate 1 wrote (MTU, RDMA
devices, cache). ``--launcher local`` runs the same probe with torchrun on this machine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gauntlet.contract import Check, UsageError, write_json_atomic
from gauntlet.params.models import NetworkSpec, Profile
from gauntlet.steps import Needs, _nccl_probe
from gauntlet.steps.backends import BACKENDS, backend_for
from gauntlet.steps._shared_options import engine_option
from gauntlet.steps.engine_cmd import engine_env
from gauntlet.steps.options import GateOptions, option

NAME = "network"
HELP = "Gate 1 network: NCCL all-reduce/all-to-all probe in the engine image (intra-node, then across nodes)"
NEEDS = Needs()

__all__ = ["NAME", "HELP", "NEEDS", "Options", "run", "judge_phase", "probe_env"]


@dataclass(frozen=True, kw_only=True)
class Options(GateOptions):
    engine: str | None = option(None, help="whose image and NCCL/GLOO env to use (default: the baseline)")
    run_id: str | None = option(None, help="this run's id (default: $GAUNTLET_RUN_ID)")
    inputs: tuple[str, ...] | None = option(None, nargs="*",
                                            help="Gate 1 node evidence dirs to compare (default: the nodes-* dirs "
                                                 "beside --out)")
    launcher: str | None = option(None, choices=tuple(sorted(BACKENDS)),
                                  help="default: kubernetes for a kubernetes profile, else local")
    nproc: int | None = option(None, help="local launcher: ranks (default: GPUs per node, min 2)")
    sizes: str | None = option(None, help="bytes per rank, comma-separated (default: the profile's)")

    def __post_init__(self) -> None:
        super().__post_init__()
        engine_option(self, self.engine)
        if self.nproc is not None and self.nproc < 1:
            raise UsageError(f"--nproc must be at least 1, got {self.nproc}")
        if self.sizes and not all(x.strip().isdigit() for x in self.sizes.split(",") if x.strip()):
            raise UsageError(f"--sizes: expected comma-separated byte counts, got {self.sizes!r}")


def probe_env(profile: Profile, engine: str) -> dict[str, str]:
    """The engine's exact env (what its pods get) plus NCCL_DEBUG=INFO, which only adds log lines."""
    from gauntlet.steps._k8s.manifests import socket_env
    env = {**engine_env(engine, profile.engines[engine]), **socket_env(profile)}
    env.setdefault("NCCL_DEBUG", "INFO")
    return env


def _largest(rows: list[dict[str, Any]], op: str) -> dict[str, Any] | None:
    mine = [r for r in rows if r["op"] == op]
    return max(mine, key=lambda r: r["bytes"]) if mine else None


def judge_phase(phase: str, results: list[dict[str, Any] | None], net: NetworkSpec,
                where: list[str] | None = None) -> list[Check]:
    """Correctness of every value, then busbw at the largest size against the phase's minimum."""
    where = where or [f"{phase}-{i}" for i in range(len(results))]
    missing = [w for w, r in zip(where, results, strict=True) if not r]
    checks = []
    if missing or not results:
        checks.append(Check(f"{phase}_ran", "fail", "a result from every probe", missing or "none",
                            f"no probe result from {missing or 'any pod'}: see the probe logs beside the verdict"))
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
    dirs = [Path(d) for d in inputs] if inputs is not None else sorted(out.parent.glob("nodes-*"))
    invs = []
    for d in dirs:
        f = d / "inventory.json"
        if not f.is_file():
            raise UsageError(f"--inputs {d}: no inventory.json (did the nodes gate run there?)")
        invs.append(json.loads(f.read_text()))
    return invs


def run(opts: Options, out: Path) -> tuple[list[Check], dict[str, Any]]:
    from gauntlet.steps.nodes import compare_nodes

    profile = opts.the_profile
    engine = profile.engine_name(opts.engine)
    backend = backend_for(profile, opts.launcher)
    launcher = backend.name
    checks = compare_nodes(_inventories(opts.inputs, out))
    env = probe_env(profile, engine)
    write_json_atomic(out / "probe-env.json", env)
    found = backend.network(profile, engine, env, opts, out)
    metrics: dict[str, Any] = {"engine": engine, "launcher": launcher, "env": env, "phases": {}}
    if launcher == "kubernetes" and len(profile.hardware.nodes) > 1 and "inter" not in found:
        checks.append(Check("inter_ran", "skip", "after a clean intra-node phase", None,
                            "the cross-node probe did not run: the intra-node phase failed first"))
    for phase, (results, where, log) in found.items():
        checks += judge_phase(phase, results, profile.hardware.network, where)
        metrics["phases"][phase] = {
            "where": where, "transports": _nccl_probe.nccl_transports(log),
            "results": [r and r["results"] for r in results],
            "world_size": [r and r["world_size"] for r in results], "nccl": [r and r.get("nccl") for r in results],
        }
        if "GAUNTLET_NCCL_TESTS_BEGIN" in log:
            metrics["phases"][phase]["nccl_tests"] = _nccl_probe.parse_nccl_tests(log)
    write_json_atomic(out / "network.json", metrics)
    return checks, {k: v for k, v in metrics.items() if k != "env"}
