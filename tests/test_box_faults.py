"""The fault table on the control plane in a box (marker ``argo``): does every fault give the GPUs back?

Each test submits the rendered kimi-k3-h20 template (``engines=sglang``, ``retry-backoff=1s``, GPU gates
played by fast stand-ins, deploy, teardown and cleanup for real), injects one fault as soon as the run
reaches the state the fault needs, and ends by asserting FROM THE API SERVER that nothing labelled
``gauntlet.dev/run=<workflow uid>`` still holds a replica (``BoxSession.held(uid) == {}``). The seconds
from the fault to "released" are measured and written to ``build/fault-timings.json`` (one entry per row,
merged across runs) and printed; docs/reliability.md copies them.

Where Argo v4.0.5 behaves differently from what issue 11 expected, the test asserts what Argo does
(read in workflow/controller/operator.go of the v4.0.5 module) and docs/reliability.md says so.
"""

from __future__ import annotations

import copy
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from records import merge_row

from box.scenarios import GPU_STANDINS, outcome_from_workflow, running, task_phases
from gauntlet.steps.window import RESERVE_ENV
from gauntlet.workflows.render import RUN_LABEL, template_name

pytestmark = pytest.mark.argo

REPO = Path(__file__).resolve().parents[1]
TIMINGS = REPO / "build" / "fault-timings.json"
PARAMS = {"engines": "sglang", "results-uri": "/runs/results", "retry-backoff": "1s"}
PASS = {"exit": 0}
FAIL = {"exit": 1}
LONG_PERF = {"sglang/perf": [{"exit": 0, "after_s": 300}]}     # the run sits in perf until the fault


# ------------------------------------------------------------------ helpers

