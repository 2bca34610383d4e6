"""Nightly regression: this run's per-case medians against the stored history.

Method (justified and evaluated in docs/regression.md): for each case and
metric, the history is the per-night medians of the last ``window`` nights
with the same profile, engine, engine args and client; with at least
``min_history`` nights, the centre is their median and the scale their MAD
(x1.4826, a robust sigma of one night). Median and MAD ignore the odd bad
night in the history; a relative floor stops a very quiet history from
flagging harmless jitter.

Confirm before alarm, in two stages:

1. *suspect*: the night is worse than the centre by more than
   ``max(k_suspect * sigma, floor * centre)``;
2. *confirm*: the run measures a suspect case again (``confirm_rounds`` fresh
   rounds, same engine, same requests) and the median of those rounds is also
   worse by more than ``max(k_confirm * confirm_sigma, floor * centre)``. ``confirm_sigma``
   is the sd of a median of that many rounds, taken from the history's own rounds: a
   within-night sigma of one round (the median absolute difference between two rounds of
   the same night, pooled over the window) scaled to a median of ``rounds``, plus what the
   night sigma holds beyond the within-night spread of a night's median (the nights'
   own offsets, which fresh rounds on the same night do not average away). Without
   rounds in the history it falls back to ``max(k_confirm_scaled * sigma *
   sqrt(night_rounds / rounds), floor * centre)``.

Only a confirmed suspicion is ``regressed`` (fails the gate); an unconfirmed
one is ``unconfirmed`` (passes, shown). A suspicion with no confirmation rounds
(the engine was gone) falls back to the single-night band ``k``: ``regressed``
beyond it, else ``suspect``. ``improved`` is better than the centre by the
single-night band; fewer nights than ``min_history`` give ``insufficient
history``, which passes.

What users read is the *verdict* of each label (:data:`VERDICT`): ``regressed``, ``suspicious``
(``unconfirmed``, ``suspect``), ``no regression`` (``ok``, ``improved``, with a note) or ``insufficient
data``. A regressed or suspicious verdict names its last good and first bad night and what differed
between them (:data:`PROVENANCE`: image digest, engine args, driver, nodes, model, git revision);
:func:`summary` says the whole night in one line (the top of report.md).
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from gauntlet.steps.gate import Needs
from gauntlet.contract import Check, Status, write_json_atomic
from gauntlet.contract import UsageError
from gauntlet.steps.gates.shared_options import ResultsOptions
from gauntlet.steps.gates.shared_options import carry_upstream, engine_option, upstream_option, upstream_phases
from gauntlet.steps.evidence.stats import mad, median
from gauntlet.steps.options import option

NAME = "regress"
HELP = ("Nightly: each case metric's verdict against the store: regressed / suspicious / no regression / "
        "insufficient data")
NEEDS = Needs(results_secret=True, size="large", windowed=False)

__all__ = ["Options", "Rule", "Label", "METRICS", "judge_metric", "judge", "nightly_medians", "run", "DEFAULT_RULE",
           "suspect_cases", "FAILING", "PASSING", "origin", "PROVENANCE", "nightly_rounds", "round_sigma",
           "confirm_sigma", "median_var", "VERDICT", "VERDICTS", "verdict_of", "summary", "origin_text",
           "what_changed", "judge_night", "night_rows"]

# metric -> (direction: +1 higher is better, -1 lower is better, relative floor)
METRICS: dict[str, tuple[int, float]] = {
    "output_throughput": (+1, 0.02),     # 2%: the confirmation keeps the false alarms (docs/regression.md)
    "request_throughput": (+1, 0.02),
    "p99_ttft_ms": (-1, 0.25),   # P99s of a few prompts are heavy-tailed (docs/regression.md)
    "p99_tpot_ms": (-1, 0.15),
    "p99_e2el_ms": (-1, 0.15),
}
SIGMA_PER_MAD = 1.4826
# what a regressed or suspicious verdict compares between the last good and the first bad night (results store
# columns; args_hash is also the history's key, so within one history it never differs: a changed flag starts a
# new history, whose first nights read "insufficient data")
PROVENANCE = ("image_digest", "args_hash", "driver", "nodes", "model_fingerprint", "git_rev")
# how the one-line summary names them
PROVENANCE_SHORT = {"image_digest": "image", "args_hash": "args", "driver": "driver", "nodes": "nodes",
                    "model_fingerprint": "model", "git_rev": "rev"}


FAILING = ("regressed",)
PASSING = ("ok", "improved", "unconfirmed", "suspect", "insufficient history")
# the user's verdict of each internal label: only a confirmed regression is `regressed` (and fails the gate)
VERDICTS = ("regressed", "suspicious", "no regression", "insufficient data")
VERDICT = {"regressed": "regressed", "unconfirmed": "suspicious", "suspect": "suspicious", "ok": "no regression",
           "improved": "no regression", "insufficient history": "insufficient data"}
# the labels whose night is worse than the suspect band: their verdict carries an origin
WORSE = ("regressed", "unconfirmed", "suspect")


def verdict_of(label: str) -> str:
    """The user's verdict of an internal label (:data:`VERDICT`)."""
    return VERDICT[label]


