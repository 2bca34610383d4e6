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


def test_an_engine_still_being_built_waits_without_holding_the_first_engines_gates(tmp_path: Path, monkeypatch) -> None:
    """`make run` starts llama.cpp's cold build in the background (.ci/install-llama-cpp.sh --background): while
    its marker names a live builder, the runner defers llama.cpp's Gate 0 check, runs the first engine's
    sequence, and waits for the build only when llama.cpp's sequence needs the check. The builder is a stand-in
    (a shell that finishes once vLLM's teardown has written its verdict, then makes the program and removes its
    marker, as the install script's build does): the real cold build takes minutes. The check passes only if the
    program exists when it runs, so running it in its place, before the build ended, fails this test."""
    from gauntlet.steps.engines import llamacpp

    marker, prog = tmp_path / "llama.cpp.building", tmp_path / "llama-server"
    monkeypatch.setattr(llamacpp, "build_marker", lambda python: marker)
    eng = str(refs.input_param("engine"))
    seq = Dag("engine-sequence", (
        Task("deploy", step="fake-engine", gate="gate2", args=("--engine", eng), outputs=("endpoint",)),
        Task("smoke", step="fake-pass", gate="gate3", depends=(Need("deploy"),)),
        Task("teardown", step="fake-teardown", gate="gate2", depends=(Need("smoke"),), args=("--engine", eng)),
    ), inputs=("engine",))
    main = Dag("main", (
        Task("preflight", step="fake-pass", gate="gate0"),
        Task("engine-check-vllm", step="engine-check", gate="gate0", args=("--engine", "vllm"),
             depends=(Need("preflight"),)),
        Task("engine-check-llamacpp", step="engine-check", gate="gate0", args=("--engine", "llamacpp"),
             depends=(Need("preflight"),)),
        Task("vllm", dag="engine-sequence", gate="gate2-6", inputs={"engine": "vllm"},
             depends=(Need("engine-check-vllm"),)),
        Task("llamacpp", dag="engine-sequence", gate="gate7", inputs={"engine": "llamacpp"},
             depends=(Need("engine-check-llamacpp"), Need("vllm", SUCCEEDED_OR_SKIPPED))),
    ))
    graph = Graph("fake", main, (seq,), fake_graph().exit_handler, {})
    steps = {n: "gauntlet.steps.gates.cleanup" for n in ("fake-pass", "engine-check", "fake-engine", "fake-teardown",
                                                          "cleanup")}
    r = make_runner(tmp_path, graph, steps=steps)
    r.env["FAKE_PROGRAM_LLAMACPP"] = str(prog)
    r.follow_plan({"engine-check-vllm": 10.0, "engine-check-llamacpp": 10.0, "vllm/deploy": 30.0}, 60.0)
    done = r.run_dir / "vllm" / "teardown" / "verdict.json"
    builder = subprocess.Popen(["bash", "-c", f"until [ -f '{done}' ]; do sleep 0.2; done; sleep 2; "
                                              f"touch '{prog}'; rm -f '{marker}'"])
    marker.write_text(f"{builder.pid} {tmp_path / 'build.log'}")
    try:
        assert r.run() == "Succeeded", phases(r)
    finally:
        builder.kill()
    order = [x.path for x in r.results if x.step]
    assert order.index("vllm/teardown") < order.index("engine-check-llamacpp") < order.index("llamacpp/deploy"), order
    assert phases(r)["engine-check-llamacpp"] == "Succeeded"
    out = r.stream.getvalue()
    assert (f"gate0 engine-check-llamacpp: deferred until a task needs it (llama-server is still being built in the "
            f"background (pid {builder.pid}") in out, out
    assert "engine-check-llamacpp: waited " in out, out
    assert r.build_wait_s >= 1            # the wait is counted apart from the runner's own overhead (run.json)
    # it ran away from its place in the plan: its line has no plan part (the others keep theirs)
    lines = out.splitlines()
    assert "plan:" not in next(ln for ln in lines if "engine-check-llamacpp: SUCCEEDED" in ln)
    assert "plan:" in next(ln for ln in lines if "engine-check-vllm: SUCCEEDED" in ln)


@pytest.mark.parametrize("content, alive, expect", [
    ("{pid} /x/build.log", True, "llama-server is still being built in the background (pid {pid}, its log /x/build.log)"),
    ("{pid} /x/build.log", False, None),
    ("not a pid", True, None),
    (None, True, None),
])
def test_a_build_marker_names_a_live_builder_or_nothing(tmp_path, content, alive, expect) -> None:
    """steps/engines/llamacpp.py building: only a marker naming a live process means "still building"; a builder
    that died (its trap could not run), a garbled marker or none at all leave the check to judge the program."""
    from gauntlet.steps.engines import llamacpp

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    proc = subprocess.Popen(["sleep", "30"])
    if not alive:
        proc.kill()
        proc.wait()
    try:
        if content is not None:
            (venv / "llama.cpp.building").write_text(content.format(pid=proc.pid))
        got = llamacpp.building(str(venv / "bin" / "python"))
        assert got == (expect.format(pid=proc.pid) if expect else None)
        assert llamacpp.building("python") is None          # a bare name: no venv to look in
    finally:
        proc.kill()


def test_install_script_background_mode_returns_at_once_and_its_marker_goes_with_the_build(tmp_path) -> None:
    """The real .ci/install-llama-cpp.sh --background, on an empty cache and a venv whose python fails at once
    (so its build fails at the download, in a second, instead of compiling for minutes): it returns 0 at once,
    its marker names the builder and the log, and when the build ends (here by failing) the marker is gone and
    the log says why."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    py = venv / "bin" / "python"
    py.write_text("#!/bin/sh\necho 'no pip here' >&2\nexit 1\n")
    py.chmod(0o755)
    env = {**os.environ, "GAUNTLET_LLAMA_CACHE": str(tmp_path / "cache")}
    r = subprocess.run(["bash", str(REPO / ".ci" / "install-llama-cpp.sh"), "--background", str(venv)], env=env,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert "building in the background at idle priority" in r.stdout, r.stdout
    marker = venv / "llama.cpp.building"
    deadline = time.monotonic() + 30
    while marker.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not marker.exists(), marker.read_text()
    assert "no pip here" in (venv / "llama.cpp.build.log").read_text()
    assert not (venv / "bin" / "llama-server").exists()
