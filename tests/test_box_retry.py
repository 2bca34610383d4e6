"""RETRY as users make it, on the box (marker ``argo``): the rendered kimi-k3-h20 template, ``engines=sglang``.

A gate of the engine sequence fails (its first attempt exits 1), the workflow ends Failed and its exit handler
releases the engine. Then ``argo retry`` (the UI's RETRY: only the failed nodes are reset, ``deploy`` stays
Succeeded) must end Succeeded with the engine redeployed by the retried gate (its evidence says so), a report
for the run, and nothing held afterwards. The engine gates (smoke, perf, longctx, experiment-baseline) run the
REAL step runner with only their judgement played (box/standin.py ``{"measure": "runner"}``), so the engine
check and the redeploy are the real code (steps/gates/engine_present.py). ``argo resubmit --memoized`` is refused by
the first engine gate it re-runs, in one line (Argo then leaves the workflow Running: ``argo stop`` ends it).
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from records import BUILD, merge_row

from box.scenarios import DONE, GPU_STANDINS, RUN_LABEL, outcome_from_workflow, requests_gpu, task_phases

pytestmark = [pytest.mark.argo, pytest.mark.xdist_group("retry")]   # the retries share one run


def _r(code: int = 0, **outputs: str) -> dict[str, Any]:
    """The real runner around a played judgement: exit ``code``, these outputs."""
    return {"measure": "runner", "exit": code, **({"outputs": outputs} if outputs else {})}


ENGINE_GATES = {"smoke": [_r()], "perf": [_r(unlock_C32="false")], "longctx": [_r(unlock_all_lower="false")],
                "experiment-baseline": [_r()]}
FAIL_THEN_PASS = {"smoke": [_r(1), _r()], "perf": [_r(1), _r(unlock_C32="false")],
                  "longctx": [_r(1), _r(unlock_all_lower="false")]}
_done: dict[str, dict[str, Any]] = {}


def _wf(bs, name: str) -> dict[str, Any]:
    return bs.box.request("GET", f"/apis/argoproj.io/v1alpha1/namespaces/{bs.ns}/workflows/{name}")[1]


def _wait(bs, name: str, timeout_s: float = 600, not_before: str | None = None) -> dict[str, Any]:
    """The workflow once finished (its exit handler included); ``not_before``: a finishedAt to see replaced."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        wf = _wf(bs, name)
        st = wf.get("status") if wf.get("kind") == "Workflow" else {}    # an API error: a Status, asked again
        st = st or {}
        if st.get("phase") in DONE and st.get("finishedAt") and st.get("finishedAt") != not_before:
            return wf
        time.sleep(1)
    raise AssertionError(f"{name}: not finished after {timeout_s:.0f}s: {str(wf.get('status'))[:300]}")


def _argo(bs, *argv: str) -> str:
    r = bs.box.argo(*argv)
    assert r.returncode == 0, f"argo {' '.join(argv)}: {r.stderr.strip() or r.stdout.strip()}"
    return r.stdout


def _failed_run(bs, gate: str) -> dict[str, Any]:
    """Submit with ``gate`` failing once; the Failed workflow, its exit handler done."""
    bs.kubelet.set_standins({**GPU_STANDINS, **ENGINE_GATES, f"sglang/{gate}": FAIL_THEN_PASS[gate]})
    argv = ["submit", "-n", bs.ns, "--from", f"workflowtemplate/{_template(bs)}", "-o", "name",
            "-p", "engines=sglang", "-p", "results-uri=/runs/results", "-p", "retry-backoff=1s"]
    name = _argo(bs, *argv).strip().split("/")[-1]
    wf = _wait(bs, name)
    out = outcome_from_workflow(wf, list(bs.pods_seen.values()))
    assert out.phase == "Failed" and out.tasks[f"sglang/{gate}"] == "Failed", out.tasks
    assert out.tasks["cleanup"] == "Succeeded" and bs.held(out.uid) == {}, "the exit handler released the engine"
    return wf


def _template(bs) -> str:
    from gauntlet.workflows.render import template_name
    return template_name(bs.profile)