@dataclass(frozen=True)
class Rule:
    k: float = 3.0                 # single-night band: improved, and a suspicion nobody could confirm
    window: int = 14
    min_history: int = 7
    k_suspect: float = 1.5         # stage 1 (docs/regression.md: chosen on the evaluation's grid)
    k_confirm: float = 2.0         # stage 2, in sds of a confirmation's median from the history's rounds
    confirm_rounds: int = 6
    k_confirm_scaled: float = 3.0  # stage 2 without the history's rounds: night sigmas x sqrt(night / confirm rounds)


DEFAULT_RULE = Rule()


@dataclass(frozen=True)
class Label:
    engine: str
    case: str
    metric: str
    label: str               # ok | regressed | improved | unconfirmed | suspect | insufficient history
    value: float | None
    centre: float | None
    threshold: float | None
    change_rel: float | None
    nights: int
    suspected: bool = False
    suspect_threshold: float | None = None  # stage 1's band (the report's trend draws it)
    confirm_value: float | None = None      # median of the confirmation rounds
    confirm_threshold: float | None = None
    confirm_change_rel: float | None = None
    confirm_rounds: int = 0
    origin: dict[str, Any] | None = None    # regressed / suspicious: last good / first bad night, what differed

    @property
    def verdict(self) -> str:
        """What the user reads: regressed / suspicious / no regression / insufficient data."""
        return verdict_of(self.label)

    @property
    def note(self) -> str:
        """Why the verdict, in a few words (empty for a plain ``ok``)."""
        return _note(self)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "verdict": self.verdict, "note": self.note}


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{x:+.1%}"


def _note(lb: Label) -> str:
    if lb.label == "insufficient history":
        return f"{lb.nights} night(s) of history" + ("" if lb.value is not None else ", no value tonight")
    if lb.label == "improved":
        return f"improved {_pct(lb.change_rel)}"
    if lb.label == "ok":
        return ""
    night = f"night {_pct(lb.change_rel)}"
    if lb.confirm_rounds:
        again = f"{lb.confirm_rounds} fresh rounds {_pct(lb.confirm_change_rel)}"
        return f"{night}, confirmed by {again}" if lb.label == "regressed" else f"{night}, not confirmed by {again}"
    if lb.label == "regressed":
        return f"{night}, beyond the single-night band (no confirmation rounds)"
    return f"{night}, suspected, no confirmation rounds"


# Variance of the median of n independent standard normal rounds (n = 1..12; pi / 2n beyond):
# what a round sigma becomes for a night's median (3 rounds) and a confirmation's (6).
_MEDIAN_VAR = (1.0, 0.5, 0.449, 0.298, 0.287, 0.215, 0.210, 0.168, 0.166, 0.138, 0.137, 0.118)
_SIGMA_PER_PAIR_MAD = 1 / (0.67449 * math.sqrt(2))   # |x - y| of two N(0, s) rounds: median 0.954 s


def median_var(n: int) -> float:
    """Variance of the median of ``n`` independent rounds, in round variances (normal rounds)."""
    return _MEDIAN_VAR[n - 1] if 0 < n <= len(_MEDIAN_VAR) else math.pi / (2 * n)