def record(row: str, **fields: Any) -> None:
    """Merge one row's measurement into build/fault-timings.json (and print it for -s)."""
    merge_row(TIMINGS, row, {**fields, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    print(f"fault {row}: {json.dumps(fields, sort_keys=True)}")


def submit_async(s, plays: dict[str, list[dict[str, Any]]] | None = None, **params: str) -> str:
    """Submit the template with the real CLI (stand-ins set first); the workflow's name, at once."""
    s.kubelet.set_standins({**GPU_STANDINS, **(plays or {})})
    argv = ["submit", "-n", s.ns, "--from", f"workflowtemplate/{template_name(s.profile)}", "-o", "name"]
    for k, v in {**PARAMS, **params}.items():
        argv += ["-p", f"{k}={v}"]
    r = s.box.argo(*argv)
    assert r.returncode == 0, f"argo submit: {r.stderr or r.stdout}"
    return r.stdout.strip().split("/")[-1]


def workflow(s, name: str) -> dict[str, Any]:
    status, wf = s.box.request("GET", f"/apis/argoproj.io/v1alpha1/namespaces/{s.ns}/workflows/{name}")
    assert status == 200, f"GET workflow {name}: {status} {wf}"
    return wf


def until(pred: Any, timeout_s: float, what: str, poll_s: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what} (last: {last})")


def wait_running(s, name: str, path: str, timeout_s: float = 400) -> dict[str, Any]:
    """Until the task's pod node (``perf(0)``, not only its Retry node) is Running in the workflow's status:
    Argo re-creates the pod of a node it still sees Pending, so a fault injected earlier is a different fault."""
    attempt = path.rsplit("/", 1)[-1] + "("

    def check() -> dict[str, Any] | None:
        wf = workflow(s, name)
        st = wf.get("status") or {}
        assert st.get("phase") not in ("Succeeded", "Failed", "Error"), \
            f"{name} ended {st.get('phase')} before {path} ran: {task_phases(st)}"
        pod_running = any(n.get("type") == "Pod" and n["displayName"].startswith(attempt) and n["phase"] == "Running"
                          for n in (st.get("nodes") or {}).values())
        return wf if running(st, path) and pod_running else None
    return until(check, timeout_s, f"{name}: {path} Running", poll_s=1)


def wait_done(s, name: str, timeout_s: float = 400) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        wf = workflow(s, name)
        st = wf.get("status") or {}
        return wf if st.get("phase") in ("Succeeded", "Failed", "Error") and st.get("finishedAt") else None
    return until(check, timeout_s, f"{name} finished", poll_s=1)


def wait_released(s, uid: str, timeout_s: float = 120) -> float:
    """Poll the API server until nothing labelled with the run holds a replica; the monotonic time it did."""
    until(lambda: s.held(uid) == {}, timeout_s, f"run {uid} released (held: {s.held(uid)})")
    return time.monotonic()


def engine_held(s, uid: str) -> dict[str, int]:
    return {k: v for k, v in s.held(uid).items() if k.startswith("StatefulSet/")}


def run_janitor(s, grace: str = "0s") -> dict[str, Any]:
    """The janitor as its schedule would run it: submitted from its CronWorkflow; its finished Workflow."""
    r = s.box.argo("submit", "-n", s.ns, "--from", "cronwf/gauntlet-janitor", "-p", f"grace={grace}", "-o", "name")
    assert r.returncode == 0, f"argo submit janitor: {r.stderr or r.stdout}"
    wf = wait_done(s, r.stdout.strip().split("/")[-1], timeout_s=240)
    assert wf["status"]["phase"] == "Succeeded", f"janitor {wf['status'].get('phase')}: {wf['status'].get('message')}"
    return wf


def pods_of(s, name: str) -> list[dict[str, Any]]:
    _, pods = s.box.request("GET", f"/api/v1/namespaces/{s.ns}/pods?labelSelector=workflows.argoproj.io"
                                   f"%2Fworkflow%3D{name}")
    return pods.get("items", [])


def step_pod(s, name: str, path: str) -> dict[str, Any]:
    node = f"{name}.{path.replace('/', '.')}"
    found = [p for p in pods_of(s, name)
             if (p["metadata"].get("annotations") or {}).get("workflows.argoproj.io/node-name", "").startswith(node)
             and not p["metadata"].get("deletionTimestamp")]
    assert found, f"no pod for {path} of {name}"
    return found[-1]


def outcome(s, wf: dict[str, Any]):
    out = outcome_from_workflow(wf, list(s.pods_seen.values()))
    out.run_dir = s.pvc_root / "pvc" / s.ns / s.profile.runs_pvc / wf["metadata"]["uid"]
    return out


def cleanup_verdict(out) -> dict[str, Any]:
    return json.loads((out.run_dir / "cleanup" / "verdict.json").read_text())


# ------------------------------------------------------------------ the rows

def test_terminate_mid_run_janitor_releases(box_session):
    """`argo terminate` skips the exit handler: the engine stays up until the janitor (grace 0s) releases it."""
    s = box_session
    name = submit_async(s, LONG_PERF)
    wf = wait_running(s, name, "sglang/perf")
    uid = wf["metadata"]["uid"]
    assert engine_held(s, uid), f"deploy made no engine StatefulSet: {s.held(uid)}"
    t0 = time.monotonic()
    r = s.box.argo("terminate", "-n", s.ns, name)
    assert r.returncode == 0, r.stderr
    wf = wait_done(s, name)
    out = outcome(s, wf)
    assert out.phase == "Failed", out.tasks
    assert "cleanup" not in out.tasks, f"an exit handler ran after argo terminate: {out.tasks}"
    held_after_terminate = s.held(uid)
    assert engine_held(s, uid), f"terminate alone released the engine: {held_after_terminate}"
    janitor = run_janitor(s)
    released = wait_released(s, uid, timeout_s=30)
    verdict = json.loads((s.pvc_root / "pvc" / s.ns / s.profile.runs_pvc / "janitor" / janitor["metadata"]["name"]
                          / "verdict.json").read_text())
    assert uid in json.dumps(verdict), verdict
    record("terminate", backend="argo", released=True, seconds=round(released - t0, 1),
           held_after_fault=held_after_terminate, how="janitor from cronwf/gauntlet-janitor, grace=0s",
           note="plus up to one janitor period (5 min) and the grace (10 min) on a real schedule")


def test_controller_killed_mid_run_finishes_and_cleans(box_session):
    s = box_session
    name = submit_async(s, {"sglang/perf": [{"exit": 0, "after_s": 20}]})
    wf = wait_running(s, name, "sglang/perf")
    uid = wf["metadata"]["uid"]
    assert engine_held(s, uid), s.held(uid)
    t0 = time.monotonic()
    s.box.restart("workflow-controller")           # kill -9, then the same arguments again
    wf = wait_done(s, name, timeout_s=400)
    out = outcome(s, wf)
    assert out.phase == "Succeeded", out.tasks
    assert out.tasks.get("sglang/teardown") == "Succeeded" and out.tasks.get("cleanup") == "Succeeded", out.tasks
    assert out.attempts["sglang/perf"] == [0], out.attempts          # the running step was not run again
    released = wait_released(s, uid, timeout_s=30)
    assert cleanup_verdict(out)["status"] == "pass"
    record("controller-restart", backend="argo", released=True, seconds=round(released - t0, 1),
           phase=out.phase, note="includes the 20 s perf stand-in still running after the restart")


def test_step_pod_deleted_mid_run_fails_and_cleans(box_session):
    """Node loss: the running perf pod is deleted. Argo v4.0.5 marks the pod node Error "pod deleted" with no
    exit code (operator.go podReconciliation), so the retry expression sees lastRetry.exitCode -1, not 75: not
    retried. The sequence's teardown runs whatever happened before it: it releases the engine and fails naming
    ``perf Error`` (it is the leaf that carries the failure), so the sequence and the workflow end Failed (a step's
    exit cannot make a node Error); the exit handler runs as always."""
    s = box_session
    name = submit_async(s, LONG_PERF)
    wf = wait_running(s, name, "sglang/perf")
    uid = wf["metadata"]["uid"]
    assert engine_held(s, uid), s.held(uid)
    pod = step_pod(s, name, "sglang/perf")
    t0 = time.monotonic()
    status, body = s.box.request("DELETE", f"/api/v1/namespaces/{s.ns}/pods/{pod['metadata']['name']}")
    assert status in (200, 202), body
    wf = wait_done(s, name)
    out = outcome(s, wf)
    nodes = wf["status"]["nodes"]
    perf = [n for n in nodes.values() if n.get("type") == "Pod" and n["displayName"].startswith("perf")]
    assert out.phase == "Failed", (out.phase, out.tasks)
    assert cleanup_verdict(out)["metrics"].get("workflow_status") == "Failed", cleanup_verdict(out)["metrics"]
    assert len(perf) == 1, f"Argo retried the deleted pod's step: {[n['displayName'] for n in perf]}"
    assert perf[0]["phase"] == "Error" and perf[0].get("message") == "pod deleted", perf[0]
    assert (perf[0].get("outputs") or {}).get("exitCode") is None, perf[0]["outputs"]
    retry = next(n for n in nodes.values() if n.get("type") == "Retry" and n["displayName"] == "perf")
    assert retry["phase"] == "Error" and "expression evaluated to false" in retry.get("message", ""), retry
    assert out.tasks["sglang/perf"] == "Error" and out.tasks["sglang"] == "Failed", out.tasks
    assert out.tasks.get("sglang/teardown") == "Failed" and out.tasks.get("cleanup") == "Succeeded", out.tasks
    teardown = json.loads((out.run_dir / "sglang" / "teardown" / "verdict.json").read_text())
    assert {c["name"]: c["observed"] for c in teardown["checks"]}["upstream"]["perf"] == "Error", teardown["checks"]
    released = wait_released(s, uid, timeout_s=30)
    assert cleanup_verdict(out)["status"] == "pass"
    record("step-pod-deleted", backend="argo", released=True, seconds=round(released - t0, 1),
           perf_phase=out.tasks["sglang/perf"], perf_message=perf[0].get("message"),
           perf_exit=(perf[0].get("outputs") or {}).get("exitCode"), attempts=out.attempts["sglang/perf"])


def windowed(template: dict[str, Any], name: str, deadline_s: int, reserve_s: int) -> dict[str, Any]:
    """The rendered template under another name with a short spec.activeDeadlineSeconds and the reserve of its
    windowed gates (GAUNTLET_WINDOW_RESERVE_S) scaled to the box's seconds-long steps."""
    t = copy.deepcopy(template)
    t["metadata"]["name"] = name
    t["spec"]["activeDeadlineSeconds"] = deadline_s
    set_reserve(t, reserve_s)
    return t


def set_reserve(template: dict[str, Any], reserve_s: int) -> None:
    """Every windowed gate's reserve (render sets it from the plan's cluster figures, minutes) to ``reserve_s``."""
    n = 0
    for t in template["spec"]["templates"]:
        for e in (t.get("container") or {}).get("env") or []:
            if e["name"] == RESERVE_ENV:
                e["value"], n = str(reserve_s), n + 1
    assert n, "render set no window reserve on any gate"


def ran_whatever_happened(out, task: str) -> dict[str, Any]:
    """``task`` (regress, report) ran after a failure: its verdict fails on ``upstream`` alone (it carries the
    failure before it, as the leaves of a DAG must) and every other check of it passed or skipped."""
    v = json.loads((out.run_dir / task / "verdict.json").read_text())
    bad = [c["name"] for c in v["checks"] if c["status"] in ("fail", "error") and c["name"] != "upstream"]
    assert not bad and out.tasks.get(task) in ("Succeeded", "Failed"), (task, out.tasks.get(task), v["checks"])
    return v


def test_window_ends_before_the_deadline_report_written_and_released(box_session):
    """A run whose window ends while perf runs: the gate stops itself (the real runner, steps/window.py) before
    Argo's deadline, and teardown, regress, report and the exit handler run; the workflow ends by its deadline.

    Why not let Argo's deadline end it: Argo v4.0.5 creates no pod once the deadline has passed
    (workflowpod.go) and wakes the workflow only at its 20-minute resync, one successor node per resync, so a
    run killed by the deadline held the pool's mutex for over an hour and wrote no report (docs/reliability.md
    "The run's window"). The deadline stays the backstop; this test shows it is not reached.
    Scaled for the box: activeDeadlineSeconds GAUNTLET_FAULT_DEADLINE_S (300 s), the reserve 120 s."""
    s = box_session
    deadline_s = int(os.environ.get("GAUNTLET_FAULT_DEADLINE_S", "300"))
    reserve_s = 120
    name_t = f"{template_name(s.profile)}-window"
    s.box.apply(windowed(s.docs[f"{template_name(s.profile)}.workflowtemplate.yaml"], name_t, deadline_s, reserve_s))
    # perf's gate sits for 900 s inside the real runner, so only the window can end it
    s.kubelet.set_standins({**GPU_STANDINS, "sglang/perf": [{"measure": "runner", "exit": 0, "after_s": 900,
                                                             "outputs": {"unlock_C32": "false"}}]})
    argv = ["submit", "-n", s.ns, "--from", f"workflowtemplate/{name_t}", "-o", "name"]
    for k, v in PARAMS.items():
        argv += ["-p", f"{k}={v}"]
    r = s.box.argo(*argv)
    assert r.returncode == 0, f"argo submit: {r.stderr or r.stdout}"
    name = r.stdout.strip().split("/")[-1]
    try:
        wf = wait_running(s, name, "sglang/perf", timeout_s=deadline_s)
        uid = wf["metadata"]["uid"]
        assert engine_held(s, uid), f"the window must end while the engine is up: {s.held(uid)}"
        wf = wait_done(s, name, timeout_s=deadline_s + 240)
        started, finished = _epoch(wf["status"]["startedAt"]), _epoch(wf["status"]["finishedAt"])
        out = outcome(s, wf)
        assert out.phase == "Failed", out.tasks
        perf = json.loads((out.run_dir / "sglang" / "perf" / "verdict.json").read_text())
        assert perf["status"] == "fail" and [c["name"] for c in perf["checks"]] == ["window"], perf["checks"]
        # teardown released the engine, and fails itself naming perf (the sequence's leaf carries its failure)
        teardown = {c["name"]: c for c in json.loads(
            (out.run_dir / "sglang" / "teardown" / "verdict.json").read_text())["checks"]}
        assert teardown["scaled_to_zero"]["status"] == "pass" and teardown["gpus_free"]["status"] == "pass", teardown
        assert "perf Failed" in teardown["upstream"]["detail"], teardown["upstream"]
        for task in ("regress", "report"):
            ran_whatever_happened(out, task)
        assert "window" in (out.run_dir / "report.md").read_text()
        assert finished - started <= deadline_s + 30, (
            f"the run took {finished - started:.0f} s: its deadline {deadline_s} s was reached")
        wait_released(s, uid, timeout_s=60)
        released_wall = time.time()
        verdict = out.run_dir / "cleanup" / "verdict.json"
        until(verdict.exists, 60, f"the exit handler's verdict {verdict}")
        assert cleanup_verdict(out)["status"] == "pass"
        record("window-ends", backend="argo", released=True, seconds=round(released_wall - started, 1),
               deadline_s=deadline_s, reserve_s=reserve_s, run_s=round(finished - started, 1),
               perf_ran_s=perf["metrics"]["window"]["ran_s"], cleanup_node=out.tasks.get("cleanup"))
    finally:
        s.kubelet.set_standins(dict(GPU_STANDINS))
        if not (workflow(s, name).get("status") or {}).get("finishedAt"):
            s.box.argo("stop", "-n", s.ns, name)     # no later test waits on the pool's mutex behind it


def test_engine_exits_during_startup_deploy_fails_fast(box_session):
    s = box_session
    name = submit_async(s, {"engine": [{"exit": 1, "after_s": 2}]})
    wf = wait_running(s, name, "sglang/deploy")
    uid = wf["metadata"]["uid"]
    until(lambda: engine_held(s, uid), 120, "the engine StatefulSet")
    t0 = time.monotonic()
    wf = wait_done(s, name)
    out = outcome(s, wf)
    assert out.phase == "Failed", out.tasks
    assert out.tasks["sglang/deploy"] == "Failed" and out.attempts["sglang/deploy"] == [1], out.attempts
    assert out.tasks.get("cleanup") == "Succeeded", out.tasks
    deploy = json.loads((out.run_dir / "sglang" / "deploy" / "verdict.json").read_text())
    ready = {c["name"]: c for c in deploy["checks"]}["ready"]
    assert ready["status"] == "fail" and "exited 1" in ready["observed"] + ready["detail"], ready
    timeout_s = s.profile.engines["sglang"].ready_timeout_s
    node = next(n for n in wf["status"]["nodes"].values() if n.get("type") == "Pod"
                and n["displayName"].startswith("deploy"))
    took = _seconds(node["startedAt"], node["finishedAt"])
    assert took < min(180, timeout_s / 10), f"deploy took {took}s to fail (ready timeout {timeout_s}s)"
    released = wait_released(s, uid, timeout_s=30)
    record("engine-exits-at-startup", backend="argo", released=True, seconds=round(released - t0, 1),
           deploy_seconds=took, ready_timeout_s=timeout_s, observed=ready["observed"],
           note="seconds from the engine StatefulSet's appearance to released")


def test_engine_restarts_during_startup_deploy_fails_fast(box_session):
    """Each rank exits once while loading, then serves after the kubelet restarts it: deploy still fails
    (a restart during start-up is a problem, not readiness) and cleanup releases."""
    s = box_session
    name = submit_async(s, {"engine": [{"exit": 1, "after_s": 2}, {}]})
    wf = wait_running(s, name, "sglang/deploy")
    uid = wf["metadata"]["uid"]
    until(lambda: engine_held(s, uid), 120, "the engine StatefulSet")
    t0 = time.monotonic()
    wf = wait_done(s, name)
    out = outcome(s, wf)
    assert out.phase == "Failed", out.tasks
    assert out.tasks["sglang/deploy"] == "Failed" and out.attempts["sglang/deploy"] == [1], out.attempts
    assert out.tasks.get("cleanup") == "Succeeded", out.tasks
    deploy = json.loads((out.run_dir / "sglang" / "deploy" / "verdict.json").read_text())
    ready = {c["name"]: c for c in deploy["checks"]}["ready"]
    assert ready["status"] == "fail", ready
    node = next(n for n in wf["status"]["nodes"].values() if n.get("type") == "Pod"
                and n["displayName"].startswith("deploy"))
    took = _seconds(node["startedAt"], node["finishedAt"])
    assert took < 180, f"deploy took {took}s to fail"
    released = wait_released(s, uid, timeout_s=30)
    record("engine-restarts-at-startup", backend="argo", released=True, seconds=round(released - t0, 1),
           deploy_seconds=took, observed=ready["observed"], note="seconds from the engine StatefulSet's appearance")


def test_cleanup_transient_then_real_retried_and_released(box_session):
    s = box_session
    name = submit_async(s, {"sglang/smoke": [FAIL], "cleanup": [{"exit": 75}, {"real": True}]})
    wf = wait_done(s, name)
    uid = wf["metadata"]["uid"]
    out = outcome(s, wf)
    assert out.phase == "Failed", out.tasks
    assert out.attempts["cleanup"] == [75, 0], out.attempts
    assert out.tasks["cleanup"] == "Succeeded", out.tasks
    nodes = [n for n in wf["status"]["nodes"].values() if n.get("type") == "Pod" and ".onExit" in n["name"]]
    t_fault = min(_epoch(n["finishedAt"]) for n in nodes)      # the first attempt's exit 75
    wait_released(s, uid, timeout_s=30)
    assert cleanup_verdict(out)["status"] == "pass"
    record("cleanup-exit-75-once", backend="argo", released=True, seconds=round(time.time() - t_fault, 1),
           attempts=out.attempts["cleanup"])


def test_cleanup_always_fails_janitor_releases(box_session):
    """Smoke fails, the sequence's teardown fails too (played: an API server refusing it) and so does every
    attempt of the exit handler's cleanup: the engine stays held until the janitor releases it. Without the
    teardown's failure it would release the engine itself (it runs whatever happened before it) and the row
    would prove nothing about the janitor."""
    s = box_session
    name = submit_async(s, {"sglang/smoke": [FAIL], "sglang/teardown": [FAIL], "cleanup": [{"exit": 75}]})
    wf = wait_done(s, name)
    uid = wf["metadata"]["uid"]
    out = outcome(s, wf)
    assert out.attempts["cleanup"] == [75, 75, 75, 75], out.attempts        # limit 3: four attempts
    assert out.tasks["cleanup"] in ("Failed", "Error"), out.tasks
    held = s.held(uid)
    assert engine_held(s, uid), f"nothing held after cleanup failed: the row would prove nothing ({held})"
    t0 = time.monotonic()
    run_janitor(s)
    released = wait_released(s, uid, timeout_s=30)
    record("cleanup-always-fails", backend="argo", released=True, seconds=round(released - t0, 1),
           held_after_fault=held, how="janitor from cronwf/gauntlet-janitor, grace=0s",
           note="seconds from the janitor's submission; on a schedule add its period (5 min) and grace (10 min)")


def test_rank_the_scheduler_cannot_place_fails_deploy_in_minutes_and_releases(box_session):
    """A third pod that cannot fit: another team's pod takes 1 GPU of the second pool node while the network
    gate runs (after the nodes gate gave its 8 GPUs back), so the engine's second rank (8 GPUs, one rank per
    node by anti-affinity) fits nowhere. The real kube-scheduler leaves
    it Pending with its Unschedulable message; deploy fails after the stuck grace (the box's step image sets
    $GAUNTLET_POD_STUCK_GRACE_S to 20 s; 300 s on a cluster) instead of waiting its 5400 s ready timeout,
    quoting the scheduler's message, scales the StatefulSet to 0, and nothing labelled by the run is held.
    Before the stuck watch, deploy waited the whole ready timeout: this row timed out."""
    from box.scenarios import OTHER_TEAM, pool_taints

    s = box_session
    node = s.profile.hardware.nodes[-1].name
    squatter = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "team-b-squatter", "namespace": s.ns, "labels": {**OTHER_TEAM, "app": "squat"}},
                "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                         "tolerations": [{"key": t["key"], "operator": "Exists", "effect": t["effect"]}
                                         for t in pool_taints(s.profile)],
                         "containers": [{"name": "hold", "image": "team-b/serving:1",
                                         "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    t0 = time.monotonic()
    name = submit_async(s, {"network": [{"exit": 0, "after_s": 15}]})
    wait_running(s, name, "network")
    status, body = s.box.request("POST", f"/api/v1/namespaces/{s.ns}/pods", squatter)
    assert status == 201, body
    try:
        until(lambda: (s.box.request("GET", f"/api/v1/namespaces/{s.ns}/pods/team-b-squatter")[1].get("spec") or {})
              .get("nodeName") == node, 60, f"the other team's pod bound to {node}")
        wf = wait_done(s, name, timeout_s=420)
        took = time.monotonic() - t0
        uid = wf["metadata"]["uid"]
        out = outcome(s, wf)
        assert out.phase == "Failed", out.tasks
        assert out.tasks["sglang/deploy"] == "Failed" and out.tasks.get("cleanup") == "Succeeded", out.tasks
        deploy = json.loads((out.run_dir / "sglang" / "deploy" / "verdict.json").read_text())
        ready = {c["name"]: c for c in deploy["checks"]}["ready"]
        assert ready["status"] == "fail", ready
        assert "Unschedulable: 0/4 nodes are available" in ready["detail"], ready
        assert "Insufficient nvidia.com/gpu" in ready["detail"], ready
        node_ = next(n for n in wf["status"]["nodes"].values() if n.get("type") == "Pod"
                     and n["displayName"].startswith("deploy"))
        deploy_s = _seconds(node_["startedAt"], node_["finishedAt"])
        assert deploy_s < 180, f"deploy took {deploy_s}s to fail on an unschedulable rank"
        released = wait_released(s, uid, timeout_s=60)
        assert s.held(uid) == {}
        record("rank-unschedulable", backend="argo", released=True, seconds=round(released - t0, 1),
               deploy_seconds=deploy_s, workflow_seconds=round(took, 1), observed=ready["detail"][:400])
    finally:
        s.box.request("DELETE", f"/api/v1/namespaces/{s.ns}/pods/team-b-squatter")


def _epoch(ts: str) -> float:
    import calendar
    return calendar.timegm(time.strptime(ts, "%Y-%m-%dT%H:%M:%SZ"))


def _seconds(a: str, b: str) -> float:
    return _epoch(b) - _epoch(a)


def test_nothing_labelled_left_in_the_namespace(box_session):
    """After every row: no labelled StatefulSet with replicas, no labelled live GPU pod, whatever the run."""
    _, sts = box_session.box.request("GET", f"/apis/apps/v1/namespaces/{box_session.ns}/statefulsets"
                                            f"?labelSelector={RUN_LABEL}")
    held = {x["metadata"]["name"]: x["spec"].get("replicas") for x in sts.get("items", [])
            if x["spec"].get("replicas")}
    assert held == {}, held
