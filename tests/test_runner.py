"""The local runner: Argo's depends/when string semantics (table-driven, the oracle the graph's
structures are held against in test_graph.py), and real runs of a tiny graph.

The graph runs real subprocess steps through tests/fakes/fake_cli.py, which executes fake
gates and the real cleanup step under the real evidence contract (gauntlet.steps.runner).
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gauntlet.steps.backends.local.deploy import find_labelled
from gauntlet.steps.engines.local_vllm import group_members
from gauntlet.workflows import refs
from gauntlet.workflows.conditions import ExpressionError, eval_depends, eval_when
from gauntlet.workflows.graph import SUCCEEDED_OR_SKIPPED, Dag, Graph, Need, Task, When, output_default
from gauntlet.workflows.local import Runner, write_summary

FAKES = Path(__file__).parent / "fakes"
REPO = Path(__file__).resolve().parent.parent
PROFILE = REPO / "params" / "profiles" / "local-cpu.yaml"

PH = {"a": "Succeeded", "b": "Failed", "c": "Skipped", "d": "Omitted", "e": "Errored", "prewarm-0": "Skipped"}


@pytest.mark.parametrize("expr, expected", [
    (None, True),
    ("a.Succeeded", True),
    ("b.Succeeded", False),
    ("b.Failed", True),
    ("c.Skipped", True),
    ("d.Omitted", True),
    ("e.Errored", True),
    ("e.Failed", False),
    ("b.AllFailed", True),
    ("a.AnySucceeded", True),
    ("a", True),                       # bare: Succeeded || Skipped || Daemoned
    ("c", True),
    ("b", False),
    ("a.Succeeded && b.Succeeded", False),
    ("a.Succeeded || b.Succeeded", True),
    ("!b.Succeeded", True),
    ("(a.Succeeded || a.Skipped) && (c.Succeeded || c.Skipped)", True),
    ("(a.Succeeded || a.Skipped) && (b.Succeeded || b.Skipped)", False),
    ("a.Succeeded && (b.Failed || d.Succeeded)", True),
    ("(prewarm-0.Succeeded || prewarm-0.Skipped)", True),
    ("b.Succeeded || b.Failed", True),
])
def test_depends(expr: str | None, expected: bool) -> None:
    assert eval_depends(expr, PH) is expected


@pytest.mark.parametrize("expr, msg", [
    ("zzz.Succeeded", "names task 'zzz'"),
    ("a.Succeeded &&", "unexpected end"),
    ("(a.Succeeded", "missing"),
    ("a.Succeeded b.Succeeded", "unexpected"),
    ("a.Succeeded || zzz.Failed", "names task 'zzz'"),   # short-circuit never hides a bad name
])
def test_depends_errors(expr: str, msg: str) -> None:
    with pytest.raises(ExpressionError, match=msg):
        eval_depends(expr, PH)


@pytest.mark.parametrize("expr, expected", [
    (None, True),
    ("true == true", True),
    ("false == true", False),
    ("true", True),
    ("false", False),
    ("'vllm' == 'vllm'", True),
    ("'vllm' == 'sglang'", False),
    ("'vllm' != 'sglang'", True),
    ('"a b" == "a b"', True),
    ("'both' =~ 'vllm|both'", True),
    ("'vllm' =~ 'vllm|both'", True),
    ("'sglang' =~ 'vllm|both'", False),
    ("'sglang' !~ 'vllm|both'", True),
    ("3 == 3.0", True),
    ("'3' == 3", True),
    ("true == true && 'a' == 'b'", False),
    ("true == false || 'a' == 'a'", True),
    ("!(true == false)", True),
    ("('x' == 'x' || false) && true", True),
])
def test_when(expr: str | None, expected: bool) -> None:
    assert eval_when(expr) is expected


@pytest.mark.parametrize("expr, msg", [
    ("'a' ==", "unexpected end"),
    ("'a'", "not a boolean"),
    ("{{tasks.x.outputs.parameters.y}} == true", "substitute"),
    ("'a' =~ '('", "bad regex"),
    ("'a' == 'a' )", "unexpected"),
])
def test_when_errors(expr: str, msg: str) -> None:
    with pytest.raises(ExpressionError, match=msg):
        eval_when(expr)


def test_substitute() -> None:
    vals = {refs.parameter("engines"): "both", refs.output("perf", "unlock_c4"): "true"}
    assert refs.substitute("'{{workflow.parameters.engines}}' =~ 'vllm|both'", vals) == "'both' =~ 'vllm|both'"
    assert refs.substitute("{{ tasks.perf.outputs.parameters.unlock_c4 }} == true", vals) == "true == true"
    assert refs.find("{{a}} x {{b.c}}") == ["a", "b.c"]
    with pytest.raises(refs.RefError, match="unresolved reference"):
        refs.substitute("{{inputs.parameters.engine}}", vals)
    with pytest.raises(refs.RefError, match="unsupported reference"):
        refs.substitute("{{item}}", vals)


def test_output_defaults_match_the_argo_renderer() -> None:
    assert output_default("verdict") == "error"
    assert output_default("unlock_c4_128_32") == "false"
    assert output_default("endpoint") == ""


# ------------------------------------------------------------------ real runs of a fake graph

def fake_graph(fail_at: str | None = "smoke") -> Graph:
    eng = str(refs.input_param("engine"))
    seq = Dag("engine-sequence", (
        Task("deploy", step="fake-engine", gate="gate2", args=("--engine", eng), outputs=("endpoint",)),
        Task("smoke", step="fake-fail" if fail_at == "smoke" else "fake-pass", gate="gate3",
             args=("--endpoint", str(refs.output("deploy", "endpoint"))), depends=(Need("deploy"),),
             outputs=("unlock_more",)),
        Task("perf", step="fake-pass", gate="gate4", depends=(Need("smoke"),)),
        Task("perf-more", step="fake-pass", gate="gate4", depends=(Need("perf"),),
             when=When.equals(refs.output("smoke", "unlock_more"), True)),
        Task("teardown", step="fake-teardown", gate="gate2", depends=(Need("perf-more", SUCCEEDED_OR_SKIPPED),),
             args=("--engine", eng)),
    ), inputs=("engine",))
    main = Dag("main", (
        Task("preflight", step="fake-pass", gate="gate0", outputs=("unlock_extra",)),   # never written: false
        Task("extra", step="fake-pass", gate="gate1", when=When.equals(refs.output("preflight", "unlock_extra"), True)),
        Task("vllm", dag="engine-sequence", gate="gate2-6", inputs={"engine": "vllm"},
             depends=(Need("preflight"), Need("extra", SUCCEEDED_OR_SKIPPED)),
             when=When.one_of(refs.parameter("engines"), "vllm", "both")),
        Task("sglang", dag="engine-sequence", gate="gate7", inputs={"engine": "sglang"},
             depends=(Need("vllm", SUCCEEDED_OR_SKIPPED),),
             when=When.one_of(refs.parameter("engines"), "sglang", "both")),
        Task("report", step="fake-pass", gate="report", depends=(Need("sglang", SUCCEEDED_OR_SKIPPED),)),
        Task("missing", step="perf", gate="gate4", depends=(Need("report"),)),
    ))
    exit_handler = Task("cleanup", step="cleanup", gate="exit",
                        args=("--workflow-status", str(refs.workflow("status")),
                              "--failures", str(refs.workflow("failures"))))
    return Graph("fake", main, (seq,), exit_handler, {})


def make_runner(tmp_path: Path, graph: Graph, engines: str = "vllm", steps: dict[str, str] | None = None) -> Runner:
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    mods = steps or {n: "gauntlet.steps.gates.cleanup" for n in ("fake-pass", "fake-fail", "fake-engine", "fake-teardown",
                                                     "cleanup")}
    return Runner(graph, PROFILE, run_dir, {"engines": engines, "run-dir": str(run_dir)}, cli="fake_cli",
                  steps=mods, stream=io.StringIO(), cwd=REPO,
                  env={"PYTHONPATH": os.pathsep.join([str(FAKES), str(REPO)])})


def phases(r: Runner) -> dict[str, str]:
    return {x.path: x.phase for x in r.results}


def test_failing_gate_stops_later_gates_and_exit_handler_runs(tmp_path: Path) -> None:
    r = make_runner(tmp_path, fake_graph("smoke"))
    status = r.run()
    assert status == "Failed"
    p = phases(r)
    assert p["preflight"] == "Succeeded"
    assert p["extra"] == "Skipped"
    assert p["vllm/deploy"] == "Succeeded"
    assert p["vllm/smoke"] == "Failed"
    assert p["vllm/perf"] == "Omitted" and p["vllm/perf-more"] == "Omitted" and p["vllm/teardown"] == "Omitted"
    assert p["vllm"] == "Failed"
    assert p["sglang"] == "Omitted" and p["report"] == "Omitted"
    assert p["cleanup"] == "Succeeded"
    # smoke got the deploy task's endpoint output
    smoke_args = json.loads((r.run_dir / "vllm" / "smoke" / "argv.json").read_text())
    assert smoke_args[smoke_args.index("--endpoint") + 1].startswith("http://127.0.0.1:")
    # the exit handler saw the failure and stopped the engine the omitted teardown left behind
    cv = json.loads((r.run_dir / "cleanup" / "verdict.json").read_text())
    assert cv["metrics"]["workflow_status"] == "Failed"
    # every failed node, as Argo lists them: the attempt, the retry node, the sequence, the workflow's root
    assert sorted(f["displayName"] for f in cv["metrics"]["failures"]) == sorted(
        ["smoke(0)", "smoke", "vllm", r._workflow_vars()["name"]])
    assert len(cv["metrics"]["stopped"]) == 1
    pgid = cv["metrics"]["stopped"][0]["pgid"]
    assert group_members(pgid) == []
    assert find_labelled(r.run_dir) == {}
    smoke = next(x for x in r.results if x.path == "vllm/smoke")
    assert smoke.failed_checks[0]["name"] == "answer" and "wrong answer" in smoke.reason


def test_all_pass_runs_everything_in_order_and_when(tmp_path: Path) -> None:
    r = make_runner(tmp_path, fake_graph(None), engines="both")
    assert r.run() == "Failed"                       # only because of the missing step module
    p = phases(r)
    assert p["vllm/perf-more"] == "Succeeded"        # when: unlock_more output == true
    assert p["vllm/teardown"] == "Succeeded" and p["sglang/teardown"] == "Succeeded"
    assert p["report"] == "Succeeded"
    assert p["missing"] == "Failed"
    missing = next(x for x in r.results if x.path == "missing")
    assert "module" in missing.reason and "missing" in missing.reason
    order = [x.path for x in r.results if x.step]
    assert order.index("vllm/deploy") < order.index("vllm/smoke") < order.index("sglang/deploy")
    assert order[-1] == "cleanup"
    assert (r.run_dir / "sglang" / "deploy" / "verdict.json").is_file()
    cv = json.loads((r.run_dir / "cleanup" / "verdict.json").read_text())
    assert cv["metrics"]["stopped"] == []            # teardown had already stopped both


def test_when_false_skips_and_engines_parameter(tmp_path: Path) -> None:
    r = make_runner(tmp_path, fake_graph(None), engines="sglang",
                    steps={n: "gauntlet.steps.gates.cleanup" for n in ("fake-pass", "fake-engine", "fake-teardown", "cleanup",
                                                        "perf")})
    assert r.run() == "Succeeded"
    p = phases(r)
    assert p["vllm"] == "Skipped" and p["sglang"] == "Succeeded" and p["missing"] == "Succeeded"
    reason = next(x.reason for x in r.results if x.path == "vllm")
    assert reason == "when false: workflow.parameters.engines one of vllm|both (is 'sglang')"


def test_summary_lists_each_gate(tmp_path: Path) -> None:
    r = make_runner(tmp_path, fake_graph("smoke"))
    r.run()
    meta = {"run_id": "r1", "profile": "p", "status": "Failed", "started": "s", "finished": "f", "wall_s": 10.0,
            "in_steps_s": 9.5, "overhead_s": 0.5, "overhead_pct": 5.0, "stopped_engines": []}
    text = write_summary(r.run_dir, meta, r.results).read_text()
    assert "| gate3 | `vllm/smoke` | Failed | fail |" in text
    assert "| gate4 | `vllm/perf` | Omitted | - | 0.0 s | depends not met: smoke is Failed, needs Succeeded |" in text
    assert "| gate1 | `extra` | Skipped | - | 0.0 s | when false: tasks.preflight.outputs.parameters.unlock_extra " \
           "== true (is 'false') |" in text
    assert "**answer** (fail): wrong answer" in text


RUN_SCRIPT = """
import io, os, sys
sys.path[:0] = [{fakes!r}]
from pathlib import Path
from tests.test_runner import fake_graph, make_runner
r = make_runner(Path({tmp!r}), fake_graph(None))   # FAKE_SLOW makes smoke hang after the fake engine is up
r.stream = sys.stdout
status = r.run()
import json
(r.run_dir / "tasks.json").write_text(json.dumps({{x.path: [x.phase, x.reason] for x in r.results}}))
print(status, flush=True)
"""


def test_sigint_mid_run_runs_exit_handler_and_leaves_nothing(tmp_path: Path) -> None:
    env = {**os.environ, "FAKE_SLOW": "smoke", "PYTHONPATH": os.pathsep.join([str(FAKES), str(REPO)])}
    proc = subprocess.Popen([sys.executable, "-c", RUN_SCRIPT.format(fakes=str(FAKES), tmp=str(tmp_path))],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    run_dir = tmp_path / "runs" / "r1"
    deadline = time.monotonic() + 60
    while not (run_dir / "vllm" / "smoke" / "argv.json").exists():
        assert time.monotonic() < deadline and proc.poll() is None, proc.stdout.read()
        time.sleep(0.1)
    labelled = find_labelled(run_dir)
    assert len(labelled) == 1                          # the fake engine is up
    proc.send_signal(signal.SIGINT)                    # the runner's Ctrl-C; it forwards SIGINT to the gate
    out, _ = proc.communicate(timeout=90)
    assert "interrupted" in out and out.strip().endswith("Failed"), out
    assert find_labelled(run_dir) == {}
    for pgid in labelled:
        assert group_members(pgid) == []
    cv = json.loads((run_dir / "cleanup" / "verdict.json").read_text())
    assert cv["metrics"]["workflow_status"] == "Failed" and cv["status"] == "pass"
    tasks = json.loads((run_dir / "tasks.json").read_text())
    assert tasks["vllm/smoke"] == ["Failed", "interrupted (Ctrl-C or SIGTERM); the step was stopped"]
    assert tasks["vllm/perf"] == ["Omitted", "not reached: the run was interrupted"]
    assert tasks["report"] == ["Omitted", "not reached: the run was interrupted"]
    assert tasks["cleanup"][0] == "Succeeded"


def test_each_task_says_what_the_plan_has_left(tmp_path: Path) -> None:
    """`gauntlet run` hands the runner its plan (run_local); each finished task then prints the plan's time left
    after it and how far the run is behind or ahead of it. A task the plan lacks prints no plan part."""
    r = make_runner(tmp_path, fake_graph(None), engines="vllm")
    r.follow_plan({"preflight": 60.0, "vllm/deploy": 600.0, "vllm/smoke": 660.0}, 900.0)
    r.run()
    lines = r.stream.getvalue().splitlines()
    done = {ln.split("gate2 ")[-1].split(":")[0]: ln for ln in lines if " SUCCEEDED " in ln or " FAILED " in ln}
    assert "plan: ~5 min left of ~15 min, " in done["vllm/deploy"] and "ahead" in done["vllm/deploy"], done
    assert "plan: ~14 min left of ~15 min" in next(ln for ln in lines if "preflight: SUCCEEDED" in ln)
    assert "plan:" not in next(ln for ln in lines if "vllm/perf: SUCCEEDED" in ln)
