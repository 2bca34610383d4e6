"""The report step: ``report.md`` and plots for the run directory (the report gate on Argo and locally)."""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path
from typing import Any

from steps._evidence import Check

NAME = "report"
HELP = "Write report.md and plots for the run directory"
NEEDS_PROFILE = True


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run-dir", default=None, help="run directory (default: the parent of --out)")
    p.add_argument("--results-uri", default=None, help="results store for the nightly trend")


def run(args: argparse.Namespace, out: Path) -> tuple[list[Check], dict[str, Any]]:
    from steps.report import write_report

    run_dir = Path(args.run_dir) if args.run_dir else Path(out).resolve().parent
    uri = args.results_uri or os.environ.get("GAUNTLET_RESULTS_URI") or args.profile_obj.results_uri
    # into the run directory (what people open) and beside this verdict (the step's Argo artifact)
    path = write_report(run_dir, uri, profile=args.profile_obj)
    pngs = sorted(p.name for p in run_dir.glob("*.png"))
    if Path(out).resolve() != run_dir.resolve():
        for name in ("report.md", *pngs):
            shutil.copy2(run_dir / name, Path(out) / name)
    return [Check("report", "pass", "report.md written", str(path), f"{path} with {len(pngs)} plot(s): "
                  f"{', '.join(pngs) or 'none'}")], {"report": str(path), "plots": pngs}