def _run_dir(bs, uid: str):
    return bs.pvc_root / "pvc" / bs.ns / bs.profile.runs_pvc / uid


def _verdict(bs, uid: str, path: str) -> dict[str, Any]:
    return json.loads((_run_dir(bs, uid) / path / "verdict.json").read_text())


def _retried(bs, key: str, gate: str, *retry_args: str) -> tuple[dict[str, Any], Any]:
    if key not in _done:
        wf = _failed_run(bs, gate)
        name = wf["metadata"]["name"]
        t0 = time.monotonic()
        _argo(bs, "retry", "-n", bs.ns, name, *retry_args)
        again = _wait(bs, name, not_before=wf["status"]["finishedAt"])
        out = outcome_from_workflow(again, list(bs.pods_seen.values()))
        out.seconds = round(time.monotonic() - t0, 1)
        out.labelled_left = bs.held(out.uid)
        _done[key] = {"wf": again, "out": out}
        _record(key, out)
    return _done[key]["wf"], _done[key]["out"]


def _record(key: str, out: Any, **extra: Any) -> None:
    """What Argo showed, for docs/cluster.md ("Retrying, resubmitting, stopping and deleting a run")."""
    merge_row(BUILD / "box-retry.json", key, {"phase": out.phase, "seconds": out.seconds, "tasks": out.tasks,
                                              "attempts": out.attempts, "held_after": out.labelled_left, **extra})


def _assert_redeployed_and_released(bs, out: Any, gate: str) -> None:
    assert out.phase == "Succeeded", out.tasks
    assert out.attempts["sglang/deploy"] == [0] and _pods(bs, out.name, "sglang.deploy") == 1, "deploy not re-run"
    v = _verdict(bs, out.uid, f"sglang/{gate}")
    present = {c["name"]: c for c in v["checks"]}["engine_present"]
    assert present["status"] == "pass" and present["detail"].startswith(
        f"engine absent at the start of {gate} (released by the exit handler of an earlier attempt): "
        "redeployed, ready in "), present
    assert {c["name"]: c for c in v["checks"]}["engine_ranks"]["status"] == "pass"
    assert _verdict(bs, out.uid, "report")["status"] == "pass"
    assert out.tasks["cleanup"] == "Succeeded" and out.labelled_left == {}, out.labelled_left


@pytest.mark.parametrize("gate", ["smoke", "perf", "longctx"])
def test_argo_retry_redeploys_the_released_engine(box_session, gate):
    _, out = _retried(box_session, f"retry-at-{gate}", gate)
    _assert_redeployed_and_released(box_session, out, gate)
    # the gates after the retried one found the engine up: no second redeploy
    later = {"smoke": "sglang/perf", "perf": "sglang/longctx", "longctx": None}[gate]
    if later:
        checks = {c["name"] for c in _verdict(box_session, out.uid, later)["checks"]}
        assert "engine_present" not in checks and "engine_ranks" in checks
    # Gate 6 after a retry: the baseline released before the variants, the sequence's teardown ends it
    for t in ("sglang/release-baseline", "sglang/teardown"):
        assert out.tasks[t] == "Succeeded", out.tasks


def test_argo_retry_restart_successful_redeploys_too(box_session):
    """The UI's RETRY with "restart successful" and a node selector: smoke (Succeeded) and what follows re-run."""
    _, out = _retried(box_session, "retry-restart-successful-at-perf", "perf",
                      "--restart-successful", "--node-field-selector", "displayName=smoke")
    _assert_redeployed_and_released(box_session, out, "smoke")
    # Argo replaces a restarted node (one attempt in its status): count the pods instead
    assert _pods(box_session, out.name, "sglang.smoke") == 2 and _pods(box_session, out.name, "sglang.deploy") == 1


def _pods(bs, workflow: str, node: str) -> int:
    """How many pods the workflow ever ran for ``node`` (``sglang.smoke``)."""
    return sum(1 for p in bs.pods_seen.values()
               if (p["metadata"].get("annotations") or {}).get("workflows.argoproj.io/node-name", "")
               .startswith(f"{workflow}.{node}("))


