"""The network gate's Kubernetes launcher: the NCCL probe as indexed Jobs on the cluster.

The registry (:mod:`gauntlet.steps.backends`) picks it (``--backend``, else the profile's ``hardware.kind``);
the gate (:mod:`gauntlet.steps.gates.network`) judges what it returns. The local launcher is
:mod:`gauntlet.steps.backends.local.network`.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from gauntlet.contract import write_json_atomic
from gauntlet.params import load_images
from gauntlet.params.models import Profile
from gauntlet.steps.cluster import nccl_probe as _nccl_probe
from gauntlet.steps.backends.probe import probe_args
from gauntlet.steps.backends.protocol import Phases

__all__ = ["launch_kubernetes", "POLL_S"]

POLL_S = 5.0


def launch_kubernetes(profile: Profile, engine: str, env: dict[str, str], run_id: str | None, sizes: str | None,
                      out: Path, node_env: dict[str, dict[str, str]] | None = None) -> Phases:
    """Indexed Jobs labelled with the run: every node alone, then one world across the nodes; deleted after.
    Each pod exports its node's NCCL/GLOO settings from ``node_env`` (Gate 1's, steps/cluster/fabric.py)."""
    from gauntlet.steps.backends.kubernetes import run_id_from
    from gauntlet.steps.backends.kubernetes import manifests as M
    from gauntlet.steps.backends.kubernetes.api import connect
    from gauntlet.steps.backends.kubernetes.apply import apply
    from gauntlet.steps.backends.kubernetes.manager import Manager, pod_state
    from gauntlet.steps.backends.kubernetes.stuck import StuckWatch, refused

    run_id = run_id_from(run_id)
    api = connect()
    ns = os.environ.get("GAUNTLET_NAMESPACE") or profile.namespace
    mgr = Manager(api, ns, run_id)
    image = load_images()[profile.engine(engine).image].ref
    src = Path(_nccl_probe.__file__).read_text()
    phases = ["intra"] + (["inter"] if len(profile.hardware.nodes) > 1 else [])
    found: Phases = {}
    for phase in phases:
        if phase == "inter" and not all(r and all(x["correct"] for x in r["results"]) for r in found["intra"][0]):
            break       # a node that fails alone would only fail again across nodes: keep the GPUs' time
        names = M.probe_names(phase, run_id)
        objs = [M.probe_job(profile, phase, run_id, image, env, src, probe_args(profile, sizes), node_env)]
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
            stuck = StuckWatch()
            while time.monotonic() < deadline:
                job = mgr.get("Job", names["job"]) or {}
                st = job.get("status") or {}
                if int(st.get("succeeded") or 0) >= len(profile.hardware.nodes) or int(st.get("failed") or 0):
                    break
                probe_pods = mgr.pods(f"gauntlet.dev/component=netprobe-{phase}")
                bad = [s for s in map(pod_state, probe_pods) if s.problem]
                if bad:
                    problem = "; ".join(f"{s.name}: {s.problem}" for s in bad)
                    break
                # a pod the API server refused (Pod Security, a quota) never appears: the Job's FailedCreate says why
                why = refused(mgr, "Job", names["job"]) if len(probe_pods) < len(profile.hardware.nodes) else None
                if cannot := stuck.check(probe_pods, {f"Job {names['job']}": why} if why else None):
                    # its Job is deleted below: nothing stays pending
                    problem = f"cannot start: {cannot}"
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
