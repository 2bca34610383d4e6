"""The report step: ``report.md`` and plots for the run directory (the report gate on Argo and locally).

It runs when ``regress`` succeeded or failed, and it is the main DAG's leaf: Argo judges a DAG
by its leaf tasks only (v4.0.5 workflow/controller/dag.go ``assessDAGPhase``), so a report that
passed would turn a nightly with a regression green. With ``--regress-verdict`` it writes the
report first, then fails its own verdict with a ``regression`` check when regress did not pass.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gauntlet.steps import Needs
from gauntlet.contract import Check
from gauntlet.steps._shared_options import ResultsOptions
from gauntlet.steps.options import option

NAME = "report"
HELP = "Write report.md and plots for the run directory"
NEEDS = Needs(results_secret=True, size="large")


@dataclass(frozen=True, kw_only=True)
class Options(ResultsOptions):
    run_dir: Path | None = option(None, help="run directory (default: the parent of --out)")
    regress_verdict: str | None = option(None, help="{{tasks.regress.outputs.parameters.verdict}}: fail after "
                                                    "writing the report unless pass/skip")


def run(opts: Options, out: Path) -> tuple[list[Check], dict[str, Any]]:
    from gauntlet.steps.report import write_report

    run_dir = opts.run_dir if opts.run_dir else Path(out).resolve().parent
    # into the run directory (what people open) and beside this verdict (the step's Argo artifact)
    path = write_report(run_dir, opts.results_store, profile=opts.the_profile)
    pngs = sorted(p.name for p in run_dir.glob("*.png"))
    if Path(out).resolve() != run_dir.resolve():
        for name in ("report.md", *pngs):
            shutil.copy2(run_dir / name, Path(out) / name)
    checks = [Check("report", "pass", "report.md written", str(path), f"{path} with {len(pngs)} plot(s): "
                    f"{', '.join(pngs) or 'none'}")]
    verdict = opts.regress_verdict
    if verdict is not None and verdict.strip() not in ("pass", "skip"):
        checks.append(Check("regression", "fail", "regress pass or skip", verdict,
                            f"regress ended {verdict!r}: {_regress_failures(run_dir)}; the report is written "
                            f"({path}) and this gate fails so the workflow does"))
    return checks, {"report": str(path), "plots": pngs}


def _regress_failures(run_dir: Path) -> str:
    """The regress gate's failing checks, one line (its verdict may be missing: a crashed step)."""
    import json
    try:
        v = json.loads((run_dir / "regress" / "verdict.json").read_text())
    except (OSError, ValueError):
        return "no regress verdict (the step did not write one)"
    bad = [f"{c.get('name')}: {c.get('detail')}" for c in v.get("checks", []) if c.get("status") in ("fail", "error")]
    return "; ".join(bad)[:500] or f"status {v.get('status')!r} with no failing check"
