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
from records import merge_row

from box.scenarios import OTHER_TEAM, SCENARIOS, Scenario, run_locally

pytestmark = pytest.mark.argo

# `make test` spreads the box's tests over several workers (pytest-xdist, --dist loadgroup), each with its
# own box. The tests that read one scenario's run go to the worker that ran it: one group per scenario, the
# three smoke-retry scenarios together (test_retries_only_the_transient_exit reads all three).
SMOKE_RETRIES = ("transient-early-then-pass", "transient-late-then-pass", "failed-verdict-not-retried")


def group(name: str) -> pytest.MarkDecorator:
    return pytest.mark.xdist_group("smoke-retries" if name in SMOKE_RETRIES else name)


def scenario_params(scenarios: list[Scenario]) -> list:
    return [pytest.param(s, id=s.name, marks=group(s.name)) for s in scenarios]

_results: dict[str, object] = {}


RECORD = Path(__file__).resolve().parent.parent / "build" / "box-conformance.json"


def _record(name: str, **fields) -> None:
    """The conformance table of docs/cluster.md: one row per scenario and back end."""
    merge_row(RECORD, name, fields, replace=False)


def _box(box_session, sc: Scenario):
    if sc.name not in _results:
        out = box_session.submit(sc)
        _results[sc.name] = out
        _record(sc.name, argo={"phase": out.phase, "seconds": out.seconds, "exit_status": out.exit_status,
                               "failures": sorted(out.failure_names()), "held_after": out.labelled_left,
                               "gpu_pods": len(out.gpu_pods)})
    return _results[sc.name]


@pytest.mark.parametrize("sc", scenario_params(SCENARIOS))
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


@group("all-pass")
def test_every_pool_node_ran_the_engine_and_bench_images_before_deploy(box_session):
    """Gate 1's pulls on the box (engines=sglang): each pool node ran a pod of its own, bound there by the real
    scheduler, in the SGLang image (pull-sglang-<i>) and one in the bench image (nodes-<i>), each Succeeded before
    the run's first engine pod was created; the vLLM pulls were Skipped. The process kubelet pulls nothing
    (tests/box/kubelet.py: an image reference maps to a PATH on this machine), so the box shows the placement
    and the order that make a real kubelet pull each image onto each node before deploy, not a pull itself."""
    from box.scenarios import RUN_LABEL
    from gauntlet.params import load_images

    out = _box(box_session, next(s for s in SCENARIOS if s.name == "all-pass"))
    assert out.phase == "Succeeded", out.tasks
    assert {t: out.tasks.get(t) for t in ("pull-sglang-0", "pull-sglang-1", "pull-vllm-0", "pull-vllm-1")} == {
        "pull-sglang-0": "Succeeded", "pull-sglang-1": "Succeeded", "pull-vllm-0": "Skipped", "pull-vllm-1": "Skipped"}
    events = [(t, p) for t, _, p in box_session.pod_events
              if (p["metadata"].get("labels") or {}).get("workflows.argoproj.io/workflow") == out.name
              or (p["metadata"].get("labels") or {}).get(RUN_LABEL) == out.uid]
    first_engine = min(t for t, p in events if (p["metadata"].get("labels") or {}).get("gauntlet.dev/component")
                       == "engine")
    done: dict[tuple[str, str], float] = {}        # (node, image) -> when a step pod in that image Succeeded there
    for t, p in events:
        main = next((c for c in p["spec"]["containers"] if c["name"] == "main"), None)
        if main and (p.get("status") or {}).get("phase") == "Succeeded" and p["spec"].get("nodeName"):
            done.setdefault((p["spec"]["nodeName"], main["image"]), t)
    images = load_images()
    for node in (n.name for n in box_session.profile.hardware.nodes):
        for key in ("sglang", "steps-vllm"):
            when = done.get((node, images[key].ref))
            assert when is not None and when < first_engine, (node, key, when, first_engine, sorted(done))


@group("gate0-corrupt-model")
def test_gate0_failure_creates_no_gpu_pod(box_session):
    sc = next(s for s in SCENARIOS if s.name == "gate0-corrupt-model")
    out = _box(box_session, sc)
    assert out.gpu_pods == [], f"GPU pods created after Gate 0 failed: {out.gpu_pods}"
    verdict = json.loads((out.run_dir / "preflight-1" / "verdict.json").read_text())
    failing = [c["name"] for c in verdict["checks"] if c["status"] == "fail"]
    assert failing, verdict