def _main_exit(pod: dict[str, Any]) -> int | None:
    """The exit code of a pod's ``main`` container, as the kubelet reported it."""
    for c in (pod.get("status") or {}).get("containerStatuses") or []:
        if c.get("name") == "main":
            return ((c.get("state") or {}).get("terminated") or {}).get("exitCode")
    return None


def test_argo_resubmit_memoized_is_refused_in_one_line(box_session):
    """``argo resubmit --memoized`` of a run whose smoke failed. Argo keeps every Succeeded pod node as Skipped
    ("original pod", deploy with the first run's endpoint) and resets the rest, the sequence's teardown, regress
    and report that ran after the failure included. The re-run smoke refuses in one line (exit 2): this run has
    no deploy of its own. Argo v4.0.5 then ends the run in Error by itself ("node <wf>.sglang.teardown already
    initialized": the reset teardown clashes with its copy; before teardown ran after a failure, Argo kept the
    run Running with prewarm Pending until ``argo stop``). No engine pod is created and nothing is held."""
    bs = box_session
    if "memoized" not in _done:
        wf = _failed_run(bs, "smoke")
        before = set(bs.pods_seen)
        text = _argo(bs, "resubmit", "--memoized", "-n", bs.ns, wf["metadata"]["name"], "-o", "name")
        name = text.strip().splitlines()[-1].split("/")[-1]

        def refused() -> dict[str, Any] | None:     # the re-run smoke's pod, once its main container ended
            # pods_seen holds each pod as first seen (Pending): its later versions are in the watch's events
            return next((p for _, _, p in list(bs.pod_events) if p["metadata"]["uid"] not in before
                         and ".sglang.smoke(" in
                         (p["metadata"].get("annotations") or {}).get("workflows.argoproj.io/node-name", "")
                         and _main_exit(p) is not None), None)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and refused() is None:
            time.sleep(1)
        time.sleep(20)
        now = _wf(bs, name)["status"]
        stuck = task_phases(now)
        ended_by_itself = bool(now.get("finishedAt"))
        r = bs.box.argo("logs", "-n", bs.ns, name)
        if not ended_by_itself:         # Argo refuses to stop a finished workflow
            _argo(bs, "stop", "-n", bs.ns, name)
        again = _wait(bs, name)
        out = outcome_from_workflow(again, list(bs.pods_seen.values()))
        out.labelled_left = bs.held(out.uid)
        out.gpu_pods = sorted(p["metadata"]["name"] for u, p in bs.pods_seen.items() if u not in before
                              and (p["metadata"].get("labels") or {}).get(RUN_LABEL) == out.uid and requests_gpu(p))
        pod = refused()
        message = (again.get("status") or {}).get("message")
        _done["memoized"] = {"out": out, "logs": r.stdout + r.stderr, "stuck": stuck, "by_itself": ended_by_itself,
                             "smoke_exit": _main_exit(pod) if pod else None, "message": message}
        _record("resubmit-memoized", out, stuck_before_stop=stuck, ended_by_itself=ended_by_itself,
                message=message, smoke_exit=_done["memoized"]["smoke_exit"])
    m = _done["memoized"]
    out, logs, stuck, ended_by_itself = m["out"], m["logs"], m["stuck"], m["by_itself"]
    assert m["smoke_exit"] == 2, m                          # refused: exit 2, no engine deployed
    lines = [ln for ln in logs.splitlines() if "UsageError: smoke:" in ln]
    assert len(lines) == 1 and "resubmit without --memoized" in lines[0], logs[-2000:]
    assert out.gpu_pods == [] and out.labelled_left == {}, (out.gpu_pods, out.labelled_left)
    # what a user sees (docs/cluster.md): Argo ends the run itself, in Error, naming the reset teardown
    assert ended_by_itself and out.phase == "Error", (out.phase, stuck)
    assert "sglang.teardown already initialized" in (m["message"] or ""), m["message"]
