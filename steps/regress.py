"""Nightly regression: this run's per-case medians against the stored history.

Method (justified and evaluated in docs/regression.md): for each case and
metric, the history is the per-night medians of the last ``window`` nights
with the same profile, engine, engine args and client; with at least
``min_history`` nights, the centre is their median and the scale their MAD
(x1.4826, a robust sigma). A night is ``regressed`` when it is worse than the
centre by more than ``max(k * sigma, min_rel * centre)``, ``improved`` when
better by as much, else ``ok``; fewer nights give ``insufficient history``,
which passes. Median and MAD ignore the odd bad night in the history, and the
relative floor stops a very quiet history from flagging harmless jitter.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from steps._evidence import Check, write_json_atomic
from steps._stats import mad, median

NAME = "regress"
HELP = "Nightly: label each case metric ok / regressed / improved / insufficient history against the store"
NEEDS_PROFILE = True

__all__ = ["Rule", "Label", "METRICS", "judge_metric", "judge", "nightly_medians", "run", "DEFAULT_RULE"]

# metric -> (direction: +1 higher is better, -1 lower is better, relative floor)
METRICS: dict[str, tuple[int, float]] = {
    "output_throughput": (+1, 0.03),
    "request_throughput": (+1, 0.03),
    "p99_ttft_ms": (-1, 0.25),   # P99s of a few prompts are heavy-tailed (docs/regression.md)
    "p99_tpot_ms": (-1, 0.15),
    "p99_e2el_ms": (-1, 0.15),
}
SIGMA_PER_MAD = 1.4826


@dataclass(frozen=True)
class Rule:
    k: float = 3.0
    window: int = 14
    min_history: int = 7


DEFAULT_RULE = Rule()


@dataclass(frozen=True)
class Label:
    engine: str
    case: str
    metric: str
    label: str               # ok | regressed | improved | insufficient history
    value: float | None
    centre: float | None
    threshold: float | None
    change_rel: float | None
    nights: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def judge_metric(value: float | None, history: Sequence[float], direction: int, min_rel: float,
                 rule: Rule = DEFAULT_RULE) -> tuple[str, float | None, float | None, float | None]:
    """(label, centre, threshold, relative change) for one metric (pure)."""
    hist = [h for h in history if h is not None][-rule.window:]
    if value is None:
        return "insufficient history", None, None, None
    if len(hist) < rule.min_history:
        return "insufficient history", median(hist), None, None
    centre = median(hist)
    sigma = SIGMA_PER_MAD * (mad(hist) or 0.0)
    threshold = max(rule.k * sigma, min_rel * abs(centre))
    delta = value - centre
    change_rel = delta / centre if centre else None
    worse = -delta * direction
    if worse > threshold:
        return "regressed", centre, threshold, change_rel
    if -worse > threshold:
        return "improved", centre, threshold, change_rel
    return "ok", centre, threshold, change_rel


def judge(current: Mapping[tuple[str, str], Mapping[str, float | None]],
          history: Mapping[tuple[str, str], Sequence[Mapping[str, float | None]]],
          rule: Rule = DEFAULT_RULE, metrics: Mapping[str, tuple[int, float]] = METRICS) -> list[Label]:
    """Labels for every (engine, case) of this night against its history of nights (oldest first)."""
    out = []
    for (engine, case), vals in sorted(current.items()):
        nights = list(history.get((engine, case), []))[-rule.window:]
        for metric, (direction, min_rel) in metrics.items():
            hist = [n.get(metric) for n in nights]
            hist = [h for h in hist if h is not None]
            label, centre, thr, ch = judge_metric(vals.get(metric), hist, direction, min_rel, rule)
            out.append(Label(engine, case, metric, label, vals.get(metric), centre, thr, ch, len(hist)))
    return out


def nightly_medians(rows: Iterable[Mapping[str, Any]], metrics: Iterable[str] = METRICS
                    ) -> dict[str, dict[tuple[str, str], dict[str, float | None]]]:
    """{run_id: {(engine, case): {metric: median of the valid rounds}}}, runs ordered oldest first."""
    metrics = list(metrics)
    groups: dict[str, dict[tuple[str, str], list[Mapping[str, Any]]]] = {}
    stamp: dict[str, str] = {}
    for r in rows:
        if not r.get("valid"):
            continue
        rid = r["run_id"]
        groups.setdefault(rid, {}).setdefault((r["engine"], r["case"]), []).append(r)
        stamp[rid] = max(stamp.get(rid, ""), r.get("timestamp") or "")
    ordered = sorted(groups, key=lambda rid: (stamp[rid], rid))
    return {rid: {key: {m: median(x.get(m) for x in rs) for m in metrics} for key, rs in groups[rid].items()}
            for rid in ordered}


# ---- the step ---------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--results-uri", default=None, help="results store (default: $GAUNTLET_RESULTS_URI or the profile's)")
    p.add_argument("--run-id", default=None, help="this run's id (default: the run directory's name)")
    p.add_argument("--k", type=float, default=DEFAULT_RULE.k)
    p.add_argument("--window", type=int, default=DEFAULT_RULE.window)
    p.add_argument("--min-history", type=int, default=DEFAULT_RULE.min_history)


def results_uri(args: argparse.Namespace) -> str:
    return args.results_uri or os.environ.get("GAUNTLET_RESULTS_URI") or args.profile_obj.results_uri


def run(args: argparse.Namespace, out: Path) -> tuple[list[Check], dict[str, Any]]:
    from steps.results import read_rounds

    profile = args.profile_obj
    run_id = args.run_id or os.environ.get("GAUNTLET_RUN_ID") or Path(out).resolve().parent.name
    rule = Rule(args.k, args.window, args.min_history)
    table = read_rounds(results_uri(args), profile=profile.name)
    rows = [r for r in table.to_pylist() if (r.get("experiment") or "baseline") == "baseline"
            and r.get("phase") == "measure"]
    mine = [r for r in rows if r["run_id"] == run_id]
    if not mine:
        return [Check("this-run-results", "skip", f"rounds of run {run_id}", None,
                      f"no baseline perf rounds for run {run_id} in the store: nothing to compare")], \
            {"outputs": {"regressed": False}, "labels": []}
    # like with like: same args hash and client per (engine, case) as this run
    keyinfo = {(r["engine"], r["case"]): (r.get("args_hash"), r.get("client")) for r in mine}
    past = [r for r in rows if r["run_id"] != run_id and keyinfo.get((r["engine"], r["case"])) ==
            (r.get("args_hash"), r.get("client"))]
    current = nightly_medians(mine)[run_id]
    hist_nights = nightly_medians(past)
    history: dict[tuple[str, str], list[dict[str, float | None]]] = {}
    for night in hist_nights.values():
        for key, vals in night.items():
            history.setdefault(key, []).append(vals)
    labels = judge(current, history, rule)
    checks = []
    for lb in labels:
        status = "fail" if lb.label == "regressed" else "pass"
        if lb.label == "insufficient history":
            detail = f"insufficient history: {lb.nights} of {rule.min_history} nights needed"
        else:
            detail = (f"{lb.label}: {lb.value:.4g} vs median {lb.centre:.4g} of {lb.nights} nights "
                      f"({lb.change_rel:+.1%}; threshold ±{lb.threshold:.3g})")
        checks.append(Check(f"{lb.engine}/{lb.case}/{lb.metric}", status, f"within ±{lb.threshold:.3g} of median"
                            if lb.threshold is not None else f">= {rule.min_history} nights", lb.label, detail))
    doc = {"run_id": run_id, "rule": asdict(rule), "labels": [lb.to_dict() for lb in labels]}
    write_json_atomic(Path(out) / "labels.json", doc)
    regressed = any(lb.label == "regressed" for lb in labels)
    return checks, {"outputs": {"regressed": regressed}, "labels": doc["labels"], "rule": asdict(rule),
                    "run_id": run_id}
