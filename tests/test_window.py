"""The run's window (steps/window.py): a gate stops itself before Argo's workflow deadline.

Argo's side is read from its code (v4.0.5 workflow/controller/workflowpod.go: every container gets
``ARGO_DEADLINE``, the zero time in an exit handler's pods) and shown on the box
(tests/test_box_faults.py::test_active_deadline_reached_exit_handler_cleans); here the runner's side: the real
``gauntlet step`` CLI, and the runner around a gate that sits, with the real SIGALRM timer.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import types
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gauntlet.contract import Check
from gauntlet.params import load_profile
from gauntlet.steps import STEPS, needs_of
from gauntlet.steps.gate import Needs
from gauntlet.steps.options import GateOptions
from gauntlet.steps.runner import run_step
from gauntlet.steps.window import DEADLINE_ENV, RESERVE_ENV, window_of
from gauntlet.workflows.plan import window_reserve_s
from gauntlet.workflows.render import render_documents

REPO = Path(__file__).resolve().parents[1]
AFTER_WINDOW = {"teardown", "regress", "report", "cleanup", "janitor"}


def _iso(dt: datetime) -> str:
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_window_from_argo_env():
    now = datetime.now(UTC).replace(microsecond=0)
    w = window_of({DEADLINE_ENV: _iso(now + timedelta(seconds=1000)), RESERVE_ENV: "300"})
    assert w is not None and w.reserve_s == 300
    assert abs(w.ends - (now.timestamp() + 700)) < 1e-6
    assert 690 < w.left_s() <= 700
    # an exit handler's pod: Go's zero time; a local run: nothing; garbage: no window (Argo's stays)
    assert window_of({DEADLINE_ENV: "0001-01-01T00:00:00Z", RESERVE_ENV: "300"}) is None
    assert window_of({}) is None
    assert window_of({DEADLINE_ENV: "tomorrow"}) is None
    assert window_of({DEADLINE_ENV: _iso(now), RESERVE_ENV: "x"}).reserve_s == 0


def test_only_the_release_and_the_record_run_past_the_window():
    outside = {name for name in STEPS if not needs_of(name).windowed}
    assert outside == AFTER_WINDOW


def test_a_spent_window_fails_the_real_step_at_once(tmp_path):
    """``gauntlet step preflight-compare`` with Argo's deadline 10 s ahead and 600 s reserved: it never reads
    its inputs (which do not exist) and fails naming the window, exit 1, a verdict written."""
    out = tmp_path / "out"
    env = {**os.environ, DEADLINE_ENV: _iso(datetime.now(UTC) + timedelta(seconds=10)), RESERVE_ENV: "600"}
    p = subprocess.run([sys.executable, "-m", "gauntlet.workflows.cli", "step", "preflight-compare",
                        "--profile", "local-cpu", "--inputs", str(tmp_path / "absent"), "--out", str(out)],
                       env=env, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert p.returncode == 1, p.stderr
    assert "Traceback" not in p.stderr and "window" in p.stderr, p.stderr
    v = json.loads((out / "verdict.json").read_text())
    assert v["status"] == "fail" and [c["name"] for c in v["checks"]] == ["window"], v
    assert "never started" in v["checks"][0]["observed"]
    assert (out / "outputs" / "verdict").read_text() == "fail"
    # the same step without Argo's deadline judges its inputs (and fails on them, not on a window)
    p = subprocess.run([sys.executable, "-m", "gauntlet.workflows.cli", "step", "preflight-compare",
                        "--profile", "local-cpu", "--inputs", str(tmp_path / "absent"), "--out", str(out)],
                       env={k: v for k, v in os.environ.items() if k != DEADLINE_ENV}, capture_output=True,
                       text=True, timeout=120, cwd=REPO)
    v = json.loads((out / "verdict.json").read_text())
    assert [c["name"] for c in v["checks"]] != ["window"], v


@dataclass(frozen=True, kw_only=True)
class _Opts(GateOptions):
    pass


def _gate(windowed: bool, sits_s: float, swallow: bool = False) -> types.ModuleType:
    """A gate that sits (as perf does while its client runs); ``swallow``: it catches Exception around it."""
    mod = types.ModuleType("sitting_gate")
    mod.NAME, mod.HELP, mod.Options = "sitting", "sits", _Opts
    mod.NEEDS = Needs(profile=False, windowed=windowed)
    mod.calls = 0

    def run(opts, out):  # noqa: ANN001, ARG001
        mod.calls += 1
        t0 = time.monotonic()
        while time.monotonic() - t0 < sits_s:
            try:
                time.sleep(0.05)
            except Exception:  # noqa: BLE001 - a gate that swallows what it can
                if not swallow:
                    raise
        return [Check("sat", "pass", None, None, "sat it out")], {}

    mod.run = run
    return mod


def _args(out: Path) -> argparse.Namespace:
    return argparse.Namespace(out=str(out), profile=None)


def test_the_timer_stops_a_gate_that_outlives_the_window(tmp_path, monkeypatch):
    deadline = datetime.now(UTC) + timedelta(seconds=3)
    monkeypatch.setenv(DEADLINE_ENV, deadline.isoformat().replace("+00:00", "Z"))
    monkeypatch.setenv(RESERVE_ENV, "1")
    gate = _gate(windowed=True, sits_s=30, swallow=True)
    t0 = time.monotonic()
    code = run_step(gate, _args(tmp_path))
    took = time.monotonic() - t0
    assert code == 1 and gate.calls == 1
    assert took < 5, f"the window ended about 2 s in; the gate ran {took:.1f} s"
    v = json.loads((tmp_path / "verdict.json").read_text())
    assert v["status"] == "fail" and v["checks"][0]["name"] == "window" and "stopped after" in v["checks"][0]["observed"]
    assert v["metrics"]["window"]["reserve_s"] == 1
    # the timer is disarmed afterwards: nothing fires in the test process later
    time.sleep(0.2)


def test_a_step_past_the_window_still_runs_when_it_releases(tmp_path, monkeypatch):
    monkeypatch.setenv(DEADLINE_ENV, _iso(datetime.now(UTC) - timedelta(seconds=60)))
    gate = _gate(windowed=False, sits_s=0.1)
    assert run_step(gate, _args(tmp_path)) == 0 and gate.calls == 1
    gate = _gate(windowed=True, sits_s=0.1)
    assert run_step(gate, _args(tmp_path)) == 1 and gate.calls == 0


@pytest.mark.parametrize("profile", ["kimi-k3-h20"])
def test_render_reserves_the_window_on_every_gate_but_the_release(profile):
    prof = load_profile(profile)
    reserve = window_reserve_s(prof)
    assert reserve >= 540          # teardown 300 + regress 120 + report 120 on a cluster, with the margin
    seen: dict[str, set[str]] = {"with": set(), "without": set()}
    for doc in render_documents(prof).values():
        for d in doc if isinstance(doc, list) else [doc]:
            if d.get("kind") != "WorkflowTemplate":
                continue
            for t in d["spec"]["templates"]:
                c = t.get("container")
                if not c or "step" not in (c.get("args") or []):
                    continue
                step = c["args"][c["args"].index("step") + 1]
                env = {e["name"]: e.get("value") for e in c.get("env", [])}
                if RESERVE_ENV in env:
                    assert env[RESERVE_ENV] == str(reserve), (t["name"], env[RESERVE_ENV])
                    seen["with"].add(step)
                else:
                    seen["without"].add(step)
    assert seen["without"] == AFTER_WINDOW - {"janitor"}, seen
    assert {"perf", "smoke", "deploy", "engine-check", "nodes"} <= seen["with"], seen
