"""Two nights in a row on the control plane in a box (marker ``argo``): the nightly CronWorkflow as rendered,
fired by Argo's own cron controller, submitting the nightly WorkflowTemplate as rendered.

Night 1 outlives its window: its perf gate sits for longer than the window inside the real step runner, so
the run's window (steps/window.py: Argo's deadline less the reserve kept for teardown, regress and report)
stops it; the night must still tear down, report, give the GPUs back through its exit handler, and the next
night must run. Night 2 is a normal night and must succeed. With ``concurrencyPolicy: Forbid``
and the pool's mutex, the second night cannot start while the first holds the pool: the test shows it did
start, after the first released everything it held.

What is scaled, and why (the only changes to the rendered objects): the box's stand-ins run a night in one
to four minutes, not hours, so the CronWorkflow's schedule becomes every minute and the nightly template's
activeDeadlineSeconds becomes ``GAUNTLET_NIGHTLY_WINDOW_S`` (420 s) instead of nightly.window_h, its gates'
window reserve 150 s instead of the plan's cluster figure, and the
nights get the box's results store (``results-uri=/runs/results``: the box has no S3) and a 1 s retry backoff,
as every box scenario does; all of it is put back when the test ends. No H20 node can run here: GPU gates are played by the box's stand-ins (as in
tests/test_box_faults.py); deploy, teardown and cleanup run for real against the box's API server.
"""

from __future__ import annotations

import calendar
import copy
import json
import os
import time
from typing import Any

import pytest
from test_box_faults import (cleanup_verdict, engine_held, outcome, ran_whatever_happened, set_reserve, until, wait_done,
                             wait_running, workflow)

from box.scenarios import GPU_STANDINS
from gauntlet.workflows.render import RUN_KIND_LABEL, cron_name, template_name

pytestmark = [pytest.mark.argo, pytest.mark.xdist_group("box-nightly-two-nights")]

CRON_LABEL = "workflows.argoproj.io/cron-workflow"     # what Argo's cron controller puts on each night
RESERVE_S = 150                                         # the window's reserve, scaled to the box's steps


def _doc(s, kind: str, name: str) -> dict[str, Any]:
    return next(d for doc in s.docs.values() for d in (doc if isinstance(doc, list) else [doc])
                if d.get("kind") == kind and d["metadata"]["name"] == name)


def _nights(s) -> list[dict[str, Any]]:
    """The workflows the nightly CronWorkflow created, oldest first."""
    sel = f"labelSelector={CRON_LABEL}%3D{cron_name(s.profile)}"
    status, body = s.box.request("GET", f"/apis/argoproj.io/v1alpha1/namespaces/{s.ns}/workflows?{sel}")
    assert status == 200, body
    return sorted(body.get("items", []), key=lambda w: w["metadata"]["creationTimestamp"] + w["metadata"]["name"])


def _epoch(ts: str) -> float:
    return calendar.timegm(time.strptime(ts, "%Y-%m-%dT%H:%M:%SZ"))