def round_sigma(nights: Sequence[Sequence[float | None]], min_nights: int = 1) -> float | None:
    """Within-night sigma of one round (pure): the median absolute difference between two rounds of the
    same night, over every such pair of every night, as a normal sigma. Robust to the odd slow round, and
    blind to offsets between nights. None with fewer than ``min_nights`` nights of two or more rounds."""
    diffs, used = [], 0
    for rounds in nights:
        vals = [float(v) for v in rounds if v is not None and math.isfinite(float(v))]
        if len(vals) >= 2:
            used += 1
            diffs += [abs(a - b) for a, b in itertools.combinations(vals, 2)]
    if used < max(min_nights, 1):
        return None
    return _SIGMA_PER_PAIR_MAD * (median(diffs) or 0.0)


def confirm_sigma(night_sigma: float, round_sd: float, night_rounds: int, rounds: int) -> float:
    """The sd of a median of ``rounds`` fresh rounds around the centre (pure): the within-night part,
    ``round_sd`` scaled to a median of ``rounds``, plus the between-night part, what ``night_sigma``
    (the spread of nights' medians of ``night_rounds``) holds beyond its own within-night part."""
    within = round_sd ** 2 * median_var(rounds)
    between = max(0.0, night_sigma ** 2 - round_sd ** 2 * median_var(night_rounds))
    return math.sqrt(within + between)


def judge_metric(value: float | None, history: Sequence[float], direction: int, min_rel: float,
                 rule: Rule = DEFAULT_RULE) -> tuple[str, float | None, float | None, float | None]:
    """(label, centre, threshold, relative change) by the single-night band alone (pure)."""
    j = judge_two_stage(value, history, direction, min_rel, rule)
    label = "ok" if j["label"] == "suspect" else j["label"]
    return label, j["centre"], j["threshold"], j["change_rel"]


def judge_two_stage(value: float | None, history: Sequence[float], direction: int, min_rel: float,
                    rule: Rule = DEFAULT_RULE, confirm: float | None = None, confirm_rounds: int = 0,
                    night_rounds: int = 3, history_rounds: Sequence[Sequence[float | None]] | None = None
                    ) -> dict[str, Any]:
    """Suspect, then confirm (pure): the label and both stages' numbers for one metric.

    ``history_rounds`` are the rounds of the history's nights (oldest first; the last ``window`` are
    used): with them the confirmation is judged in sds of its own median (``confirm_sigma``), without
    them in night sigmas scaled by sqrt(night_rounds / confirm_rounds) (``k_confirm_scaled``).
    """
    hist = [h for h in history if h is not None][-rule.window:]
    out: dict[str, Any] = {"label": "insufficient history", "centre": median(hist) if hist else None,
                           "threshold": None, "change_rel": None, "suspected": False, "confirm_value": None,
                           "confirm_threshold": None, "confirm_change_rel": None, "confirm_rounds": 0,
                           "suspect_threshold": None}
    if value is None or len(hist) < rule.min_history:
        return out
    centre = median(hist)
    if centre is None:                  # no history at all (min_history 0)
        return out
    sigma = SIGMA_PER_MAD * (mad(hist) or 0.0)
    floor = min_rel * abs(centre)
    band, suspect_band = max(rule.k * sigma, floor), max(rule.k_suspect * sigma, floor)
    worse = (centre - value) * direction
    out.update(centre=centre, threshold=band, change_rel=(value - centre) / centre if centre else None,
               suspect_threshold=suspect_band)
    if -worse > band:
        return {**out, "label": "improved"}
    if worse <= suspect_band:
        return {**out, "label": "ok"}
    out["suspected"] = True
    if confirm is None or confirm_rounds <= 0:
        return {**out, "label": "regressed" if worse > band else "suspect"}
    r_sd = round_sigma(list(history_rounds)[-rule.window:], rule.min_history) if history_rounds else None
    if r_sd is None:
        c_band = max(rule.k_confirm_scaled * sigma * math.sqrt(night_rounds / confirm_rounds), floor)
    else:
        c_band = max(rule.k_confirm * confirm_sigma(sigma, r_sd, night_rounds, confirm_rounds), floor)
    out.update(threshold=suspect_band, confirm_value=confirm, confirm_threshold=c_band, confirm_rounds=confirm_rounds,
               confirm_change_rel=(confirm - centre) / centre if centre else None)
    return {**out, "label": "regressed" if (centre - confirm) * direction > c_band else "unconfirmed"}


