"""The report step fails the nightly on a regression, after writing the report (Argo judges the DAG by it)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from gauntlet.steps.gates import report as report_step
from gauntlet.steps.runner import run_step


def _run(tmp_path: Path, regress_verdict: str | None) -> tuple[int, dict]:
    run_dir = tmp_path / "run"
    (run_dir / "regress").mkdir(parents=True)
    (run_dir / "regress" / "verdict.json").write_text(json.dumps({
        "gate": "regress", "status": "fail", "checks": [
            {"name": "c16-1k-1k/output_throughput", "status": "fail", "detail": "regressed 12% below the last 14 nights"}]}))
    args = argparse.Namespace(profile="local-cpu", out=str(run_dir / "report"), run_dir=run_dir,
                              results_uri=str(tmp_path / "results"), regress_verdict=regress_verdict)
    rc = run_step(report_step, args)
    return rc, json.loads((run_dir / "report" / "verdict.json").read_text())


@pytest.mark.parametrize("verdict", ["fail", "error"])
def test_regression_fails_the_report_after_writing_it(tmp_path, verdict):
    rc, v = _run(tmp_path, verdict)
    assert rc == 1 and v["status"] == "fail"
    checks = {c["name"]: c for c in v["checks"]}
    assert checks["report"]["status"] == "pass" and (tmp_path / "run" / "report.md").is_file()
    assert checks["regression"]["status"] == "fail"
    assert "c16-1k-1k/output_throughput: regressed 12%" in checks["regression"]["detail"]


@pytest.mark.parametrize("verdict", ["pass", "skip", None])
def test_no_regression_passes(tmp_path, verdict):
    rc, v = _run(tmp_path, verdict)
    assert rc == 0 and [c["name"] for c in v["checks"]] == ["report"]


# ------------------------------------------------------------------ a run that failed still gets its report

def _verdict(run_dir: Path, path: str, *checks: tuple[str, str, str], **metrics) -> None:
    from gauntlet.contract import Check, Verdict, now_iso
    Verdict.of(path.split("/")[-1], now_iso(), [Check(n, st, None, None, d) for n, st, d in checks],
               metrics).write(run_dir / path)


UPSTREAM_MAIN = ("params=Succeeded", "engine-check-sglang=Succeeded", "engine-check-vllm=Failed", "nodes-0=Succeeded",
                 "sglang=Failed", "vllm=Omitted", "regress=Failed")


def _failed_run(tmp_path: Path, upstream: tuple[str, ...] = UPSTREAM_MAIN) -> tuple[int, dict, str]:
    """The run the issue expects first: vLLM's engine check fails (its sequence Omitted), SGLang's DSpark variant
    fails (the next variant still runs), the sequence's teardown and regress ran anyway and carry the failure."""
    run_dir = tmp_path / "run"
    _verdict(run_dir, "engine-check-vllm", ("argv", "fail", "rank 0: vllm serve: unrecognized arguments: --x"))
    _verdict(run_dir, "sglang/exp-dspark", ("deploy", "fail", "requires setting --speculative-draft-model-path"))
    _verdict(run_dir, "sglang/exp-hicache", ("verdict", "pass", "keep baseline"))
    _verdict(run_dir, "sglang/teardown", ("engine-stopped", "pass", "scaled to 0"),
             ("upstream", "fail", "exp-dspark Failed: ..."),
             upstream={"deploy": "Succeeded", "exp-dspark": "Failed", "exp-hicache": "Succeeded"})
    _verdict(run_dir, "regress", ("this-run-results", "skip", "no rounds"), ("upstream", "fail", "..."))
    args = argparse.Namespace(profile="local-cpu", out=str(run_dir / "report"), run_dir=run_dir,
                              results_uri=str(tmp_path / "results"), regress_verdict="fail", upstream=upstream)
    rc = run_step(report_step, args)
    return rc, json.loads((run_dir / "report" / "verdict.json").read_text()), (run_dir / "report.md").read_text()


def test_a_failed_run_is_reported_naming_each_task_that_did_not_pass(tmp_path):
    """Before: report ran only after regress Succeeded or Failed, had no phases, and named nothing that was
    Omitted; now report.md's "What did not pass" names each task, its phase and its verdict's detail."""
    rc, v, md = _failed_run(tmp_path)
    section = md[md.index("## What did not pass"):md.index("| task | gate |")]
    rows = [ln.split(" | ") for ln in section.splitlines() if ln.startswith("| ") and "---" not in ln][1:]
    assert [(r[0].strip("| "), r[1]) for r in rows] == [
        ("engine-check-vllm", "**Failed**"), ("sglang", "**Failed**"), ("sglang/exp-dspark", "**Failed**"),
        ("sglang/teardown", "**verdict fail**"), ("vllm", "**Omitted**"), ("regress", "**Failed**")], section
    why = {r[0].strip("| "): r[2] for r in rows}
    assert why["engine-check-vllm"].startswith("argv: rank 0: vllm serve: unrecognized arguments")
    assert why["sglang/exp-dspark"].startswith("deploy: requires setting --speculative-draft-model-path")
    assert why["sglang"].startswith("a task of its sequence did not pass")
    assert why["vllm"].startswith("not run: a task it depends on did not pass")
    assert why["regress"].startswith("ran anyway") and why["sglang/teardown"].startswith("ran anyway")
    assert "5 task(s) failed, 1 not run" in section
    # the leaf fails so the workflow does; regress only carried the failure: no regression is claimed
    checks = {c["name"]: c for c in v["checks"]}
    assert rc == 1 and v["status"] == "fail" and checks["report"]["status"] == "pass" and "regression" not in checks
    assert checks["upstream"]["observed"] == {"engine-check-vllm": "Failed", "sglang": "Failed", "vllm": "Omitted",
                                              "regress": "Failed"}


def test_every_task_passed_is_said_and_passes(tmp_path):
    rc, v, md = _failed_run(tmp_path, upstream=("params=Succeeded", "vllm=Skipped"))
    assert "upstream" not in {c["name"] for c in v["checks"]}
    # the verdicts that failed are still named, without a phase the orchestrator recorded
    assert "| engine-check-vllm | **verdict fail** |" in md


def test_an_unfilled_phase_is_a_one_line_usage_error(tmp_path, capsys):
    args = argparse.Namespace(profile="local-cpu", out=str(tmp_path / "report"), run_dir=tmp_path,
                              results_uri=str(tmp_path / "results"), upstream=("sglang={{tasks.sglang.status}}",))
    assert run_step(report_step, args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["UsageError: --upstream 'sglang={{tasks.sglang.status}}': expected TASK=PHASE (a task's "
                   "{{tasks.TASK.status}})"]
