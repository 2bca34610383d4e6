"""A DAG's phase as Argo's assessDAGPhase judges it (v4.0.5 workflow/controller/dag.go), on our graphs."""

from __future__ import annotations

import pytest

from gauntlet.params import load_profile
from gauntlet.workflows.graph import build_graph
from gauntlet.workflows.phase import dag_phase, targets


def tasks_of(profile: str, dag: str = "main") -> dict[str, tuple[str, ...]]:
    p = load_profile(profile)
    g = build_graph(p, "argo" if p.hardware.kind == "kubernetes" else "local")
    return {t.name: t.upstream for t in g.dag(dag).tasks}


def all_ok(tasks: dict[str, tuple[str, ...]]) -> dict[str, str]:
    return {n: "Succeeded" for n in tasks}


@pytest.mark.parametrize("profile", ["kimi-k3-h20", "local-cpu"])
def test_the_main_dag_is_judged_by_report_alone(profile):
    assert targets(tasks_of(profile)) == ["report"]
    assert targets(tasks_of(profile, "engine-sequence")) == ["teardown"]


def test_a_failed_regress_with_a_passing_report_is_green_to_argo():
    """The defect: report runs on regress.Failed, it is the only leaf, so the DAG Succeeds."""
    t = tasks_of("kimi-k3-h20")
    assert dag_phase(t, {**all_ok(t), "regress": "Failed"}) == "Succeeded"
    assert dag_phase(t, {**all_ok(t), "regress": "Failed", "report": "Failed"}) == "Failed"


def test_an_early_failure_fails_through_the_omitted_leaf():
    t = tasks_of("kimi-k3-h20")
    phases = {n: "Omitted" for n in t}
    phases.update({"prewarm-0": "Skipped", "prewarm-1": "Skipped", "preflight-0": "Failed",
                   "preflight-1": "Succeeded"})
    assert dag_phase(t, phases) == "Failed"


def test_skipped_tasks_inherit_success():
    t = tasks_of("kimi-k3-h20")
    phases = {**all_ok(t), "prewarm-0": "Skipped", "prewarm-1": "Skipped", "vllm": "Skipped",
              "engine-check-vllm": "Skipped"}
    assert dag_phase(t, phases) == "Succeeded"


def test_a_failed_branch_wins_over_a_succeeded_one_at_the_same_leaf():
    t = {"a": (), "b": (), "leaf": ("a", "b")}
    assert dag_phase(t, {"a": "Succeeded", "b": "Failed", "leaf": "Omitted"}) == "Failed"
    assert dag_phase(t, {"a": "Succeeded", "b": "Succeeded", "leaf": "Succeeded"}) == "Succeeded"


def test_target_overrides_leaves():
    t = {"a": (), "b": ("a",)}
    assert dag_phase(t, {"a": "Failed", "b": "Succeeded"}) == "Succeeded"
    assert dag_phase(t, {"a": "Failed", "b": "Succeeded"}, target="a b") == "Failed"


def test_error_is_kept():
    assert dag_phase({"a": ()}, {"a": "Error"}) == "Error"


def test_a_dependency_outside_the_dag_is_refused():
    with pytest.raises(ValueError, match="not in the DAG"):
        dag_phase({"a": ("zzz",)}, {"a": "Succeeded"})


def test_the_local_runner_judges_the_workflow_as_argo_does(tmp_path):
    """A failed task whose dependent (the leaf) succeeded: Argo says Succeeded, and so does `gauntlet run`;
    the nightly is Failed only because its report fails on the regression (steps/gates/report.py)."""
    from test_runner import make_runner

    from gauntlet.workflows.graph import SUCCEEDED_OR_FAILED, Dag, Graph, Need, Task

    def graph(report_step: str) -> Graph:
        main = Dag("main", (Task("regress", step="fake-fail", gate="report"),
                            Task("report", step=report_step, gate="report",
                                 depends=(Need("regress", SUCCEEDED_OR_FAILED),))))
        return Graph("t", main, (), Task("cleanup", step="cleanup", gate="exit"), {})

    passing = make_runner(tmp_path / "a", graph("fake-pass"))
    assert passing.run() == "Succeeded"
    assert {r.name: r.phase for r in passing.results}["regress"] == "Failed"
    assert make_runner(tmp_path / "b", graph("fake-fail")).run() == "Failed"