def judge(current: Mapping[tuple[str, str], Mapping[str, float | None]],
          history: Mapping[tuple[str, str], Sequence[Mapping[str, float | None]]],
          rule: Rule = DEFAULT_RULE, metrics: Mapping[str, tuple[int, float]] = METRICS,
          confirm: Mapping[tuple[str, str], tuple[Mapping[str, float | None], int]] | None = None,
          night_rounds: int = 3,
          history_rounds: Mapping[tuple[str, str], Sequence[Mapping[str, Sequence[float | None]]]] | None = None
          ) -> list[Label]:
    """Labels for every (engine, case) of this night against its history of nights (oldest first).

    ``confirm`` maps a case to (medians of its confirmation rounds, how many rounds); a case absent
    from it had no confirmation (see the module's docstring for what a suspicion then becomes).
    ``history_rounds`` maps a case to its history's nights' rounds ({metric: [round values]}, oldest
    first, as ``nightly_rounds`` gives them): the confirmation's sigma comes from them.
    """
    out = []
    confirm = confirm or {}
    history_rounds = history_rounds or {}
    for (engine, case), vals in sorted(current.items()):
        nights = list(history.get((engine, case), []))[-rule.window:]
        r_nights = list(history_rounds.get((engine, case), []))[-rule.window:]
        c_vals, c_rounds = confirm.get((engine, case), ({}, 0))
        for metric, (direction, min_rel) in metrics.items():
            hist = [h for h in (n.get(metric) for n in nights) if h is not None]
            rounds = [list(n.get(metric) or []) for n in r_nights] or None
            j = judge_two_stage(vals.get(metric), hist, direction, min_rel, rule, c_vals.get(metric), c_rounds,
                                night_rounds, rounds)
            out.append(Label(engine, case, metric, j.pop("label"), vals.get(metric), j.pop("centre"),
                             j.pop("threshold"), j.pop("change_rel"), len(hist), **j))
    return out


def origin(nights: Sequence[tuple[str, Mapping[str, Any], float | None]], current: tuple[str, Mapping[str, Any]],
           lb: Label, direction: int) -> dict[str, Any]:
    """Where a regression came from (pure): ``nights`` are the history's (run id, metadata, value), oldest
    first. The first bad night is the earliest of the unbroken run of nights, ending with this one, that
    are worse than the centre by more than the label's threshold; the last good night is the one before it.
    """
    def bad(v: float | None) -> bool:
        return v is not None and lb.centre is not None and lb.threshold is not None and \
            (lb.centre - v) * direction > lb.threshold

    first_bad: tuple[str, Mapping[str, Any]] = current
    last_good: tuple[str, Mapping[str, Any]] | None = None
    for run_id, meta, value in reversed(list(nights)):
        if bad(value):
            first_bad = (run_id, meta)
            continue
        last_good = (run_id, meta)
        break
    # a column one of the two nights did not record (rows from before it existed) is not a change
    differed = {} if last_good is None else {
        k: {"last_good": last_good[1].get(k), "first_bad": first_bad[1].get(k)}
        for k in PROVENANCE if last_good[1].get(k) != first_bad[1].get(k)
        and last_good[1].get(k) is not None and first_bad[1].get(k) is not None}

    def night(n: tuple[str, Mapping[str, Any]] | None) -> dict[str, Any] | None:
        return None if n is None else {"run_id": n[0], "date": n[1].get("date"), "timestamp": n[1].get("timestamp"),
                                       **{k: n[1].get(k) for k in PROVENANCE}}
    return {"last_good": night(last_good), "first_bad": night(first_bad), "differed": differed}


def suspect_cases(labels: Iterable[Label]) -> list[tuple[str, str]]:
    """The (engine, case) pairs a confirmation should measure again: suspected and not yet confirmed."""
    return sorted({(lb.engine, lb.case) for lb in labels if lb.suspected and not lb.confirm_rounds})


def nightly_medians(rows: Iterable[Mapping[str, Any]], metrics: Iterable[str] = METRICS
                    ) -> dict[str, dict[tuple[str, str], dict[str, float | None]]]:
    """{run_id: {(engine, case): {metric: median of the valid rounds}}}, runs ordered oldest first."""
    return {rid: {key: {m: median(vs) for m, vs in night.items()} for key, night in cases.items()}
            for rid, cases in nightly_rounds(rows, metrics).items()}


def nightly_rounds(rows: Iterable[Mapping[str, Any]], metrics: Iterable[str] = METRICS
                   ) -> dict[str, dict[tuple[str, str], dict[str, list[Any]]]]:
    """{run_id: {(engine, case): {metric: [the valid rounds' values]}}}, runs ordered oldest first."""
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
    return {rid: {key: {m: [x.get(m) for x in rs] for m in metrics} for key, rs in groups[rid].items()}
            for rid in ordered}


