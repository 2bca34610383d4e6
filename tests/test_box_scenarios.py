"""Conformance scenarios on the control plane in a box (marker ``argo``).

The rendered kimi-k3-h20 WorkflowTemplate and CronWorkflow run on a real kube-apiserver, etcd,
kube-controller-manager and Argo v4 workflow-controller, with the real argoexec init/wait/emissary
around every step (tests/box/). What cannot run on this machine is stood in for, and said so in
tests/box/kubelet.py: the GPU gates (box/standin.py), the engine ranks (a stand-in HTTP engine),
images, cgroups and cluster networking. Preflight, preflight-compare, deploy, teardown, regress,
report and cleanup run for real; deploy and cleanup talk to the box's API server with the token of
the rendered service account, so the rendered Role decides what they may do.

Each scenario then runs on the local back end, replaying what every step did on the box, and the
two back ends must agree on the workflow's phase, every task's phase and what the exit handler got.
Where they disagree, Argo is right.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from box.scenarios import OTHER_TEAM, SCENARIOS, Scenario, run_locally

pytestmark = pytest.mark.argo

_results: dict[str, object] = {}


RECORD = Path(__file__).resolve().parent.parent / "build" / "box-conformance.json"


def _record(name: str, **fields) -> None:
    """The conformance table of docs/cluster.md: one row per scenario and back end."""
    RECORD.parent.mkdir(exist_ok=True)
    rows = json.loads(RECORD.read_text()) if RECORD.is_file() else {}
    rows.setdefault(name, {}).update(fields)
    RECORD.write_text(json.dumps(rows, indent=1, sort_keys=True))


def _box(box_session, sc: Scenario):
    if sc.name not in _results:
        out = box_session.submit(sc)
        _results[sc.name] = out
        _record(sc.name, argo={"phase": out.phase, "seconds": out.seconds, "exit_status": out.exit_status,
                               "failures": sorted(out.failure_names()), "held_after": out.labelled_left,
                               "gpu_pods": len(out.gpu_pods)})
    return _results[sc.name]


@pytest.mark.parametrize("sc", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_scenario_on_the_box(box_session, sc: Scenario):
    before = box_session.other_team_state()
    out = _box(box_session, sc)
    tasks = out.tasks
    assert out.phase == sc.expect_phase, f"{sc.name}: workflow {out.phase}, tasks {tasks}"
    wrong = {t: (want, tasks.get(t)) for t, want in sc.expect.items() if tasks.get(t) != want}
    assert not wrong, f"{sc.name}: task phases (want, got): {wrong}; all: {tasks}"
    # the exit handler ran, got the real {{workflow.status}} and {{workflow.failures}}, and parsed them
    assert out.exit_status == out.phase, f"exit handler got --workflow-status {out.exit_status!r}"
    assert out.exit_failures is not None and out.exit_failures.startswith('"'), out.exit_failures
    cleanup = json.loads((out.run_dir / "cleanup" / "verdict.json").read_text())
    assert cleanup["status"] == "pass", cleanup
    if sc.expect_phase == "Succeeded" and not any(len(a) > 1 for a in out.attempts.values()):
        assert out.exit_failures == '"null"', out.exit_failures
    else:
        assert out.failure_names(), f"{sc.name}: the exit handler got no failures: {out.exit_failures}"
    # the GPUs came back, and nothing of another team's was touched
    assert out.labelled_left == {}, f"{sc.name}: still held after the run: {out.labelled_left}"
    assert box_session.other_team_state() == before


def test_gate0_failure_creates_no_gpu_pod(box_session):
    sc = next(s for s in SCENARIOS if s.name == "gate0-corrupt-model")
    out = _box(box_session, sc)
    assert out.gpu_pods == [], f"GPU pods created after Gate 0 failed: {out.gpu_pods}"
    verdict = json.loads((out.run_dir / "preflight-1" / "verdict.json").read_text())
    failing = [c["name"] for c in verdict["checks"] if c["status"] == "fail"]
    assert failing, verdict


def test_retries_only_the_transient_exit(box_session):
    for name, attempts in (("transient-early-then-pass", [75, 0]), ("transient-late-then-pass", [75, 0]),
                           ("failed-verdict-not-retried", [1])):
        out = _box(box_session, next(s for s in SCENARIOS if s.name == name))
        assert out.attempts["sglang/smoke"] == attempts, (name, out.attempts["sglang/smoke"])


def test_deploy_for_real_under_the_rendered_role(box_session):
    """deploy server-side-applied the engine under the gauntlet service account; cleanup released it."""
    out = _box(box_session, next(s for s in SCENARIOS if s.name == "failed-verdict-not-retried"))
    deploy = json.loads((out.run_dir / "sglang" / "deploy" / "verdict.json").read_text())
    assert deploy["status"] == "pass", deploy
    assert out.gpu_pods, "the engine StatefulSet made no GPU pods"
    cleanup = json.loads((out.run_dir / "cleanup" / "verdict.json").read_text())
    actions = json.dumps(cleanup["metrics"])
    assert "StatefulSet" in actions and OTHER_TEAM["team"] not in actions, cleanup["metrics"]


def test_nightly_regression_fails_and_still_reports(box_session):
    out = _box(box_session, next(s for s in SCENARIOS if s.name == "nightly-regression"))
    assert (out.run_dir / "report.md").is_file()


REPLAYABLE = [s for s in SCENARIOS if s.local_counterpart]


@pytest.mark.parametrize("sc", REPLAYABLE, ids=[s.name for s in REPLAYABLE])
def test_local_runner_agrees_with_argo(box_session, sc: Scenario, tmp_path):
    box = _box(box_session, sc)
    t0 = time.monotonic()
    local = run_locally(sc, box, tmp_path)
    _record(sc.name, local={"phase": local.phase, "seconds": round(time.monotonic() - t0, 1),
                            "exit_status": local.exit_status, "failures": sorted(local.failure_names()),
                            "agrees": local.phase == box.phase and local.tasks == box.tasks
                            and local.failure_names() == box.failure_names()})
    assert local.phase == box.phase
    differ = {t: (box.tasks.get(t), local.tasks.get(t)) for t in set(box.tasks) | set(local.tasks)
              if box.tasks.get(t) != local.tasks.get(t)}
    assert not differ, f"task phases (argo, local): {differ}"
    assert local.exit_status == box.exit_status
    assert local.failure_names() == box.failure_names()


def test_second_run_on_the_pool_waits_for_the_mutex(box_session):
    """Two submissions on one node pool: the second is held Pending on the pool's mutex until the first ends."""
    from box.scenarios import GPU_STANDINS, outcome_from_workflow

    box_session.kubelet.set_standins({**GPU_STANDINS, "sglang/smoke": [{"exit": 0, "after_s": 20}]})
    ns, names = box_session.ns, []
    for _ in range(2):
        r = box_session.box.argo("submit", "-n", ns, "--from", "workflowtemplate/gauntlet-kimi-k3-h20",
                                 "-p", "engines=sglang", "-p", "results-uri=/runs/results", "-p", "retry-backoff=1s",
                                 "-o", "name")
        assert r.returncode == 0, r.stderr
        names.append(r.stdout.strip().split("/")[-1])

    def wf(name):
        return box_session.box.request("GET", f"/apis/argoproj.io/v1alpha1/namespaces/{ns}/workflows/{name}")[1]

    held_while_first_ran = None
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        first, second = wf(names[0]), wf(names[1])
        p1, p2 = (first.get("status") or {}).get("phase"), (second.get("status") or {}).get("phase")
        # the controller may not have looked at the second yet when the first turns Running: keep the
        # first observation of the second that carries a status while the first still runs
        s2 = second.get("status") or {}
        if p1 == "Running" and (held_while_first_ran is None or not (held_while_first_ran[1] or held_while_first_ran[2])):
            held_while_first_ran = (p2, s2.get("message", ""), s2.get("synchronization"))
        if p1 in ("Succeeded", "Failed", "Error") and p2 in ("Succeeded", "Failed", "Error"):
            break
        time.sleep(1)
    assert held_while_first_ran is not None, "the first run was never seen Running"
    phase, message, sync = held_while_first_ran
    assert phase in (None, "Pending") and "gauntlet-h20-kimi" in json.dumps(sync or message), held_while_first_ran
    one, two = outcome_from_workflow(first, []), outcome_from_workflow(second, [])
    assert (one.phase, two.phase) == ("Succeeded", "Succeeded")
    # the second's first pod started only after the first run had finished
    assert second["status"]["startedAt"] >= first["status"]["finishedAt"] or \
        min(n.get("startedAt") or "9" for n in second["status"]["nodes"].values() if n.get("type") == "Pod") \
        >= first["status"]["finishedAt"]
    for w in (first, second):
        assert box_session.held(w["metadata"]["uid"]) == {}
