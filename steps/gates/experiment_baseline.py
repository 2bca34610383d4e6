"""Gate 6, the baseline's part: while it is still up, the baseline runs every phase a variant needs of it.

A variant is compared with the baseline phase by phase, on the same cases and requests
(steps/gates/experiment.py). Its ``measure`` phase is compared with this run's Gate 4 evidence; its other
phases (prefix cache: cold and reusable prefix) need the baseline engine itself. This step runs them
for every variant of this engine that has such phases, after perf and before Gate 5 restarts the
engine and Gate 6 releases it, so no variant is ever deployed beside the baseline. Each variant's
experiment reads its phases back from this task's verdict (:func:`gauntlet.steps.gates.experiment.baseline_phases`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gauntlet.contract import Check, UsageError, write_json_atomic
from gauntlet.contract.layout import RunLayout
from gauntlet.params.models import Profile, Variant
from gauntlet.steps.gate import Needs
from gauntlet.steps.gates.shared_options import check_endpoint, engine_option
from gauntlet.steps.gates.experiment import PERF_TASK, baseline_cases, case_names, perf_options, phase_plan
from gauntlet.steps.options import option
from gauntlet.steps.gates.perf import BenchOptions, case_checks, case_table, run_matrix

__all__ = ["NAME", "HELP", "NEEDS", "Options", "run", "needs_baseline", "variants_for"]

NAME = "experiment-baseline"
HELP = "Gate 6: the baseline, still up, runs the phases its variants will be compared on (before it is released)"
# api manage: a retry finds the engine released and redeploys it (steps/gates/engine_present.py)
NEEDS = Needs(model_cache="read", results_secret=True, engine_ranks=True, api="manage", image="bench")


def needs_baseline(variant: Variant, profile: Profile) -> bool:
    """Does the variant have a phase that perf's evidence does not hold for the baseline? (pure)"""
    return any(p != "measure" for p in phase_plan(variant, profile))


def variants_for(profile: Profile, engine: str) -> list[Variant]:
    """The variants that run on ``engine`` and need the baseline beyond perf (pure)."""
    return [v for v in profile.experiments if v.engine in (None, engine) and needs_baseline(v, profile)]


@dataclass(frozen=True, kw_only=True)
class Options(BenchOptions):
    engine: str = option(help="engine name in the profile")
    endpoint: str = option(help="the baseline engine, still up")
    variants: tuple[str, ...] = option((), csv=True, help="variants to run the baseline's phases for (default: "
                                                          "every variant of this engine with phases beyond measure)")

    def __post_init__(self) -> None:
        super().__post_init__()
        engine_option(self, self.engine)
        check_endpoint(self.endpoint)
        known = {v.name for v in self.the_profile.experiments}
        unknown = [v for v in self.variants if v not in known]
        if unknown:
            raise UsageError(f"--variants {','.join(self.variants)}: {', '.join(unknown)} not in profile "
                             f"{self.the_profile.name} (has {', '.join(sorted(known)) or 'none'})")


def run(opts: Options, out: Path) -> tuple[list[Check], dict[str, Any]]:
    profile = opts.the_profile
    engine = profile.engine_name(opts.engine)
    chosen = ([v for v in profile.experiments if v.name in opts.variants] if opts.variants
              else variants_for(profile, engine))
    perf_dir = RunLayout.sibling(out, PERF_TASK)
    names = case_names(profile, baseline_cases(perf_dir))
    bopts = perf_options(opts, engine, opts.endpoint, names)
    spec = profile.engine(engine)
    checks: list[Check] = []
    measured: dict[str, dict[str, Any]] = {}
    for v in chosen:
        if v.engine not in (None, engine):
            checks.append(Check(f"{v.name}/engine", "skip", v.engine, engine, f"variant {v.name} is for {v.engine} only"))
            continue
        measured[v.name] = {}
        for phase, kw in phase_plan(v, profile).items():
            if phase == "measure":
                continue            # perf's evidence is this phase's baseline
            kw = dict(kw, phase_tag=f"{kw['phase_tag']}-baseline")
            res, _ = run_matrix(bopts, out / v.name, spec, f"{v.name}:baseline", **kw)
            measured[v.name][phase] = {
                "tables": {n: case_table(cr.rounds) for n, cr in res.items()},
                "prefix_cache_hit_rate": {n: [(r.get("resources") or {}).get("prefix_cache_hit_rate")
                                              for r in cr.rounds] for n, cr in res.items()},
                "cases": {n: cr.to_dict() for n, cr in res.items()}}
            for cr in res.values():
                checks += [Check(f"{v.name}/{phase}/{c.name}", c.status, c.expected, c.observed, c.detail)
                           for c in case_checks(cr, profile.bench.spread_max_rel) if c.name.endswith("rounds-valid")]
    if not measured:
        checks.append(Check("variants", "skip", "a variant of this engine with phases beyond measure", None,
                            f"no variant of {engine} needs the baseline beyond perf"))
    write_json_atomic(out / "baseline_phases.json", measured)
    return checks, {"engine": engine, "endpoint": opts.endpoint, "cases": names, "perf_dir": str(perf_dir),
                    "variants": measured}
