"""The report step: ``report.md`` and plots for the run directory (the report gate on Argo and locally).

It runs whatever happened before it (once the parameters are valid: workflows/graph.py), and it is the main
DAG's leaf: Argo judges a DAG by its leaf tasks only (v4.0.5 workflow/controller/dag.go ``assessDAGPhase``),
so a report that passed would turn a failed run, or a nightly with a regression, green. It writes the report
first (its "What did not pass" section names each task that failed or did not run, with its verdict's
detail: ``--upstream`` gives the main DAG's phases, each sequence's teardown recorded its own), then fails its
own verdict with an ``upstream`` check when a task before it did not pass, and with a ``regression`` check when
regress (``--regress-verdict``) failed for a reason of its own (not only because a task before it did not pass).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gauntlet.steps.gate import Needs
from gauntlet.contract import Check, Status
from gauntlet.contract.layout import RunLayout
from gauntlet.steps.gates.shared_options import (UPSTREAM, ResultsOptions, carry_upstream, upstream_option,
                                                  upstream_phases)
from gauntlet.steps.evidence.benchmark_report import REPORTS_DIR
from gauntlet.steps.evidence.history import HISTORY_FILE
from gauntlet.steps.options import option

NAME = "report"
HELP = "Write report.md and plots for the run directory"
NEEDS = Needs(results_secret=True, size="large", windowed=False)


@dataclass(frozen=True, kw_only=True)
class Options(ResultsOptions):
    run_dir: Path | None = option(None, help="run directory (default: the parent of --out)")
    regress_verdict: str | None = option(None, help="{{tasks.regress.outputs.parameters.verdict}}: fail after "
                                                    "writing the report unless pass/skip")
    upstream: tuple[str, ...] = upstream_option()
    run: str = option("qualification", choices=("qualification", "nightly"),
                      help="which run of the graph this is: the report of a nightly says what it left out and why")

    def __post_init__(self) -> None:
        super().__post_init__()
        upstream_phases(self.upstream)


def run(opts: Options, out: Path) -> tuple[list[Check], dict[str, Any]]:
    from gauntlet.steps.evidence.report import build_report

    run_dir = opts.run_dir if opts.run_dir else Path(RunLayout.of_task(out, in_sequence=False).root)
    # into the run directory (what people open) and beside this verdict (the step's Argo artifact)
    phases = upstream_phases(opts.upstream)
    written = build_report(run_dir, opts.results_store, profile=opts.the_profile, tasks=phases or None, run=opts.run)
    path = written.path
    pngs = sorted(p.name for p in run_dir.glob("*.png"))
    pages = [name for name in (HISTORY_FILE,) if (run_dir / name).is_file()]
    exported, export_checks = _export_rounds(run_dir, opts)
    if Path(out).resolve() != run_dir.resolve():
        for name in ("report.md", *pngs, *pages):
            shutil.copy2(run_dir / name, Path(out) / name)
        if exported:
            shutil.copytree(run_dir / REPORTS_DIR, Path(out) / REPORTS_DIR, dirs_exist_ok=True)
    checks = [Check("report", "pass", "report.md written", str(path), f"{path} with {len(pngs)} plot(s): "
                    f"{', '.join(pngs) or 'none'}" + (f"; the nightly history {run_dir / pages[0]}" if pages else ""))]
    checks += export_checks
    if written.corrupt:
        checks.append(Check("evidence", "fail", "every verdict.json a verdict", f"{len(written.corrupt)} corrupt",
                            "; ".join(written.corrupt)[:2000] + " (named in the report; those gates' results are "
                            "unknown)"))
    if written.quarantined:
        checks.append(Check("results-store", "fail", "every store file reads",
                            f"{len(written.quarantined)} quarantined", "; ".join(written.quarantined)[:2000] +
                            "; their rows are out of the history (restore them or delete them)"))
    verdict = opts.regress_verdict
    own = _regress_failures(run_dir) if verdict is not None and verdict.strip() not in ("pass", "skip") else None
    if own is not None:
        checks.append(Check("regression", "fail", "regress pass or skip", verdict,
                            f"regress ended {verdict!r}: {own}; the report is written "
                            f"({path}) and this gate fails so the workflow does"))
    return carry_upstream((checks, {"report": str(path), "plots": pngs, "pages": pages,
                                    "benchmark_reports": len(exported),
                                    **({"corrupt": list(written.corrupt)} if written.corrupt else {}),
                                    **({"quarantined": list(written.quarantined)} if written.quarantined else {})}),
                          opts.upstream, f"the report is written ({path}: What did not pass)")


def _export_rounds(run_dir: Path, opts: Options) -> tuple[list[Path], list[Check]]:
    """Every round of the run as a Benchmark Report v0.2 (steps/evidence/benchmark_report.py), one file each in
    ``benchmark-reports/``: a round that does not convert fails the check, naming it."""
    from gauntlet.steps.evidence.benchmark_report import stack_of, write_round_reports

    files, problems = write_round_reports(run_dir, stack_of(opts.the_profile))
    if not files and not problems:
        return [], []
    status: Status = "fail" if problems else "pass"
    return files, [Check("benchmark-report", status, "every round as a Benchmark Report v0.2",
                         f"{len(files)} written, {len(problems)} not",
                         f"{run_dir / REPORTS_DIR}: {len(files)} file(s)" +
                         (f"; not converted: {'; '.join(problems)[:1500]}" if problems else ""))]


def _regress_failures(run_dir: Path) -> str | None:
    """The regress gate's own failing checks, one line (its verdict may be missing: a crashed step); None when
    its only failing check is ``upstream`` (it failed because a task before it did not pass, which this gate's
    own ``upstream`` check names)."""
    from gauntlet.contract import CorruptVerdict, Verdict
    try:
        v = Verdict.read(Path(RunLayout(run_dir).task_dir("regress")))
    except CorruptVerdict as exc:
        return ("no regress verdict (the step did not write one)" if exc.kind == "missing" else str(exc))
    failing = v.failed_checks()
    if failing and all(c.name == UPSTREAM for c in failing):
        return None
    bad = [f"{c.name}: {c.detail}" for c in failing if c.name != UPSTREAM]
    return "; ".join(bad)[:500] or f"status {v.status!r} with no failing check"
