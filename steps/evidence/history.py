"""The nightly history page: ``history.html`` beside ``report.md``, what the morning reader opens.

For each regression case (engine, case) and each judged metric (steps/gates/regress.py ``METRICS``), one
chart: a point per night (the median of that night's measured rounds, with a bar from the slowest to the
fastest round), the band regress judged that night against (the median of the nights before it, plus and
minus the suspect threshold: a night outside it is suspected), and a mark on each night by its verdict
(regressed, suspicious, no regression, insufficient data). Each night's verdict is the regress step's own:
:func:`gauntlet.steps.gates.regress.judge_night` over the store's rows up to that night, its confirmation
rounds included, so a night the step called regressed is marked regressed here.

One self-contained file: inline SVG drawn from the numbers and inline CSS, no script, no font or image from
anywhere else, so it opens from the run directory (or an Argo artifact) with no network. Everything but
:func:`write_history` is pure.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gauntlet.steps.gates.regress import (DEFAULT_RULE, METRICS, VERDICTS, Rule, judge_night, nightly_rounds,
                                          summary)

__all__ = ["Night", "CaseHistory", "history_series", "render_html", "write_history", "HISTORY_FILE", "UNITS",
           "STORE_COLUMNS", "MAX_NIGHTS"]

HISTORY_FILE = "history.html"
MAX_NIGHTS = 60          # nights drawn per chart (each judged on the full window before it)
UNITS = {"output_throughput": "output tok/s", "request_throughput": "requests/s", "p99_ttft_ms": "p99 TTFT ms",
         "p99_tpot_ms": "p99 TPOT ms", "p99_e2el_ms": "p99 E2E latency ms"}
# what the page reads from the results store
STORE_COLUMNS = ["run_id", "engine", "case", "valid", "timestamp", "date", "experiment", "phase", "args_hash",
                 "client", *METRICS]


@dataclass(frozen=True)
class Night:
    """One night of one case and metric: its rounds, the band it was judged against, and its verdict."""

    run_id: str
    when: str                      # the night's latest round, "YYYY-MM-DD HH:MM" (UTC as stored)
    value: float | None            # median of the night's valid measured rounds
    low: float | None              # the slowest and fastest of them
    high: float | None
    rounds: int
    centre: float | None           # the history's median (None: too little history)
    band: float | None             # the suspect threshold around it
    verdict: str                   # regressed / suspicious / no regression / insufficient data
    label: str                     # regress's internal label
    note: str
    change_rel: float | None = None
    confirm_value: float | None = None
    confirm_rounds: int = 0
    confirm_change_rel: float | None = None


@dataclass
class CaseHistory:
    engine: str
    case: str
    metrics: dict[str, list[Night]] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.engine}/{self.case}"


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in text.lower())


def history_series(rows: Iterable[Mapping[str, Any]], rule: Rule = DEFAULT_RULE, night_rounds: int = 3,
                   cases: Sequence[tuple[str, str]] | None = None, max_nights: int = MAX_NIGHTS
                   ) -> list[CaseHistory]:
    """Each case's nights, oldest first (pure). ``rows``: the store's rows of the profile (other experiments
    than the baseline are left out here); ``cases``: the regression cases, in order (None: every case with a
    measured night). Each night is judged by :func:`judge_night` on the rows up to and including it."""
    rows = [r for r in rows if (r.get("experiment") or "baseline") == "baseline"]
    measured = [r for r in rows if r.get("phase") == "measure"]
    order = list(nightly_rounds(measured))                # run ids, oldest first
    by_run: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        by_run.setdefault(r["run_id"], []).append(r)
    stamps = {rid: max((str(r.get("timestamp") or "") for r in by_run[rid]), default="") for rid in order}
    keys = list(cases) if cases is not None else sorted({(r["engine"], r["case"]) for r in measured})
    out = {k: CaseHistory(k[0], k[1], {m: [] for m in METRICS}) for k in keys}
    upto: list[Mapping[str, Any]] = []
    for i, rid in enumerate(order):
        upto += by_run[rid]
        if i < len(order) - max_nights:
            continue
        labels = {(lb.engine, lb.case, lb.metric): lb
                  for lb in judge_night(upto, rid, rule, night_rounds=night_rounds)}
        tonight = nightly_rounds([r for r in by_run[rid] if r.get("phase") == "measure"])[rid]
        for key, ch in out.items():
            if key not in tonight:
                continue
            for metric in METRICS:
                vals = [float(v) for v in tonight[key][metric] if v is not None and math.isfinite(float(v))]
                lb = labels.get((*key, metric))
                if lb is None or not vals:
                    continue
                ch.metrics[metric].append(Night(
                    rid, stamps[rid][:16].replace("T", " "), lb.value, min(vals), max(vals), len(vals), lb.centre,
                    lb.suspect_threshold, lb.verdict, lb.label, lb.note, lb.change_rel, lb.confirm_value,
                    lb.confirm_rounds, lb.confirm_change_rel))
    return list(out.values())


# ---- the page ----------------------------------------------------------------

W, H = 760, 210
ML, MR, MT, MB = 70, 16, 14, 34       # margins: the y axis's numbers on the left, the dates below

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1d1d1f; margin: 24px auto;
       max-width: 1000px; padding: 0 16px; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 18px; margin: 28px 0 6px; border-bottom: 1px solid #ddd; }
.summary { font-size: 15px; padding: 8px 12px; background: #f5f5f7; border-left: 4px solid #888; }
.summary.has-regressed { border-left-color: #c62828; } .summary.has-suspicious { border-left-color: #ef8f00; }
.legend span { margin-right: 16px; white-space: nowrap; } .legend svg { vertical-align: middle; }
figure.metric { margin: 10px 0 18px; } figcaption { margin: 2px 0 0 8px; }
.verdict { font-weight: 600; } .verdict.regressed { color: #c62828; } .verdict.suspicious { color: #b86e00; }
.verdict.insufficient-data { color: #777; } .verdict.no-regression { color: #2e7d32; }
ul.marked { margin: 4px 0 0 8px; padding-left: 18px; color: #333; } .empty { color: #777; font-style: italic; }
svg.chart { background: #fff; border: 1px solid #e3e3e3; }
svg .band { fill: #1f77b4; fill-opacity: .16; } svg .centre { stroke: #1f77b4; stroke-dasharray: 3 2; }
svg .spread { stroke: #555; stroke-width: 1.2; } svg .trend { fill: none; stroke: #333; stroke-width: 1; }
svg .axis, svg .tick { stroke: #bbb; } svg text { font-size: 11px; fill: #555; }
svg .mark.no-regression { fill: #333; } svg .mark.insufficient-data { fill: #fff; stroke: #999; stroke-width: 1.5; }
svg .mark.suspicious { fill: #fff; stroke: #ef8f00; stroke-width: 2.5; }
svg .mark.regressed { fill: #c62828; stroke: #7f0000; stroke-width: 1; }
nav a { margin-right: 12px; }
"""