def test_two_nights_in_a_row_the_first_outliving_its_window(box_session):
    s = box_session
    window_s = int(os.environ.get("GAUNTLET_NIGHTLY_WINDOW_S", "420"))
    cron = _doc(s, "CronWorkflow", cron_name(s.profile))
    template = _doc(s, "WorkflowTemplate", template_name(s.profile, "nightly"))
    assert cron["spec"]["workflowSpec"]["workflowTemplateRef"] == {"name": template["metadata"]["name"]}
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    before = {w["metadata"]["name"] for w in _nights(s)}
    fast_cron, short_template = copy.deepcopy(cron), copy.deepcopy(template)
    fast_cron["spec"]["schedules"] = ["* * * * *"]
    fast_cron["spec"]["workflowSpec"]["arguments"]["parameters"] += [
        {"name": "results-uri", "value": "/runs/results"}, {"name": "retry-backoff", "value": "1s"}]
    short_template["spec"]["activeDeadlineSeconds"] = window_s
    set_reserve(short_template, RESERVE_S)
    # night 1: perf sits past the window (the real runner, its gate's judgement played for 900 s)
    s.kubelet.set_standins({**GPU_STANDINS, "sglang/perf": [{"measure": "runner", "exit": 0, "after_s": 900}]})
    try:
        s.box.apply(short_template)
        s.box.apply(fast_cron)
        night1 = until(lambda: next((w for w in _nights(s) if w["metadata"]["name"] not in before), None),
                       150, "the cron's first night")
        name1, uid1 = night1["metadata"]["name"], night1["metadata"]["uid"]
        # the controller applies the template's workflowMetadata labels once it operates the night
        labels = until(lambda: workflow(s, name1)["metadata"].get("labels", {}).get(RUN_KIND_LABEL), 120,
                       f"night 1's {RUN_KIND_LABEL} label")
        assert labels == "nightly"
        wait_running(s, name1, "sglang/perf", timeout_s=window_s)
        assert engine_held(s, uid1), f"night 1 holds its engine in perf: {s.held(uid1)}"
        s.kubelet.set_standins(dict(GPU_STANDINS))       # the next night is a normal one
        # no second night while the first holds the pool (Forbid), though the schedule fires every minute
        wf1 = wait_done(s, name1, timeout_s=window_s + 300)
        assert [w["metadata"]["name"] for w in _nights(s) if w["metadata"]["name"] not in before] == [name1]
        out1 = outcome(s, wf1)
        assert out1.phase == "Failed", out1.tasks
        st1 = wf1["status"]
        lasted = _epoch(st1["finishedAt"]) - _epoch(st1["startedAt"])
        # the window stopped perf (steps/window.py) and the night still tore down, judged and reported
        perf = json.loads((out1.run_dir / "sglang" / "perf" / "verdict.json").read_text())
        assert [c["name"] for c in perf["checks"]] == ["window"], perf["checks"]
        for task in ("regress", "report"):
            ran_whatever_happened(out1, task)
        assert (out1.run_dir / "report.md").exists(), out1.tasks
        assert lasted <= window_s + 30, f"night 1 lasted {lasted:.0f} s, its window is {window_s} s"
        until(lambda: s.held(uid1) == {}, 120, f"night 1 released (held: {s.held(uid1)})")
        released1 = time.time()
        verdict = out1.run_dir / "cleanup" / "verdict.json"
        until(verdict.exists, 60, f"night 1's exit handler verdict {verdict}")
        assert cleanup_verdict(out1)["status"] == "pass"

        night2 = until(lambda: next((w for w in _nights(s) if w["metadata"]["name"] not in before | {name1}), None),
                       180, "the cron's second night")
        name2, uid2 = night2["metadata"]["name"], night2["metadata"]["uid"]
        wf2 = wait_done(s, name2, timeout_s=window_s + 120)
        out2 = outcome(s, wf2)
        assert out2.phase == "Succeeded", out2.tasks
        assert out2.tasks.get("sglang/perf") == "Succeeded" and out2.tasks.get("regress") == "Succeeded", out2.tasks
        assert "sglang/longctx" not in out2.tasks and "vllm" not in out2.tasks, sorted(out2.tasks)
        assert _epoch(wf2["status"]["startedAt"]) >= _epoch(st1["finishedAt"])
        assert _epoch(night2["metadata"]["creationTimestamp"]) >= released1 - 60
        until(lambda: s.held(uid2) == {}, 120, f"night 2 released (held: {s.held(uid2)})")
        report = (out2.run_dir / "report.md").read_text()
        assert "## What this nightly left out" in report and "Gate 5 long context" in report, report[:2000]
    finally:
        s.kubelet.set_standins(dict(GPU_STANDINS))
        s.box.apply(template)
        s.box.apply(cron)
        # a night still running when the test failed: stopped (its exit handler runs), so no later test waits on
        # the pool's mutex behind it
        for w in _nights(s):
            if w["metadata"]["name"] not in before and not (w.get("status") or {}).get("finishedAt"):
                s.box.argo("stop", "-n", s.ns, w["metadata"]["name"])