def night_rows(rows: Iterable[Mapping[str, Any]], run_id: str
               ) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """(this night's measured rounds, the history's, this night's confirmation rounds) of baseline store rows
    (pure). Like with like: the history is the other runs' measured rounds with the same args hash and client
    per (engine, case) as this night's."""
    rows = list(rows)
    mine = [r for r in rows if r["run_id"] == run_id and r.get("phase") == "measure"]
    confirm_rows = [r for r in rows if r["run_id"] == run_id and r.get("phase") == "confirm"]
    keyinfo = {(r["engine"], r["case"]): (r.get("args_hash"), r.get("client")) for r in mine}
    past = [r for r in rows if r["run_id"] != run_id and r.get("phase") == "measure"
            and keyinfo.get((r["engine"], r["case"])) == (r.get("args_hash"), r.get("client"))]
    return mine, past, confirm_rows


def judge_night(rows: Iterable[Mapping[str, Any]], run_id: str, rule: Rule = DEFAULT_RULE, night_rounds: int = 3,
                confirmed: bool = True) -> list[Label]:
    """The labels of night ``run_id`` against every other night in ``rows`` (pure; baseline store rows, both
    phases): what the regress step decides (without the origins), and what the history page marks on each
    night when given only the rows up to that night. ``confirmed``: the final stage, which takes this night's
    confirmation rounds; the suspect stage does not."""
    mine, past, confirm_rows = night_rows(rows, run_id)
    if not mine:
        return []
    current = nightly_medians(mine)[run_id]
    history: dict[tuple[str, str], list[dict[str, float | None]]] = {}
    history_rounds: dict[tuple[str, str], list[dict[str, list[Any]]]] = {}
    for night in nightly_rounds(past).values():
        for key, vals in night.items():
            history.setdefault(key, []).append({m: median(vs) for m, vs in vals.items()})
            history_rounds.setdefault(key, []).append(vals)
    confirm = {}
    if confirmed and confirm_rows:
        medians = nightly_medians(confirm_rows).get(run_id, {})
        counts: dict[tuple[str, str], int] = {}
        for r in confirm_rows:
            if r.get("valid"):
                counts[(r["engine"], r["case"])] = counts.get((r["engine"], r["case"]), 0) + 1
        confirm = {key: (vals, counts[key]) for key, vals in medians.items()}
    return judge(current, history, rule, confirm=confirm, night_rounds=night_rounds, history_rounds=history_rounds)


# ---- the step ---------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Options(ResultsOptions):
    run_id: str | None = option(None, help="this run's id (default: the run directory's name)")
    stage: str = option("final", choices=("suspect", "final"),
                        help="suspect: inside an engine sequence, name the cases to measure again (never fails); "
                             "final: label every case, confirmation rounds included")
    engine: str | None = option(None, help="only this engine's cases (the suspect stage's sequence)")
    k: float = option(DEFAULT_RULE.k, gt=0, le=100, help="the single-night band in night sigmas (above 0, at most 100; "
                                                       "at least the suspect stage's k_suspect)")
    window: int = option(DEFAULT_RULE.window, ge=1, le=10_000, help="nights of history judged (1 to 10000)")
    min_history: int = option(DEFAULT_RULE.min_history, ge=1, le=10_000,
                              help="nights needed before judging (1 to --window)")
    # the final stage runs whatever happened before it (workflows/graph.py): it judges what was measured, then
    # fails when a task before it did not pass (shared_options.upstream_check), so Argo's RETRY still resets the
    # failed gate (a failed node with a Succeeded descendant is not reset)
    upstream: tuple[str, ...] = upstream_option()

    def __post_init__(self) -> None:
        super().__post_init__()
        upstream_phases(self.upstream)
        if self.k < DEFAULT_RULE.k_suspect:
            raise UsageError(f"--k {self.k}: must be at least the suspect band's k {DEFAULT_RULE.k_suspect} (a night "
                             "beyond the band but inside the suspect band would pass unexamined)")
        if self.min_history > self.window:
            raise UsageError(f"--min-history {self.min_history}: must be at most --window {self.window} (no night "
                             "could ever be judged)")
        if self.engine is not None:
            engine_option(self, self.engine)
        if self.stage not in ("suspect", "final"):
            raise UsageError(f"--stage {self.stage}: suspect or final")

    @property
    def rule(self) -> Rule:
        return replace(DEFAULT_RULE, k=self.k, window=self.window, min_history=self.min_history)


