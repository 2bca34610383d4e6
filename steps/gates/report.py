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

from gauntlet.steps.gate import Needs
from gauntlet.contract import Check
from gauntlet.contract.layout import RunLayout
from gauntlet.steps.gates.shared_options import ResultsOptions
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
    from gauntlet.steps.evidence.report import build_report

    run_dir = opts.run_dir if opts.run_dir else Path(RunLayout.of_task(out, in_sequence=False).root)
    # into the run directory (what people open) and beside this verdict (the step's Argo artifact)
    written = build_report(run_dir, opts.results_store, profile=opts.the_profile)
    path = written.path
    pngs = sorted(p.name for p in run_dir.glob("*.png"))
    if Path(out).resolve() != run_dir.resolve():
        for name in ("report.md", *pngs):
            shutil.copy2(run_dir / name, Path(out) / name)
    checks = [Check("report", "pass", "report.md written", str(path), f"{path} with {len(pngs)} plot(s): "
                    f"{', '.join(pngs) or 'none'}")]
    if written.corrupt:
        checks.append(Check("evidence", "fail", "every verdict.json a verdict", f"{len(written.corrupt)} corrupt",
                            "; ".join(written.corrupt)[:2000] + " (named in the report; those gates' results are "
                            "unknown)"))
    if written.quarantined:
        checks.append(Check("results-store", "fail", "every store file reads",
                            f"{len(written.quarantined)} quarantined", "; ".join(written.quarantined)[:2000] +
                            "; their rows are out of the history (restore them or delete them)"))
    verdict = opts.regress_verdict
    if verdict is not None and verdict.strip() not in ("pass", "skip"):
        checks.append(Check("regression", "fail", "regress pass or skip", verdict,
                            f"regress ended {verdict!r}: {_regress_failures(run_dir)}; the report is written "
                            f"({path}) and this gate fails so the workflow does"))
    return checks, {"report": str(path), "plots": pngs, **({"corrupt": list(written.corrupt)} if written.corrupt
                                                           else {}),
                    **({"quarantined": list(written.quarantined)} if written.quarantined else {})}


def _regress_failures(run_dir: Path) -> str:
    """The regress gate's failing checks, one line (its verdict may be missing: a crashed step)."""
    from gauntlet.contract import CorruptVerdict, Verdict
    try:
        v = Verdict.read(Path(RunLayout(run_dir).task_dir("regress")))
    except CorruptVerdict as exc:
        return ("no regress verdict (the step did not write one)" if exc.kind == "missing" else str(exc))
    bad = [f"{c.name}: {c.detail}" for c in v.failed_checks()]
    return "; ".join(bad)[:500] or f"status {v.status!r} with no failing check"
