"""The fault table's local rows: the runner killed with SIGKILL during deploy, perf and cleanup.

The runner walks tests/test_runner.py's fake graph with the fake steps of tests/fakes/ (a real detached,
labelled fake engine; the real cleanup step) and marks its run directory as ``gauntlet run`` does. It is
killed with SIGKILL (the runner's pid only, as the OOM killer or ``kill -9`` would) while the engine is up
and the named step runs: its exit handler never runs and the engine outlives it. Then the release path
of the next run (:func:`gauntlet.steps.backends.local.janitor.sweep`, what ``gauntlet run`` calls before it starts) or
``gauntlet janitor --backend local`` must leave no labelled engine running. Seconds from the kill to released are
merged into build/fault-timings.json (docs/reliability.md).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from records import merge_row

from gauntlet.steps.backends.local.deploy import find_labelled, stop_all
from gauntlet.steps.backends.local.janitor import sweep

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
TIMINGS = REPO / "build" / "fault-timings.json"

RUNNER = """
import os, sys
from pathlib import Path
tests, repo, fail_at = sys.argv[2], sys.argv[3], sys.argv[4] or None
sys.path[:0] = [tests, os.path.join(tests, "fakes"), repo]
from test_runner import PROFILE, fake_graph
from gauntlet.steps.backends.local.janitor import mark_runner
from gauntlet.workflows.local import Runner
run_dir = Path(sys.argv[1])
run_dir.mkdir(parents=True)
mods = {n: "gauntlet.steps.gates.cleanup" for n in ("fake-pass", "fake-fail", "fake-engine", "fake-teardown", "cleanup")}
env = {"PYTHONPATH": os.pathsep.join([os.path.join(tests, "fakes"), repo])}
runner = Runner(fake_graph(fail_at), PROFILE, run_dir, {"engines": "vllm", "run-dir": str(run_dir)}, cli="fake_cli",
                steps=mods, cwd=Path(repo), env=env)
mark_runner(run_dir)          # what run_local does before it walks the graph
runner.run()
"""

# step killed in -> (env that holds the run in it with the engine up, failing gate, the directory it writes)
POINTS = {
    "deploy": ({"FAKE_SLOW_AFTER": "deploy"}, None, "vllm/deploy"),
    "perf": ({"FAKE_SLOW": "perf"}, None, "vllm/perf"),
    # smoke fails, so teardown is omitted and the engine is still up when the exit handler starts
    "cleanup": ({"FAKE_SLOW": "cleanup"}, "smoke", "cleanup"),
}


def record(row: str, **fields: object) -> None:
    merge_row(TIMINGS, row, {**fields, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    print(f"fault {row}: {json.dumps(fields, sort_keys=True)}")


@pytest.mark.parametrize("releaser", ["janitor", "next-run"])
@pytest.mark.parametrize("point", sorted(POINTS))
def test_runner_sigkill_then_nothing_left_running(tmp_path, point, releaser):
    env_extra, fail_at, marker = POINTS[point]
    runs_dir = (tmp_path / "runs").resolve()
    run_dir = runs_dir / "killed"
    proc = subprocess.Popen([sys.executable, "-c", RUNNER, str(run_dir), str(TESTS), str(REPO), fail_at or ""],
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, **env_extra})
    try:
        deadline = time.monotonic() + 90
        while not ((run_dir / marker).is_dir() and find_labelled(run_dir)) and time.monotonic() < deadline:
            assert proc.poll() is None, f"the runner ended ({proc.returncode}) before {point}"
            time.sleep(0.1)
        engines = find_labelled(run_dir)
        assert engines and (run_dir / marker).is_dir(), f"never reached {point} with the engine up"
        if point == "cleanup":
            assert not (run_dir / "cleanup" / "verdict.json").exists()      # killed before cleanup released
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGKILL)                               # the runner, not its group
        proc.wait()
        time.sleep(0.5)
        assert find_labelled(run_dir) == engines, "something released the engine without the janitor"
        if releaser == "janitor":
            r = subprocess.run([sys.executable, "-m", "gauntlet.workflows.cli", "janitor", "--backend", "local", "--runs-dir",
                                str(runs_dir)], capture_output=True, text=True, timeout=120, cwd=REPO)
            assert r.returncode == 0, r.stderr + r.stdout
            assert "runner is gone" in r.stdout
        else:                                   # what the next `gauntlet run` does before its first gate
            nxt = runs_dir / "next"
            checks, metrics = sweep(runs_dir, nxt / ".janitor", exclude=nxt)
            assert list(metrics["released"]) == ["killed"], metrics
        assert find_labelled(run_dir) == {}
        record(f"local-sigkill-{point}-{releaser}", backend="local", released=True,
               seconds=round(time.monotonic() - t0, 1), engines=len(engines))
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)                          # the orphaned step the runner ran
        except ProcessLookupError:
            pass
        stop_all(run_dir)                                                # nothing outlives a failed test
