"""The network gate's launchers: the NCCL probe with torchrun on this machine, or as indexed Jobs on the cluster.

:mod:`gauntlet.steps.backends` picks one (``--launcher``, else the profile's ``hardware.kind``); the gate
(:mod:`gauntlet.steps.network`) judges what they return.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from gauntlet.contract import write_json_atomic
from gauntlet.params import load_images
from gauntlet.params.models import Profile
from gauntlet.steps import _nccl_probe
from gauntlet.steps.backends import Phases

__all__ = ["launch_local", "launch_kubernetes", "POLL_S"]

POLL_S = 5.0


def _probe_args(profile: Profile, sizes: str | None) -> list[str]:
    net = profile.hardware.network
    return ["--sizes", sizes or ",".join(str(s) for s in net.probe_sizes_bytes),
            "--iters", str(net.probe_iters), "--warmup", str(net.probe_warmup)]


def launch_local(profile: Profile, env: dict[str, str], nproc: int | None, sizes: str | None, out: Path) -> Phases:
    """torchrun on this machine: ``nproc`` ranks (default: GPUs per node, at least 2), one intra-node phase."""
    nproc = nproc or max(2, profile.hardware.gpus_per_node)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           _nccl_probe.__file__, *_probe_args(profile, sizes)]
    (out / "probe-command.txt").write_text(" ".join(cmd) + "\n")
    try:
        p = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True,
                           timeout=profile.hardware.network.probe_timeout_s)
        log = p.stdout + p.stderr
    except subprocess.TimeoutExpired as exc:
        log = f"{exc.stdout or ''}{exc.stderr or ''}\nTIMEOUT after {exc.timeout}s"
    (out / "probe-intra-local.log").write_text(log)
    return {"intra": ([_nccl_probe.parse_result_line(log)], ["local"], log)}


def launch_kubernetes(profile: Profile, engine: str, env: dict[str, str], run_id: str | None, sizes: str | None,
                      out: Path) -> Phases:
    """Indexed Jobs labelled with the run: every node alone, then one world across the nodes; deleted after."""
    from gauntlet.steps._k8s import run_id_from
    from gauntlet.steps._k8s import manifests as M
    from gauntlet.steps._k8s.api import connect
    from gauntlet.steps._k8s.apply import apply
    from gauntlet.steps._k8s.manager import Manager, pod_state

    run_id = run_id_from(run_id)
    api = connect()
    ns = os.environ.get("GAUNTLET_NAMESPACE") or profile.namespace
    mgr = Manager(api, ns, run_id)
    image = load_images()[profile.engines[engine].image].ref
    src = Path(_nccl_probe.__file__).read_text()
    phases = ["intra"] + (["inter"] if len(profile.hardware.nodes) > 1 else [])
    found: Phases = {}
    for phase in phases:
        if phase == "inter" and not all(r and all(x["correct"] for x in r["results"]) for r in found["intra"][0]):
            break       # a node that fails alone would only fail again across nodes: keep the GPUs' time
        names = M.probe_names(phase, run_id)
        objs = [M.probe_job(profile, phase, run_id, image, env, src, _probe_args(profile, sizes))]
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
