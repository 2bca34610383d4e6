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
