"""The rank watch: a rank that restarts or exits while a gate runs fails that gate, naming the rank and gate.

The judgement is pure (:func:`gauntlet.steps.cluster.rank_watch.judge`); the snapshots come from the back ends:
locally a real engine-like process group labelled with the run directory (killed mid-gate), on Kubernetes
the API double's pods (their restart counts and uids shaped as the real API returns them).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from k8s_double import running

from gauntlet.contract import Check
from gauntlet.params import load_profile
from gauntlet.steps import Needs
from gauntlet.steps.backends.kubernetes import deploy as _deploy_k8s
from gauntlet.steps.gates import deploy
from gauntlet.steps.backends.local.deploy import LABEL_DIR, state_path
from gauntlet.steps.cluster.rank_watch import Rank, judge
from gauntlet.steps.options import GateOptions, option
from gauntlet.steps.runner import run_step

UID = "9e0d4c2a-1111-2222-3333-444455556666"


def r(rank, ident="a", restarts=0, alive=True):
    return Rank(rank, ident, restarts, alive, f"pod-{rank}")


# ------------------------------------------------------------------ pure judgement

def test_steady_ranks_pass():
    c = judge("perf", [r(0), r(1)], [r(0), r(1)])
    assert c.status == "pass" and "none restarted" in c.detail


def test_a_restart_names_the_rank_and_the_gate():
    c = judge("perf", [r(0), r(1, restarts=0)], [r(0), r(1, restarts=1)])
    assert c.status == "fail"
    assert "rank 1 restarted during perf" in c.detail and "rank 0" not in c.detail


def test_an_exited_or_vanished_rank_fails():
    assert "rank 1 exited during smoke" in judge("smoke", [r(0), r(1)], [r(0), r(1, alive=False)]).detail
    assert "rank 1 exited during smoke" in judge("smoke", [r(0), r(1)], [r(0)]).detail
    assert judge("smoke", [r(0)], None).status == "fail"


def test_a_replaced_pod_fails_unless_the_gate_redeployed_on_purpose():
    before, after = [r(0, "a"), r(1, "b")], [r(0, "c"), r(1, "d")]
    assert "rank 0 was replaced during longctx" in judge("longctx", before, after).detail
    ok = judge("longctx", before, after, redeployed=True)
    assert ok.status == "pass" and "redeployed" in ok.detail
    # restarted after the gate's own redeploy: still a failure
    bad = judge("longctx", before, [r(0, "c"), r(1, "d", restarts=2)], redeployed=True)
    assert bad.status == "fail" and "rank 1 restarted during longctx after the engine was redeployed" in bad.detail


def test_no_engine_before_the_gate_is_a_skip_not_a_pass():
    assert judge("smoke", None, None).status == "skip"
    assert judge("smoke", [], [r(0)]).status == "skip"


# ------------------------------------------------------------------ through the runner, local back end

class _Gate:
    """A gate that runs against the engine (``Needs.engine_ranks``); its run does what the test asks."""

    NAME = "probe-gate"
    HELP = "test"
    NEEDS = Needs(engine_ranks=True)

    @dataclass(frozen=True, kw_only=True)
    class Options(GateOptions):
        engine: str | None = option(None, help="engine")

    action = staticmethod(lambda: None)
    metrics: dict = {}

    @classmethod
    def run(cls, opts, out):
        cls.action()
        return [Check("did", "pass", None, None, "ran")], dict(cls.metrics)


@pytest.fixture
def local_engine(tmp_path):
    """A process group labelled with the run directory, as the local deploy starts an engine."""
    run_dir = (tmp_path / "run" / "vllm").resolve()
    run_dir.mkdir(parents=True)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True,
                            env={**os.environ, LABEL_DIR: str(run_dir)})
    state = state_path(run_dir, "vllm")
    state.parent.mkdir(parents=True)
    state.write_text(json.dumps({"engine": "vllm", "pid": proc.pid, "pgid": os.getpgid(proc.pid), "port": 1}))
    yield run_dir, proc
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _run(gate, out: Path):
    ns = argparse.Namespace(profile="local-cpu", out=str(out), engine="vllm")
    code = run_step(gate, ns)
    return code, json.loads((out / "verdict.json").read_text())


def test_engine_that_dies_during_the_gate_fails_it(local_engine, monkeypatch):
    run_dir, proc = local_engine

    def die():
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    monkeypatch.setattr(_Gate, "action", staticmethod(die))
    code, v = _run(_Gate, run_dir / "perf")
    checks = {c["name"]: c for c in v["checks"]}
    assert code == 1 and v["status"] == "fail"
    assert checks["engine_ranks"]["status"] == "fail"
    assert "rank 0 exited during probe-gate" in checks["engine_ranks"]["detail"]


def test_engine_that_stays_up_passes(local_engine, monkeypatch):
    run_dir, _ = local_engine
    monkeypatch.setattr(_Gate, "action", staticmethod(lambda: time.sleep(0.05)))
    code, v = _run(_Gate, run_dir / "smoke")
    checks = {c["name"]: c for c in v["checks"]}
    assert code == 0 and checks["engine_ranks"]["status"] == "pass"


def test_the_gates_that_judge_the_engine_are_watched():
    from gauntlet.steps import load_step, needs_of
    from gauntlet.steps import STEPS
    watched = {n for n in STEPS if needs_of(load_step(n)).engine_ranks}
    # the variants' experiment deploys and tears down its own engine; the baseline is released before it
    assert watched == {"smoke", "perf", "longctx", "experiment-baseline"}


# ------------------------------------------------------------------ Kubernetes back end (API double)

def test_kubernetes_rank_restart_is_read_from_the_pods(api_double, monkeypatch, tmp_path):
    """Real pods' shape: restartCount on containerStatuses, uid in metadata; the double stands in for the API."""
    kimi = load_profile("kimi-k3-h20")
    d, eng = api_double
    monkeypatch.setenv("GAUNTLET_RUN_ID", UID)
    opts = deploy.Options(profile=kimi, engine="sglang", run_id=UID, backend="kubernetes")
    checks, _ = _deploy_k8s.deploy(opts, tmp_path / "deploy")
    assert {c.name: c.status for c in checks}["ready"] == "pass"
    from gauntlet.steps.backends.ranks import kubernetes_ranks
    before = kubernetes_ranks(kimi, "sglang")
    assert [x.rank for x in before] == [0, 1] and all(x.alive and x.restarts == 0 for x in before)

    def crashed_once(pod):
        st = running(pod)
        if pod["metadata"]["name"].endswith("-1"):
            st["containerStatuses"][0]["restartCount"] = 1
            st["containerStatuses"][0]["lastState"] = {"terminated": {"exitCode": 137, "reason": "Error"}}
        return st

    for (plural, _, _name), pod in d.objects.items():     # the kubelet reports the restart on the pod
        if plural == "pods":
            pod["status"] = crashed_once(pod)
    after = kubernetes_ranks(kimi, "sglang")
    c = judge("perf", before, after)
    assert c.status == "fail" and "rank 1 restarted during perf" in c.detail
    # a variant's pods are not the baseline's ranks
    assert kubernetes_ranks(kimi, "vllm") is None


def test_a_rank_read_failure_is_a_skip_naming_why(monkeypatch, tmp_path):
    from gauntlet.steps import runner
    profile = load_profile("kimi-k3-h20")
    monkeypatch.setenv("GAUNTLET_KUBE_API", "http://127.0.0.1:9")       # nothing listens
    monkeypatch.setenv("GAUNTLET_RUN_ID", UID)
    snap = runner._ranks(profile, "sglang", tmp_path)
    assert isinstance(snap, str)
    c = runner._rank_check("perf", snap, profile, "sglang", tmp_path, {})
    assert c.status == "skip" and "could not be read" in c.detail