@group("pod-security-baseline")
def test_a_baseline_namespace_fails_at_params_in_one_line_before_any_gpu(box_session):
    """The namespace labelled pod-security.kubernetes.io/enforce=baseline: the params step's pod is admitted (it
    mounts no hostPath and takes no GPU), reads the label under the rendered gauntlet-admission account and fails
    the run naming it; no pod requesting nvidia.com/gpu is ever created (watched from the API server)."""
    out = _box(box_session, next(s for s in SCENARIOS if s.name == "pod-security-baseline"))
    assert out.gpu_pods == [], f"GPU pods created although params failed: {out.gpu_pods}"
    assert out.attempts["params"] == [1], out.attempts
    verdict = json.loads((out.run_dir / "params" / "verdict.json").read_text())
    failed = [c for c in verdict["checks"] if c["status"] == "fail"]
    assert [c["name"] for c in failed] == ["pod-security"], verdict["checks"]
    (line,) = failed[0]["detail"].splitlines()
    assert line.startswith("namespace gauntlet is labelled pod-security.kubernetes.io/enforce=baseline: "), line
    # the step's log (its pod's stdout) carries the same line
    log = box_session.box.request("GET", f"/api/v1/namespaces/{box_session.ns}/pods?labelSelector="
                                  f"workflows.argoproj.io%2Fworkflow%3D{out.name}")[1]
    pod = next(p for p in log["items"] if (p["metadata"].get("annotations") or {}).get(
        "workflows.argoproj.io/node-name", "").endswith(".params"))
    text = box_session.box.request("GET", f"/api/v1/namespaces/{box_session.ns}/pods/{pod['metadata']['name']}"
                                   "/log?container=main")[1]
    assert line in str(text), text


@group("transient-early-then-pass")
def test_retries_only_the_transient_exit(box_session):
    for name, attempts in (("transient-early-then-pass", [75, 0]), ("transient-late-then-pass", [75, 0]),
                           ("failed-verdict-not-retried", [1])):
        out = _box(box_session, next(s for s in SCENARIOS if s.name == name))
        assert out.attempts["sglang/smoke"] == attempts, (name, out.attempts["sglang/smoke"])


@group("failed-verdict-not-retried")
def test_deploy_for_real_under_the_rendered_role(box_session):
    """deploy server-side-applied the engine under the gauntlet service account; cleanup released it."""
    out = _box(box_session, next(s for s in SCENARIOS if s.name == "failed-verdict-not-retried"))
    deploy = json.loads((out.run_dir / "sglang" / "deploy" / "verdict.json").read_text())
    assert deploy["status"] == "pass", deploy
    assert out.gpu_pods, "the engine StatefulSet made no GPU pods"
    cleanup = json.loads((out.run_dir / "cleanup" / "verdict.json").read_text())
    actions = json.dumps(cleanup["metrics"])
    assert "StatefulSet" in actions and OTHER_TEAM["team"] not in actions, cleanup["metrics"]


@group("rank-restarts-during-perf")
def test_a_rank_that_restarts_during_perf_fails_perf_naming_it(box_session):
    """The real perf step on the box (its bench client stood in): rank 1 of the engine crashes mid-perf and
    the process kubelet restarts it, as a StatefulSet's kubelet would; perf's rank watch reads the pods'
    restart counts through the API server under the rendered Role and fails perf with that cause."""
    out = _box(box_session, next(s for s in SCENARIOS if s.name == "rank-restarts-during-perf"))
    perf = json.loads((out.run_dir / "sglang" / "perf" / "verdict.json").read_text())
    ranks = {c["name"]: c for c in perf["checks"]}["engine_ranks"]
    assert ranks["status"] == "fail" and "rank 1 restarted during perf" in ranks["detail"], ranks
    assert "rank 0" not in ranks["detail"], ranks


@group("experimental-blocked-baseline-reports")
def test_a_blocked_experimental_engine_leaves_the_baseline_and_the_report(box_session):
    """The first real run as the profile expects it may go, on the box (engines=both): vLLM's engine check fails at
    Gate 0 and SGLang's DSpark variant fails. Before: Gate 1 needed every engine check to pass, so nothing after
    Gate 0 ran, no report. Now the SGLang sequence runs to its teardown (the variant after DSpark too), regress and
    the real report run, report.md names each task that did not pass with its verdict's detail, Argo filled each
    earlier task's phase into the report's --upstream (vllm Omitted), and the report, the leaf, fails the workflow."""
    from box.scenarios import NO_DRAFT, VLLM_REFUSES

    out = _box(box_session, next(s for s in SCENARIOS if s.name == "experimental-blocked-baseline-reports"))
    assert out.phase == "Failed", out.tasks
    assert not [t for t in out.tasks if t.startswith("vllm/")], "the vLLM sequence ran a task"
    md = (out.run_dir / "report.md").read_text()
    section = md[md.index("## What did not pass"):md.index("| task | gate |")]
    rows = {r.split(" | ")[0].strip("| "): r.split(" | ")[1:] for r in section.splitlines()
            if r.startswith("| ") and "---" not in r}
    assert rows["engine-check-vllm"][0] == "**Failed**" and VLLM_REFUSES in rows["engine-check-vllm"][1], section
    assert rows["sglang/exp-dspark"][0] == "**Failed**" and NO_DRAFT in rows["sglang/exp-dspark"][1], section
    assert rows["vllm"][0] == "**Omitted**" and rows["vllm"][1].startswith("not run"), section
    assert rows["sglang"][0] == "**Failed**" and "sglang/exp-hicache" not in rows, section
    report = json.loads((out.run_dir / "report" / "verdict.json").read_text())
    up = {c["name"]: c for c in report["checks"]}["upstream"]
    assert up["status"] == "fail" and up["observed"]["vllm"] == "Omitted" and up["observed"]["pull-vllm-0"] == "Omitted"
    assert "regression" not in {c["name"] for c in report["checks"]}
    teardown = json.loads((out.run_dir / "sglang" / "teardown" / "verdict.json").read_text())
    checks = {c["name"]: c for c in teardown["checks"]}
    assert checks["upstream"]["observed"] == {"exp-dspark": "Failed"}, checks["upstream"]
    assert all(c["status"] == "pass" for n, c in checks.items() if n != "upstream"), checks


