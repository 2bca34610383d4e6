"""The janitor: releases only labelled objects of runs that are over, on Kubernetes (API double) and locally."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta, UTC
from pathlib import Path

import pytest
from k8s_double import K8sDouble

from gauntlet.params import load_images, load_profile
from gauntlet.steps.backends.kubernetes import cleanup as _cleanup_k8s
from gauntlet.steps.backends.kubernetes import janitor as _janitor_k8s
from gauntlet.steps.gates import janitor
from gauntlet.steps.backends.local.deploy import LABEL_DIR, find_labelled, stop_all
from gauntlet.contract import UsageError
from gauntlet.steps.backends.local.janitor import MARK, mark_runner, runner_alive
from gauntlet.steps.backends.kubernetes import manifests as M
from gauntlet.steps.runner import run_step

KIMI = load_profile("kimi-k3-h20")
NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
GONE, RUNNING, RECENT, OLD = (f"{c * 8}-0000-4000-8000-000000000000" for c in "abcd")


def wf(uid: str, phase: str, finished: datetime | None = None) -> dict:
    st = {"phase": phase}
    if finished:
        st["finishedAt"] = finished.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
            "metadata": {"name": f"gauntlet-kimi-k3-h20-{uid[:5]}", "namespace": "gauntlet", "uid": uid},
            "status": st}


# ------------------------------------------------------------------ judgement (pure)

@pytest.mark.parametrize("workflow,release", [
    (None, True),
    (wf(RUNNING, "Running"), False),
    (wf(RUNNING, "Pending"), False),
    (wf(RECENT, "Failed", NOW - timedelta(minutes=3)), False),
    (wf(OLD, "Succeeded", NOW - timedelta(hours=2)), True),
    (wf(OLD, "Error", NOW - timedelta(minutes=11)), True),
    (wf(OLD, "Failed"), True),
])
def test_judge_run(workflow, release):
    state = janitor.judge_run(workflow, NOW, 600)
    assert state.release is release and state.reason


@pytest.mark.parametrize("text,seconds", [("10m", 600), ("30s", 30), ("1h30m", 5400), ("45", 45), ("0.5s", 0.5)])
def test_parse_duration(text, seconds):
    assert janitor.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "ten minutes", "10x", "m10"])
def test_parse_duration_refuses(text):
    with pytest.raises(UsageError, match="--grace"):
        janitor.parse_duration(text)
    with pytest.raises(UsageError, match="--grace"):
        janitor.Options(grace=text)                     # refused up front, before anything is listed


# ------------------------------------------------------------------ Kubernetes (API double)

def engine(d: K8sDouble, uid: str, eng: str = "sglang") -> None:
    for o in M.engine_objects(KIMI, eng, uid, load_images()[eng].ref):
        d.add(o)


FOREIGN = {"apiVersion": "apps/v1", "kind": "StatefulSet",
           "metadata": {"name": "search-embedder", "namespace": "gauntlet", "labels": {"app": "embedder"}},
           "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "embedder"}},
                    "template": {"metadata": {"labels": {"app": "embedder"}},
                                 "spec": {"containers": [{"name": "e", "image": "embedder:1"}]}}}}


@pytest.fixture
def cluster(monkeypatch):
    with K8sDouble() as d:
        monkeypatch.setenv("GAUNTLET_KUBE_API", d.url)
        monkeypatch.setattr(_cleanup_k8s, "POLL_S", 0.02)
        monkeypatch.setattr(_janitor_k8s, "WAIT_S", 1)
        engine(d, GONE)
        d.add({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bare-gone", "namespace": "gauntlet",
               "labels": {"gauntlet.dev/run": GONE}}, "spec": {"containers": [{"name": "c", "image": "x"}]},
               "status": {"phase": "Running"}})
        d.add({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "argo-step-of-gone", "namespace": "gauntlet",
               "labels": {"gauntlet.dev/run": GONE, "workflows.argoproj.io/workflow": "gauntlet-x"}},
               "spec": {"containers": [{"name": "main", "image": "x"}]}, "status": {"phase": "Running"}})
        for uid in (RUNNING, RECENT, OLD):
            engine(d, uid)
        d.add(wf(RUNNING, "Running"))
        d.add(wf(RECENT, "Failed", datetime.now(UTC) - timedelta(minutes=2)))
        d.add(wf(OLD, "Succeeded", datetime.now(UTC) - timedelta(hours=3)))
        d.add(FOREIGN)
        yield d


def snapshot(d: K8sDouble, keep) -> dict:
    return {k: json.dumps(o, sort_keys=True) for k, o in d.objects.items() if keep(o)}


def run_of(o: dict) -> str | None:
    return (o["metadata"].get("labels") or {}).get("gauntlet.dev/run")


def janitor_args(tmp_path: Path, **kw) -> argparse.Namespace:
    return argparse.Namespace(**{"out": str(tmp_path / "janitor"), "grace": "10m", "namespace": "gauntlet",
                                 "backend": None, "runs_dir": "runs", "profile": None, **kw})


def test_releases_only_labelled_objects_of_runs_that_are_over(cluster, tmp_path):
    d = cluster
    live = snapshot(d, lambda o: run_of(o) in (RUNNING, RECENT) or run_of(o) is None
                    or "workflows.argoproj.io/workflow" in o["metadata"]["labels"] or o["kind"] == "Workflow")
    rc = run_step(janitor, janitor_args(tmp_path))
    v = json.loads((tmp_path / "janitor" / "verdict.json").read_text())
    assert rc == 0, v
    # over: the gone run and the long-finished one, every object (the bare pod too)
    assert not [k for k, o in d.objects.items() if run_of(o) in (GONE, OLD) and k != ("pods", "gauntlet",
                                                                                       "argo-step-of-gone")]
    # live or within grace, unlabelled, Argo's own step pod: byte for byte as before
    assert {k: s for k, s in snapshot(d, lambda o: True).items() if k in live} == live
    touched = [p for (m, p, _, _) in d.requests if m in ("PATCH", "DELETE")]
    assert touched and all(GONE[:8] in p or OLD[:8] in p or "bare-gone" in p for p in touched), touched
    checks = {c["name"]: c for c in v["checks"]}
    assert "its workflow is gone" in checks[f"run {GONE}"]["detail"]
    assert checks[f"run {GONE}"]["observed"][f"StatefulSet/g-sglang-{GONE[:8]}"] == "deleted"
    assert checks[f"run {GONE}"]["observed"]["Pod/bare-gone"] == "deleted"
    assert "Running" in checks[f"run {RUNNING}"]["detail"] and "grace" in checks[f"run {RECENT}"]["detail"]
    assert (tmp_path / "janitor" / GONE / "logs" / "bare-gone.c.log").is_file()
    assert (tmp_path / "janitor" / OLD / "objects.json").is_file()


def test_unreadable_workflows_release_nothing(cluster, tmp_path):
    d = cluster
    real = d.dispatch
    d.dispatch = lambda m, p, q, c, r: (d._status(403, "Forbidden", "workflows is forbidden") if "workflows" in p
                                        else real(m, p, q, c, r))
    before = snapshot(d, lambda o: True)
    rc = run_step(janitor, janitor_args(tmp_path))
    assert rc == 1
    assert snapshot(d, lambda o: True) == before
    v = json.loads((tmp_path / "janitor" / "verdict.json").read_text())
    assert "nothing released" in v["checks"][0]["detail"]


def test_nothing_labelled_is_a_pass(monkeypatch, tmp_path):
    with K8sDouble() as d:
        monkeypatch.setenv("GAUNTLET_KUBE_API", d.url)
        d.add(FOREIGN)
        assert run_step(janitor, janitor_args(tmp_path)) == 0
        assert [m for (m, _, _, _) in d.requests if m != "GET"] == []


# ------------------------------------------------------------------ local back end

def labelled_sleeper(engine_dir: Path) -> subprocess.Popen:
    env = {**os.environ, LABEL_DIR: str(engine_dir), "GAUNTLET_ENGINE_PORT": "1"}
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=env, start_new_session=True)


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.fixture
def runs(tmp_path):
    runs = (tmp_path / "runs").resolve()
    procs = []
    killed = runs / "20261203-010000"          # its runner was kill -9'd: the mark names a dead pid
    live = runs / "20261203-020000"            # its runner (this test process) is alive
    for run in (killed, live):
        (run / "vllm").mkdir(parents=True)
        procs.append(labelled_sleeper(run / "vllm"))
    (killed / MARK).write_text(json.dumps({"pid": dead_pid(), "start_ticks": 1}))
    mark_runner(live)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    deadline = time.monotonic() + 10
    while len(find_labelled(runs)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    yield runs, killed, live, procs, stranger
    for p in procs + [stranger]:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def test_local_janitor_stops_engines_of_dead_runners_only(runs):
    runs_dir, killed, live, (k_proc, l_proc), stranger = runs
    assert runner_alive(live) and not runner_alive(killed)
    r = subprocess.run([sys.executable, "-m", "gauntlet.workflows.cli", "janitor", "--backend", "local", "--runs-dir", str(runs_dir)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr + r.stdout
    assert k_proc.wait(timeout=30) is not None
    assert l_proc.poll() is None and stranger.poll() is None            # live run, unlabelled: untouched
    assert not find_labelled(killed) and find_labelled(live)
    assert not (killed / MARK).exists()
    v = json.loads(next((runs_dir / ".janitor").glob("*/verdict.json")).read_text())
    assert "runner is gone" in {c["name"]: c for c in v["checks"]}[f"run {killed.name}"]["detail"]


def test_gauntlet_run_sweeps_before_it_starts(runs, monkeypatch):
    """`gauntlet run` calls the same sweep, excluding its own run directory."""
    from gauntlet.steps.backends import BACKENDS
    runs_dir, killed, live, (k_proc, l_proc), _ = runs
    checks, metrics = BACKENDS["local"].janitor(runs_dir / "new" / ".janitor", runs_dir=runs_dir,
                                                exclude=runs_dir / "new")
    assert list(metrics["released"]) == [killed.name] and list(metrics["kept"]) == [live.name]
    assert k_proc.wait(timeout=30) is not None and l_proc.poll() is None


def test_runner_mark_survives_pid_reuse(tmp_path):
    mark_runner(tmp_path)
    assert runner_alive(tmp_path)
    data = json.loads((tmp_path / MARK).read_text())
    (tmp_path / MARK).write_text(json.dumps({**data, "start_ticks": data["start_ticks"] - 1}))
    assert not runner_alive(tmp_path)                                  # same pid, another process


RUNNER = """
import os, sys
from pathlib import Path
tests, repo = sys.argv[2], sys.argv[3]
sys.path[:0] = [tests, os.path.join(tests, "fakes"), repo]
from test_runner import PROFILE, fake_graph
from gauntlet.steps.backends.local.janitor import mark_runner
from gauntlet.workflows.local import Runner
run_dir = Path(sys.argv[1])
run_dir.mkdir(parents=True)
mods = {n: "gauntlet.steps.gates.cleanup" for n in ("fake-pass", "fake-fail", "fake-engine", "fake-teardown", "cleanup")}
env = {"PYTHONPATH": os.pathsep.join([os.path.join(tests, "fakes"), repo]), "FAKE_SLOW": "perf"}
runner = Runner(fake_graph(None), PROFILE, run_dir, {"engines": "vllm", "run-dir": str(run_dir)}, cli="fake_cli",
                steps=mods, cwd=Path(repo), env=env)