def _detail(lb: Label, rule: Rule) -> str:
    head = lb.verdict if lb.verdict == lb.label else f"{lb.verdict} ({lb.label})"
    if lb.label == "insufficient history":
        return f"{head}: {lb.nights} of {rule.min_history} nights needed"
    text = (f"{lb.value:.4g} vs median {lb.centre:.4g} of {lb.nights} nights "
            f"({lb.change_rel:+.1%}; threshold ±{lb.threshold:.3g})")
    if lb.confirm_rounds:
        text += (f"; confirmation over {lb.confirm_rounds} fresh rounds: {lb.confirm_value:.4g} "
                 f"({lb.confirm_change_rel:+.1%}; threshold ±{lb.confirm_threshold:.3g})")
    elif lb.suspected:
        text += "; suspected, no confirmation rounds: judged on the single-night band"
    if lb.origin:
        text += "; " + origin_text(lb.origin)
    return f"{head}: {text}"


def _short(v: Any) -> str:
    """A provenance value as the summary line shows it: a digest's first 12 hex digits."""
    text = str(v)
    algo, _, digest = text.partition(":")
    return f"{algo}:{digest[:12]}" if algo == "sha256" and len(digest) > 12 else text


def what_changed(o: Mapping[str, Any], short: bool = False) -> str:
    """What differed between an origin's last good and first bad night, one phrase."""
    if not o.get("last_good"):
        return "no good night in the window"
    name = PROVENANCE_SHORT if short else {k: k for k in PROVENANCE}
    fmt = _short if short else str
    parts = [f"{name.get(k, k)} {fmt(v['last_good'])}->{fmt(v['first_bad'])}" for k, v in o["differed"].items()]
    return ", ".join(parts) or "same image, args, driver, nodes, model and revision"


def origin_text(o: Mapping[str, Any]) -> str:
    """An origin in words: the last good and first bad nights (run id, date) and what differed."""
    def night(n: Mapping[str, Any] | None) -> str:
        return "none" if not n else f"{n['run_id']} ({n.get('date') or str(n.get('timestamp') or '?')[:10]})"
    return (f"last good night {night(o.get('last_good'))}, first bad {night(o.get('first_bad'))}: "
            f"{what_changed(o)}")


def summary(labels: Iterable[Mapping[str, Any]]) -> str:
    """The night in one line (pure, over stored label dicts): the count of each verdict, and each regressed
    case metric with its change and where it came from, e.g. ``1 regressed (sglang/chat-c16 output_throughput
    -7.9%, first bad n13: image sha256:aa->sha256:bb), 1 suspicious, 10 no regression``."""
    labels = list(labels)
    counts = {v: 0 for v in VERDICTS}
    regressed = []
    for lb in labels:
        v = lb.get("verdict") or verdict_of(lb["label"])
        counts[v] += 1
        if v == "regressed":
            change = lb.get("confirm_change_rel") if lb.get("confirm_change_rel") is not None else lb.get("change_rel")
            text = f"{lb['engine']}/{lb['case']} {lb['metric']} {_pct(change)}"
            o = lb.get("origin") or {}
            if o.get("first_bad"):
                text += f", first bad {o['first_bad']['run_id']}: {what_changed(o, short=True)}"
            regressed.append(text)
    if not labels:
        return "no regression verdict"
    parts = []
    for v in VERDICTS:
        if not counts[v]:
            continue
        if v == "regressed":
            shown = regressed[:3] + ([f"and {len(regressed) - 3} more"] if len(regressed) > 3 else [])
            parts.append(f"{counts[v]} regressed ({'; '.join(shown)})")
        else:
            parts.append(f"{counts[v]} {v}")
    return ", ".join(parts)


def run(opts: Options, out: Path) -> tuple[list[Check], dict[str, Any]]:
    return carry_upstream(_judge_run(opts, out), opts.upstream, "regress judged what was measured (the labels above)")