_MARK_R = {"regressed": 6.5, "suspicious": 6.0, "no regression": 3.2, "insufficient data": 3.6}


def _esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _num(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"


def _ticks(lo: float, hi: float, n: int = 4) -> list[float]:
    """About ``n`` round numbers between lo and hi."""
    span = hi - lo
    if span <= 0:
        return [lo]
    raw = span / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(s * mag for s in (1, 2, 2.5, 5, 10) if s * mag >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _chart(nights: Sequence[Night], metric: str) -> str:
    """One metric's trend as inline SVG: band rectangles, round spreads, the median line, verdict marks."""
    ys = [y for n in nights for y in (n.low, n.high, n.value) if y is not None]
    ys += [y for n in nights if n.centre is not None and n.band is not None
           for y in (n.centre - n.band, n.centre + n.band)]
    lo, hi = (min(ys), max(ys)) if ys else (0.0, 1.0)
    pad = (hi - lo) * 0.08 or abs(hi) * 0.05 or 1.0
    lo, hi = lo - pad, hi + pad
    pw, ph = W - ML - MR, H - MT - MB
    step = pw / max(len(nights), 1)

    def x(i: int) -> float:
        return ML + step * (i + 0.5)

    def y(v: float) -> float:
        return MT + ph * (hi - v) / (hi - lo)

    s = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
         f'role="img" aria-label="{_esc(UNITS.get(metric, metric))} per night">']
    s.append(f'<line class="axis" x1="{ML}" y1="{MT}" x2="{ML}" y2="{MT + ph}"/>'
             f'<line class="axis" x1="{ML}" y1="{MT + ph}" x2="{W - MR}" y2="{MT + ph}"/>')
    for t in _ticks(lo, hi):
        s.append(f'<line class="tick" x1="{ML - 4}" y1="{y(t):.1f}" x2="{W - MR}" y2="{y(t):.1f}" '
                 f'stroke-opacity=".35"/><text x="{ML - 6}" y="{y(t) + 4:.1f}" text-anchor="end">{_num(t)}</text>')
    every = max(1, math.ceil(len(nights) / 10))
    for i, n in enumerate(nights):
        if i % every == 0 or i == len(nights) - 1:
            s.append(f'<text x="{x(i):.1f}" y="{H - MB + 16}" text-anchor="middle">{_esc(n.when[5:10])}</text>')
    for i, n in enumerate(nights):           # the band each night was judged against
        if n.centre is not None and n.band is not None:
            top, bottom = y(n.centre + n.band), y(n.centre - n.band)
            s.append(f'<rect class="band" data-run-id="{_esc(n.run_id)}" x="{x(i) - step / 2:.1f}" y="{top:.1f}" '
                     f'width="{step:.1f}" height="{max(bottom - top, 0.5):.1f}"><title>{_esc(n.run_id)}: band '
                     f'{_num(n.centre - n.band)}–{_num(n.centre + n.band)} around the median {_num(n.centre)} '
                     f'of the nights before</title></rect>'
                     f'<line class="centre" x1="{x(i) - step / 2:.1f}" x2="{x(i) + step / 2:.1f}" '
                     f'y1="{y(n.centre):.1f}" y2="{y(n.centre):.1f}"/>')
    for i, n in enumerate(nights):
        if n.low is not None and n.high is not None:
            s.append(f'<line class="spread" x1="{x(i):.1f}" x2="{x(i):.1f}" y1="{y(n.high):.1f}" '
                     f'y2="{y(n.low):.1f}"/>')
    pts = " ".join(f"{x(i):.1f},{y(n.value):.1f}" for i, n in enumerate(nights) if n.value is not None)
    if pts:
        s.append(f'<polyline class="trend" points="{pts}"/>')
    for i, n in enumerate(nights):
        if n.value is None:
            continue
        tip = (f"{n.run_id} ({n.when}): median {_num(n.value)} of {n.rounds} round(s), {_num(n.low)}–"
               f"{_num(n.high)}; {n.verdict}" + (f": {n.note}" if n.note else ""))
        s.append(f'<circle class="mark {_slug(n.verdict)}" data-run-id="{_esc(n.run_id)}" '
                 f'data-verdict="{_esc(n.verdict)}" cx="{x(i):.1f}" cy="{y(n.value):.1f}" '
                 f'r="{_MARK_R.get(n.verdict, 3)}"><title>{_esc(tip)}</title></circle>')
    s.append("</svg>")
    return "".join(s)


def _legend() -> str:
    def swatch(inner: str) -> str:
        return f'<svg width="18" height="14" viewBox="0 0 18 14">{inner}</svg>'
    items = [
        (swatch('<rect class="band" x="0" y="1" width="18" height="12"/>'), "band: history median ± suspect "
         "threshold (outside it a night is suspected)"),
        (swatch('<line class="spread" x1="9" x2="9" y1="1" y2="13"/>'), "the night's rounds, slowest to fastest"),
        *[(swatch(f'<circle class="mark {_slug(v)}" cx="9" cy="7" r="{min(_MARK_R[v], 5.5)}"/>'), v)
          for v in VERDICTS],
    ]
    return '<p class="legend">' + "".join(f"<span>{sw} {_esc(text)}</span>" for sw, text in items) + "</p>"


def _caption(nights: Sequence[Night], metric: str) -> str:
    direction = "higher is better" if METRICS[metric][0] > 0 else "lower is better"
    if not nights:
        return f'<figcaption class="empty">{_esc(UNITS.get(metric, metric))}: no measured night</figcaption>'
    last = nights[-1]
    note = f": {_esc(last.note)}" if last.note else ""
    marked = [n for n in nights if n.verdict in ("regressed", "suspicious")]
    items = "".join(f'<li data-run-id="{_esc(n.run_id)}"><span class="verdict {_slug(n.verdict)}">{_esc(n.verdict)}'
                    f"</span> {_esc(n.run_id)} ({_esc(n.when)}): {_num(n.value)}" +
                    (f" vs {_num(n.centre)}" if n.centre is not None else "") +
                    (f" — {_esc(n.note)}" if n.note else "") + "</li>" for n in marked)
    return (f"<figcaption><b>{_esc(UNITS.get(metric, metric))}</b> ({direction}), last night "
            f"{_esc(last.run_id)}: <span class=\"verdict latest {_slug(last.verdict)}\">{_esc(last.verdict)}</span>"
            f"{note}. {len(nights)} night(s), {len(marked)} marked regressed or suspicious."
            + (f'<ul class="marked">{items}</ul>' if items else "") + "</figcaption>")


def render_html(cases: Sequence[CaseHistory], *, title: str, intro: str = "", notes: Sequence[str] = ()) -> str:
    """The whole page (pure): a section per case, a chart and its verdict text per metric."""
    nights_all = [n for c in cases for ns in c.metrics.values() for n in ns[-1:]]
    last_run = max(((n.when, n.run_id) for n in nights_all), default=("", None))[1]
    latest = [{"engine": ch.engine, "case": ch.case, "metric": m, "verdict": ns[-1].verdict, "label": ns[-1].label,
               "change_rel": ns[-1].change_rel, "confirm_change_rel": ns[-1].confirm_change_rel}
              for ch in cases for m, ns in ch.metrics.items() if ns and ns[-1].run_id == last_run]
    line = f"{last_run}: {summary(latest)}" if latest else "no measured night in the results store"
    worst = next((v for v in ("regressed", "suspicious") if any(lb["verdict"] == v for lb in latest)), "")
    body = [f"<h1>{_esc(title)}</h1>"]
    if intro:
        body.append(f"<p>{_esc(intro)}</p>")
    body.append(f'<p class="summary{" has-" + worst if worst else ""}" id="summary">Last night {_esc(line)}</p>')
    body += [f'<p class="note">{_esc(n)}</p>' for n in notes]
    body.append(_legend())
    if cases:
        body.append("<nav>" + "".join(f'<a href="#{_slug(c.key)}">{_esc(c.key)}</a>' for c in cases) + "</nav>")
    for ch in cases:
        body.append(f'<section class="case" id="{_slug(ch.key)}" data-engine="{_esc(ch.engine)}" '
                    f'data-case="{_esc(ch.case)}"><h2>{_esc(ch.engine)} · {_esc(ch.case)}</h2>')
        if not any(ch.metrics.values()):
            body.append('<p class="empty">No measured night of this case in the results store yet.</p>')
        for metric, nights in ch.metrics.items():
            if nights:
                body.append(f'<figure class="metric" data-metric="{_esc(metric)}">{_chart(nights, metric)}'
                            f"{_caption(nights, metric)}</figure>")
        body.append("</section>")
    if not cases:
        body.append('<p class="empty">No regression case to show.</p>')
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">"
            f"<title>{_esc(title)}</title><style>{_CSS}</style></head><body>\n" + "\n".join(body) +
            "\n</body></html>\n")


def write_history(out_dir: Path, rows: Iterable[Mapping[str, Any]], *, profile: Any = None,
                  rule: Rule = DEFAULT_RULE, notes: Sequence[str] = ()) -> Path:
    """Write ``history.html`` into ``out_dir`` from the store's rows of the profile: the profile's regression
    cases (its nightly's engines and cases) when given one, else every case with a measured night."""
    cases = None
    night_rounds = 3
    title = "Nightly history"
    intro = ("One point per night: the median of its measured rounds (the bar: its slowest to fastest round), "
             "judged by the regress step against the band of the nights before it.")
    if profile is not None:
        cases = [(e, c.name) for e in profile.nightly_engines() for c in profile.nightly_cases()]
        night_rounds = profile.bench.rounds
        title = f"Nightly history · {profile.name}"
    page = render_html(history_series(rows, rule, night_rounds, cases), title=title, intro=intro, notes=notes)
    path = Path(out_dir) / HISTORY_FILE
    path.write_text(page, encoding="utf-8")
    return path