mark_runner(run_dir)          # what run_local does before it walks the graph
runner.run()
"""


def test_runner_killed_with_sigkill_then_the_local_janitor_leaves_nothing(tmp_path):
    """kill -9 of the runner during perf: the exit handler never runs, the engine outlives it; the janitor stops it."""
    tests = Path(__file__).resolve().parent
    runs_dir = (tmp_path / "runs").resolve()
    run_dir = runs_dir / "killed"
    proc = subprocess.Popen([sys.executable, "-c", RUNNER, str(run_dir), str(tests), str(tests.parent)],
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not ((run_dir / "vllm" / "perf").is_dir() and find_labelled(run_dir)) and time.monotonic() < deadline:
            time.sleep(0.1)
        engines = find_labelled(run_dir)
        assert engines, "the fake engine never came up"
        os.kill(proc.pid, signal.SIGKILL)                               # the runner, not its group
        proc.wait()
        time.sleep(0.5)
        assert find_labelled(run_dir) == engines                         # nobody cleaned up
        r = subprocess.run([sys.executable, "-m", "gauntlet.workflows.cli", "janitor", "--backend", "local", "--runs-dir", str(runs_dir)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr + r.stdout
        assert find_labelled(run_dir) == {}
        assert "runner is gone" in r.stdout
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)                          # the orphaned perf step
        except ProcessLookupError:
            pass
        stop_all(run_dir)                                                # nothing outlives a failed test