def _judge_run(opts: Options, out: Path) -> tuple[list[Check], dict[str, Any]]:
    from gauntlet.steps.evidence.runmeta import run_dir_of
    from gauntlet.steps.evidence.results import load_rounds

    profile = opts.the_profile
    stage = opts.stage
    only = opts.engine
    run_id = opts.run_id or os.environ.get("GAUNTLET_RUN_ID") or run_dir_of(out, in_sequence=stage == "suspect").name
    rule = opts.rule
    got = load_rounds(opts.results_store, profile=profile.name)
    table, quarantined = got.table, [asdict(q) for q in got.quarantined]
    store = [Check("results-store", "fail" if stage == "final" else "skip", "every store file reads",
                   f"{len(quarantined)} quarantined", "; ".join(q.line() for q in got.quarantined)[:2000] +
                   "; their rows are out of the history: judged on the rest")] if quarantined else []
    rows = [r for r in table.to_pylist() if (r.get("experiment") or "baseline") == "baseline"
            and (only is None or r["engine"] == only)]
    mine, past, confirm_rows = night_rows(rows, run_id)
    kept_aside = {"quarantined": quarantined} if quarantined else {}
    nothing = {"outputs": {"regressed": False, "suspect": False, "suspect_cases": ""}, "labels": [], **kept_aside}
    if not mine:
        return [*store, Check("this-run-results", "skip", f"rounds of run {run_id}", None,
                      f"no baseline perf rounds for run {run_id} in the store: nothing to compare")], nothing
    labels = judge_night(rows, run_id, rule, night_rounds=profile.bench.rounds, confirmed=stage == "final")
    labels = [_with_origin(lb, past, mine, rule) if lb.label in WORSE else lb for lb in labels]
    checks = list(store)
    for lb in labels:
        status: Status = "fail" if stage == "final" and lb.label in FAILING else "pass"
        expected = (f"within ±{lb.threshold:.3g} of median" if lb.threshold is not None
                    else f">= {rule.min_history} nights")
        checks.append(Check(f"{lb.engine}/{lb.case}/{lb.metric}", status, expected, lb.verdict, _detail(lb, rule)))
    suspects = suspect_cases(labels)
    doc = {"run_id": run_id, "stage": stage, "rule": asdict(rule), "labels": [lb.to_dict() for lb in labels],
           "rounds": {"measure": _rounds_by_case(mine), "confirm": _rounds_by_case(confirm_rows)}}
    write_json_atomic(Path(out) / "labels.json", doc)
    regressed = stage == "final" and any(lb.label in FAILING for lb in labels)
    outputs = {"regressed": regressed, "suspect": bool(suspects),
               "suspect_cases": ",".join(sorted({case for _, case in suspects}))}
    return checks, {"outputs": outputs, "labels": doc["labels"], "rule": asdict(rule), "run_id": run_id,
                    "stage": stage, "rounds": doc["rounds"], **kept_aside}


def _night_meta(rows: Iterable[Mapping[str, Any]], key: tuple[str, str]) -> dict[str, dict[str, Any]]:
    """run id -> that night's metadata for one (engine, case): its latest round's columns."""
    out: dict[str, dict[str, Any]] = {}
    for r in sorted(rows, key=lambda r: r.get("timestamp") or ""):
        if (r["engine"], r["case"]) == key:
            out[r["run_id"]] = {k: r.get(k) for k in ("date", "timestamp", *PROVENANCE)}
    return out


def _with_origin(lb: Label, past: list[Mapping[str, Any]], mine: list[Mapping[str, Any]], rule: Rule) -> Label:
    key = (lb.engine, lb.case)
    meta = _night_meta(past, key)
    values = nightly_medians([r for r in past if (r["engine"], r["case"]) == key], [lb.metric])
    nights = [(rid, meta[rid], v[key][lb.metric]) for rid, v in values.items() if key in v][-rule.window:]
    run_id = mine[0]["run_id"]
    return replace(lb, origin=origin(nights, (run_id, _night_meta(mine, key)[run_id]), lb, METRICS[lb.metric][0]))


def _rounds_by_case(rows: Iterable[Mapping[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """engine/case -> its rounds (round number, validity, the judged metrics): the report's evidence."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in sorted(rows, key=lambda r: (r.get("timestamp") or "", r.get("round") or 0)):
        out.setdefault(f"{r['engine']}/{r['case']}", []).append(
            {"round": r.get("round"), "valid": r.get("valid"), **{m: r.get(m) for m in METRICS}})
    return out
