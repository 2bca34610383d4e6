"""Gate 1, network: NCCL all-reduce and all-to-all inside the engine image, with the engine's env.

First every node alone (all its GPUs, ``intra``), then one world across the nodes
(``inter``), each as an indexed Job labelled with the run: waited for, every pod's log
kept, deleted after. The probe (:mod:`gauntlet.steps._nccl_probe`) checks every result value and
reports algbw/busbw with nccl-tests' formulas; this step judges them against the
profile's minimums and also compares the node inventories Gate 1 wrote (MTU, RDMA
devices, cache). ``--launcher local`` runs the same probe with torchrun on this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gauntlet.steps import Needs
from gauntlet.params import load_images
from gauntlet.params.models import NetworkSpec, Profile
from gauntlet.steps import _nccl_probe
from gauntlet.contract import Check, UsageError, write_json_atomic
from gauntlet.steps.engine_cmd import engine_env

NAME = "network"
HELP = "Gate 1 network: NCCL all-reduce/all-to-all probe in the engine image (intra-node, then across nodes)"
NEEDS = Needs()
POLL_S = 5.0

__all__ = ["NAME", "HELP", "NEEDS", "add_arguments", "run", "judge_phase", "probe_env"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", default=None, help="whose image and NCCL/GLOO env to use (default: the baseline)")
    p.add_argument("--run-id", default=None, help="this run's id (default: $GAUNTLET_RUN_ID)")
    p.add_argument("--inputs", nargs="*", default=None,
                   help="Gate 1 node evidence dirs to compare (default: the nodes-* dirs beside --out)")
    p.add_argument("--launcher", choices=["kubernetes", "local"], default=None,
                   help="default: kubernetes for a kubernetes profile, else local")
    p.add_argument("--nproc", type=int, default=None, help="local launcher: ranks (default: GPUs per node, min 2)")
    p.add_argument("--sizes", default=None, help="bytes per rank, comma-separated (default: the profile's)")


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


def _inventories(args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    dirs = [Path(d) for d in args.inputs] if args.inputs is not None else sorted(out.parent.glob("nodes-*"))
    invs = []
    for d in dirs:
        f = d / "inventory.json"
        if not f.is_file():
            raise UsageError(f"--inputs {d}: no inventory.json (did the nodes gate run there?)")
        invs.append(json.loads(f.read_text()))
    return invs


def _probe_args(profile: Profile, sizes: str | None) -> list[str]:
    net = profile.hardware.network
    return ["--sizes", sizes or ",".join(str(s) for s in net.probe_sizes_bytes),
            "--iters", str(net.probe_iters), "--warmup", str(net.probe_warmup)]


def _run_local(profile: Profile, env: dict[str, str], args: argparse.Namespace, out: Path
               ) -> dict[str, tuple[list[dict[str, Any] | None], list[str], str]]:
    nproc = args.nproc or max(2, profile.hardware.gpus_per_node)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           _nccl_probe.__file__, *_probe_args(profile, args.sizes)]
    (out / "probe-command.txt").write_text(" ".join(cmd) + "\n")
    try:
        p = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True,
                           timeout=profile.hardware.network.probe_timeout_s)
        log = p.stdout + p.stderr
    except subprocess.TimeoutExpired as exc:
        log = f"{exc.stdout or ''}{exc.stderr or ''}\nTIMEOUT after {exc.timeout}s"
    (out / "probe-intra-local.log").write_text(log)
    return {"intra": ([_nccl_probe.parse_result_line(log)], ["local"], log)}


def _run_kubernetes(profile: Profile, engine: str, env: dict[str, str], args: argparse.Namespace, out: Path
                    ) -> dict[str, tuple[list[dict[str, Any] | None], list[str], str]]:
    from gauntlet.steps._k8s import run_id_from
    from gauntlet.steps._k8s import manifests as M
    from gauntlet.steps._k8s.api import connect
    from gauntlet.steps._k8s.apply import apply
    from gauntlet.steps._k8s.manager import Manager, pod_state

    run_id = run_id_from(args.run_id)
    api = connect()
    ns = os.environ.get("GAUNTLET_NAMESPACE") or profile.namespace
    mgr = Manager(api, ns, run_id)
    image = load_images()[profile.engines[engine].image].ref
    src = Path(_nccl_probe.__file__).read_text()
    phases = ["intra"] + (["inter"] if len(profile.hardware.nodes) > 1 else [])
    found: dict[str, tuple[list[dict[str, Any] | None], list[str], str]] = {}
    for phase in phases:
        if phase == "inter" and not all(r and all(x["correct"] for x in r["results"]) for r in found["intra"][0]):
            break       # a node that fails alone would only fail again across nodes: keep the GPUs' time
        names = M.probe_names(phase, run_id)
        objs = [M.probe_job(profile, phase, run_id, image, env, src, _probe_args(profile, args.sizes))]
        if phase == "inter":
            objs.insert(0, M.probe_service(profile, phase, run_id))
        for o in objs:
            if o["metadata"].get("namespace") != ns:
                o["metadata"]["namespace"] = ns
        write_json_atomic(out / f"probe-{phase}-manifests.json", objs)
        try:
            for o in objs:
                apply(api, o)
            deadline = time.monotonic() + profile.hardware.network.probe_timeout_s
            problem = None
            while time.monotonic() < deadline:
                job = mgr.get("Job", names["job"]) or {}
                st = job.get("status") or {}
                if int(st.get("succeeded") or 0) >= len(profile.hardware.nodes) or int(st.get("failed") or 0):
                    break
                bad = [s for s in map(pod_state, mgr.pods(f"gauntlet.dev/component=netprobe-{phase}"))
                       if s.problem]
                if bad:
                    problem = "; ".join(f"{s.name}: {s.problem}" for s in bad)
                    break
                time.sleep(POLL_S)
            else:
                problem = f"not finished after {profile.hardware.network.probe_timeout_s}s"
            pods = sorted(mgr.pods(f"gauntlet.dev/component=netprobe-{phase}"),
                          key=lambda p: int((p["metadata"].get("labels") or {})
                                            .get("batch.kubernetes.io/job-completion-index", 0)))
            logs, results, where = [], [], []
            for p in pods:
                name = p["metadata"]["name"]
                text = mgr.logs(name)
                (out / f"probe-{phase}-{name}.log").write_text(text)
                logs.append(text)
                node = (p.get("spec") or {}).get("nodeName") or name
                res = _nccl_probe.parse_result_line(text)
                if phase == "intra" or res:
                    results.append(res)
                    where.append(node)
            if phase == "inter" and not results:
                results, where = [None], ["inter"]
            if problem:
                (out / f"probe-{phase}-problem.txt").write_text(problem + "\n")
            found[phase] = (results or [None], where or [phase], "\n".join(logs))
        finally:
            for o in reversed(objs):
                mgr.delete(o["kind"], o["metadata"]["name"])
    return found


def run(args: argparse.Namespace, out: Path) -> tuple[list[Check], dict[str, Any]]:
    from gauntlet.steps.nodes import compare_nodes

    profile: Profile = args.profile_obj
    engine = args.engine or profile.baseline_engine
    if engine not in profile.engines:
        raise UsageError(f"--engine {engine}: not in profile {profile.name} (has {', '.join(profile.engines)})")
    launcher = args.launcher or ("kubernetes" if profile.hardware.kind == "kubernetes" else "local")
    checks = compare_nodes(_inventories(args, out))
    env = probe_env(profile, engine)
    write_json_atomic(out / "probe-env.json", env)
    found = (_run_kubernetes(profile, engine, env, args, out) if launcher == "kubernetes"
             else _run_local(profile, env, args, out))
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