@group("nightly-regression")
def test_nightly_regression_fails_and_still_reports(box_session):
    out = _box(box_session, next(s for s in SCENARIOS if s.name == "nightly-regression"))
    assert (out.run_dir / "report.md").is_file()


REPLAYABLE = [s for s in SCENARIOS if s.local_counterpart]


@pytest.mark.parametrize("sc", scenario_params(REPLAYABLE))
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
    # what runs whatever happened got every earlier task's phase alike: Argo's {{tasks.X.status}} (Omitted and
    # Skipped ancestors included) and the local runner's
    assert local.upstream == box.upstream, {p: (box.upstream.get(p), local.upstream.get(p))
                                            for p in set(box.upstream) | set(local.upstream)}


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


@group("gate6-one-engine-at-a-time")
def test_gate6_never_holds_two_engines_gpus(box_session):
    """Gate 6 on the box with the real scheduler: the experiments run for real but for the bench client
    (box/standin.py `measured`): each deploys its variant StatefulSet under the rendered Role, the real
    kube-scheduler places it (8 GPUs a node, host ports, the anti-affinity), the stand-in engine answers, and
    the variant is torn down by its own selector. No engine pod of the run is ever Unschedulable (Pending for
    GPUs), no variant pod exists while a baseline pod does, the baseline is released by release-baseline and
    by no variant's teardown, and each variant is compared with the baseline's phases from baseline-phases."""
    from box.scenarios import RUN_LABEL

    out = _box(box_session, next(s for s in SCENARIOS if s.name == "gate6-one-engine-at-a-time"))
    assert out.phase == "Succeeded", out.tasks
    events = [(t, kind, p) for t, kind, p in box_session.pod_events
              if (p["metadata"].get("labels") or {}).get(RUN_LABEL) == out.uid
              and (p["metadata"].get("labels") or {}).get("gauntlet.dev/component") == "engine"]
    unschedulable = {p["metadata"]["name"]: c.get("message") for _, _, p in events
                     for c in (p.get("status") or {}).get("conditions") or []
                     if c.get("type") == "PodScheduled" and c.get("status") == "False"}
    assert unschedulable == {}, f"engine pods Pending for the scheduler: {unschedulable}"
    # lifetimes: from the first event of a pod to its DELETED event, per StatefulSet
    life: dict[str, list[float]] = {}
    for t, kind, p in events:
        sts = p["metadata"]["name"].rsplit("-", 1)[0]
        span = life.setdefault(sts, [t, float("inf")])
        if kind == "DELETED":
            span[1] = t
    seq = json.loads((out.run_dir / "sglang" / "release-baseline" / "verdict.json").read_text())
    (baseline,) = seq["metrics"]["stopped"]
    names = ("prefix-cache", "dspark", "hicache", "symm-mem")
    variants = {v: s for v in names for s in life if s.startswith(f"g-sglang-{v}")}
    assert set(variants) == set(names), sorted(life)
    assert all(life[baseline][1] < life[s][0] for s in variants.values()), life
    for v, sts in variants.items():
        exp = out.run_dir / "sglang" / f"exp-{v}"
        down = json.loads((exp / "teardown" / "teardown.json").read_text())
        assert down["stopped"] == [sts] and down["selector"].endswith(f"gauntlet.dev/variant={v}"), down
        m = json.loads((exp / "verdict.json").read_text())["metrics"]
        assert m["verdict"] == "keep baseline" and m["comparisons"], m.get("verdict_reason")
    prefix = json.loads((out.run_dir / "sglang" / "exp-prefix-cache" / "verdict.json").read_text())["metrics"]
    assert set(prefix["baseline_tables"]) == {"cold", "reusable_prefix"}
    final = json.loads((out.run_dir / "sglang" / "teardown" / "verdict.json").read_text())
    assert final["status"] == "pass" and "already at 0" in final["checks"][0]["detail"], final["checks"]
