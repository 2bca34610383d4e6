"""`gauntlet run`'s runner on the real local-cpu graph after failures: what runs on, what is reported, what ends.

The gates that need a real engine are played by the box's stand-in (tests/box/scenario_cli.py: the verdict and
outputs a step writes, and its exit code; no engine starts, so none of their judgement is tested here). The
parameters check, the sequence's teardown, regress, report and the exit handler run for real: they are what
this tests. llama.cpp's engine check fails at Gate 0 and vLLM's prefix-cache variant fails at Gate 6: the vLLM
sequence still runs to its teardown, regress and report run, report.md names each task that did not pass with
its verdict's detail, and the run ends Failed (the rules Argo follows: tests/test_box_scenarios.py,
``experimental-blocked-baseline-reports``).
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

from gauntlet.params import load_profile, profile_path
from gauntlet.workflows.graph import build_graph
from gauntlet.workflows.local import Runner

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
PASS = {"exit": 0}
REFUSED = "llama-server: error: invalid argument: --reasoning-format-x"
NO_PREFIX = "deploy: vllm exited 1 at start-up: --enable-prefix-caching-x is not a flag of vllm serve"
PLAYS = {
    "prewarm": [PASS], "preflight": [PASS], "engine-check-vllm": [PASS],
    "engine-check-llamacpp": [{"exit": 1, "detail": REFUSED}],
    "vllm/deploy": [{"exit": 0, "outputs": {"endpoint": "http://127.0.0.1:9"}}], "vllm/smoke": [PASS],
    "vllm/perf": [{"exit": 0, "outputs": {"unlock_c4_128_32": "false"}}],
    "vllm/suspect": [{"exit": 0, "outputs": {"suspect": "false", "suspect_cases": ""}}],
    "vllm/climb": [PASS], "vllm/baseline-phases": [PASS], "vllm/longctx": [{"exit": 0, "outputs": {"unlock_all_lower": "false"}}],
    "vllm/release-baseline": [PASS], "vllm/exp-prefix-cache": [{"exit": 1, "detail": NO_PREFIX}],
}


def test_a_failed_engine_check_and_a_failed_variant_still_end_in_a_report(tmp_path):
    """Before: the vLLM sequence needed both engine checks to pass, so llama.cpp's failure omitted everything after
    Gate 0 and no report.md was written; a failed variant omitted the teardown, regress and report."""
    profile = load_profile("local-cpu")
    graph = build_graph(profile, "local")
    run_dir = (tmp_path / "runs" / "r1").resolve()
    run_dir.mkdir(parents=True)
    table = tmp_path / "standins.json"
    table.write_text(json.dumps(PLAYS))
    params = {k: v[0] for k, v in graph.parameters.items()} | {"run-dir": str(run_dir)}
    env = {"GAUNTLET_STANDINS": str(table), "GAUNTLET_RUN_DIR": str(run_dir),
           "GAUNTLET_RESULTS_URI": str(tmp_path / "results"), "PYTHONPATH": f"{TESTS}:{REPO}"}
    log = io.StringIO()
    runner = Runner(graph, profile_path("local-cpu"), run_dir, params, python=sys.executable, cli="box.scenario_cli",
                    stream=log, cwd=REPO, env=env)
    status = runner.run()
    phases = {r.path: r.phase for r in runner.results}
    assert status == "Failed", log.getvalue()
    assert phases["llamacpp"] == "Omitted" and phases["vllm/exp-prefix-cache"] == "Failed"
    assert (phases["vllm/teardown"], phases["vllm"], phases["regress"], phases["report"], phases["cleanup"]) == (
        "Failed", "Failed", "Failed", "Failed", "Succeeded")
    # the real teardown released (nothing was left running) and carried the variant's failure
    teardown = json.loads((run_dir / "vllm" / "teardown" / "verdict.json").read_text())
    assert [(c["name"], c["status"]) for c in teardown["checks"]] == [("engine-stopped", "pass"), ("upstream", "fail")]
    assert teardown["metrics"]["upstream"]["exp-prefix-cache"] == "Failed"
    md = (run_dir / "report.md").read_text()
    section = md[md.index("## What did not pass"):md.index("| task | gate |")]
    rows = {r.split(" | ")[0].strip("| "): r.split(" | ")[1:] for r in section.splitlines()
            if r.startswith("| ") and "---" not in r}
    assert list(rows)[1:] == ["engine-check-llamacpp", "vllm", "vllm/exp-prefix-cache", "vllm/teardown", "llamacpp",
                              "regress"], section
    assert REFUSED in rows["engine-check-llamacpp"][1] and NO_PREFIX in rows["vllm/exp-prefix-cache"][1]
    assert rows["llamacpp"][0] == "**Omitted**" and rows["vllm/teardown"][1].startswith("ran anyway")
    report = json.loads((run_dir / "report" / "verdict.json").read_text())
    assert {c["name"]: c["status"] for c in report["checks"]} == {"report": "pass", "upstream": "fail"}
