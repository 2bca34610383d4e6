"""The run report: ``report.md`` and PNG plots, written into the run directory.

It reads only evidence (every ``verdict.json`` under the run directory, the
perf/ladder/experiment/regress metrics in them) and, for the nightly trend,
the results store. Sections: environment, gate verdicts with their checks,
performance tables (median with min-max and IQR), the engine comparison (only
under the fair A/B rule, else separate experiments and why), a diagnostic client's
numbers in a section of their own (never in those tables), the ladder,
experiments vs baseline, regression labels; plots: throughput vs concurrency
per engine, TTFT/TPOT percentiles, ladder outcome, nightly trend.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import Any

from gauntlet.contract import CorruptVerdict, TransientError, UsageError, Verdict
from gauntlet.contract.layout import RunLayout, verdict_path
from gauntlet.steps.engines import find
from gauntlet.steps.gates.regress import VERDICTS
from gauntlet.steps.gates.shared_options import PASSED_PHASES, UPSTREAM

__all__ = ["write_report", "build_report", "Written", "collect", "screen", "fair_ab", "render_markdown", "corrupt_line",
           "not_passed", "AB_OPTIONS"]

# What must match for two engines' numbers to share a table: the workload-defining options.
# Kernel/back-end choices (attention/MoE backend, all-reduce, autotune, symm-mem) are how an
# engine implements the same experiment, not a different experiment.
AB_OPTIONS = ("context_length", "kv_cache_dtype", "prefix_cache", "hicache", "speculative",
              "max_running_requests", "dtype")
TOPOLOGY = ("tp_size", "ep_size", "dp_size")


def _load(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def collect(run_dir: Path) -> dict[str, Any]:
    """Every verdict in the run, keyed by its path relative to the run directory (pure I/O, no judgement);
    ``corrupt``: the path of each ``verdict.json`` that is not a verdict -> why (the contract's reader)."""
    run_dir = Path(run_dir)
    run = RunLayout(run_dir)
    verdicts, corrupt = {}, {}
    for v in run.verdict_files():
        rel = run.relative(v)
        parts = rel.split("/")
        # the report's own verdict, and the deploy/teardown an experiment runs inside its own task
        if parts[0] == "report" or (len(parts) > 1 and parts[-2].startswith("exp-")):
            continue
        try:
            verdicts[rel] = _as_dict(Verdict.read(v))
        except CorruptVerdict as exc:
            corrupt[rel] = exc.why
    return {"run_dir": str(run_dir), "run_id": run_dir.name, "verdicts": verdicts, "corrupt": corrupt}


def _as_dict(v: Verdict) -> dict[str, Any]:
    """A read verdict as the report's plain dict (its metrics as read: no deep copy)."""
    return {"gate": v.gate, "status": v.status, "started": v.started, "finished": v.finished,
            "checks": [vars(c) for c in v.checks], "metrics": v.metrics}


def _by_gate(verdicts: Mapping[str, Any], gate: str) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in verdicts.items() if v.get("gate") == gate}


def _engine_of(rel: str, doc: Mapping[str, Any]) -> str:
    return str(doc.get("metrics", {}).get("engine") or rel.split("/")[0])


def perf_cases(verdicts: Mapping[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """engine -> case -> case record, from every perf verdict but the climb's (its steps are not cases: they
    are shown apart, :func:`perf_climbs`)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for rel, v in _by_gate(verdicts, "perf").items():
        if v.get("metrics", {}).get("climb"):
            continue
        for name, c in (v.get("metrics", {}).get("cases") or {}).items():
            out.setdefault(_engine_of(rel, v), {})[name] = c
    return out


def perf_climbs(verdicts: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """engine -> its climb to the highest concurrency meeting the SLO (perf --phase climb's metrics)."""
    return {_engine_of(rel, v): v["metrics"]["climb"] for rel, v in _by_gate(verdicts, "perf").items()
            if v.get("metrics", {}).get("climb")}


def _pct(x: Any, nd: int = 0) -> str:
    return "–" if x is None else f"{x:.{nd}%}"


def _engine_figures_section(engine: str, cs: Mapping[str, Mapping[str, Any]], plots: Mapping[str, str]) -> list[str]:
    """The engine's own /metrics over each round beside the client's counts, a row per round; why a figure is
    missing under the table (once per reason); a plot per case."""
    rows = [(n, r) for n, c in sorted(cs.items(), key=lambda kv: (kv[1].get("concurrency", 0), kv[0]))
            for r in c.get("rounds", []) if "engine_notes" in r]
    if not rows:
        return []
    L = [f"#### The engine's own metrics: {engine}", "",
         "From its Prometheus /metrics over each round's window (the sampler's first scrape before the client's first "
         "request, its last after the last reply): maxima of the gauges, growth of the counters. Tokens: the "
         "client's count / the engine's.", "",
         "| case | round | valid | KV usage max | running / waiting max | prefix hit rate | preemptions | "
         "spec acceptance (length, rate) | output tokens | prompt tokens |", "|---|---|---|---|---|---|---|---|---|---|"]
    why: dict[str, set[str]] = {}
    for n, r in rows:
        for col, reason in (r.get("engine_notes") or {}).items():
            why.setdefault(str(reason), set()).add(col)
        acc = (f"{_fmt(r.get('engine_spec_acceptance_length'), 2)}, {_fmt(r.get('engine_spec_acceptance_rate_pct'))}%"
               if r.get("engine_spec_acceptance_length") is not None else "–")
        agree = {True: "", False: " **disagree**", None: " (not compared)"}[r.get("token_counts_agree")]
        L.append(f"| {_md(n)} | {r.get('round')} | {'yes' if r.get('valid') else 'no'} | "
                 f"{_pct(r.get('engine_kv_usage_max'), 1)} | {_fmt(r.get('engine_running_max'), 0)} / "
                 f"{_fmt(r.get('engine_waiting_max'), 0)} | {_pct(r.get('prefix_cache_hit_rate'), 1)} | "
                 f"{_fmt(r.get('engine_preemptions'), 0)} | {acc} | {r.get('total_output_tokens', '–')} / "
                 f"{_fmt(r.get('engine_generation_tokens'), 0)}{agree} | {r.get('total_input_tokens', '–')} / "
                 f"{_fmt(r.get('engine_prompt_tokens'), 0)} |")
    L.append("")
    L += [f"- – in {', '.join(sorted(cols))}: {_md(reason)}" for reason, cols in sorted(why.items())]
    L += [""] if why else []
    for n in sorted(cs):
        key = f"engine-{engine}-{n}"
        if key in plots:
            L += [f"![{engine} {n}: the engine's own metrics per round]({plots[key]})", ""]
    return L


def _slo_section(cs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Each case's p99s against the profile's SLO and the client's own goodput (median of the valid rounds)."""
    rows = [(n, c, c["slo"]) for n, c in sorted(cs.items(), key=lambda kv: (kv[1].get("concurrency", 0), kv[0]))
            if isinstance(c.get("slo"), Mapping) and c["slo"].get("met") is not None]
    if not rows:
        return []
    s0 = rows[0][2]
    L = [f"Goodput under the SLO (p99 TTFT <= {_fmt(s0.get('ttft_p99_ms'), 0)} ms, p99 TPOT <= "
         f"{_fmt(s0.get('tpot_p99_ms'), 0)} ms; goodput: the client's requests/s that met both):", "",
         "| case | conc | TTFT p99 ms | TPOT p99 ms | SLO | goodput req/s | requests meeting it |", "|---|---|---|---|---|---|---|"]
    for n, c, v in rows:
        t = c.get("table") or {}
        L.append(f"| {_md(n)} | {c.get('concurrency')} | {_fmt((t.get('p99_ttft_ms') or {}).get('median'), 0)} | "
                 f"{_fmt((t.get('p99_tpot_ms') or {}).get('median'), 1)} | {'met' if v['met'] else '**missed**'} | "
                 f"{_fmt(v.get('request_goodput'), 3)} | {_pct(v.get('good_share'))} |")
    return L + [""]


def _climb_section(climbs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The qualification's climb per engine: each step, where it stopped and why, the highest meeting the SLO."""
    L: list[str] = []
    for e, cl in sorted(climbs.items()):
        slo = cl.get("slo") or {}
        hi = cl.get("highest")
        L += [f"### Highest load meeting the SLO: {e}", "",
              f"**{'C' + str(hi) if hi is not None else 'no concurrency'}** meets p99 TTFT <= "
              f"{_fmt(slo.get('ttft_p99_ms'), 0)} ms and TPOT <= {_fmt(slo.get('tpot_p99_ms'), 0)} ms on "
              f"{_md(cl.get('shape'))}'s shape ({cl.get('input_len')}/{cl.get('output_len')}), climbing "
              f"{', '.join(str(c) for c in slo.get('climb') or [])}. Stopped: {_md(cl.get('reason'))}"
              + (f"; not measured: {', '.join(f'C{c}' for c in cl.get('not_run') or [])}" if cl.get("not_run") else "")
              + ".", "", "| concurrency | out tok/s | TTFT p99 ms | TPOT p99 ms | step |", "|---|---|---|---|---|"]
        for st in cl.get("steps") or []:
            ok = (st.get("p99_ttft_ms") is not None and st["p99_ttft_ms"] <= slo.get("ttft_p99_ms", 0) and
                  st.get("p99_tpot_ms") is not None and st["p99_tpot_ms"] <= slo.get("tpot_p99_ms", 0))
            L.append(f"| {st.get('concurrency')} | {_fmt(st.get('output_throughput'))} | {_fmt(st.get('p99_ttft_ms'), 0)} "
                     f"| {_fmt(st.get('p99_tpot_ms'), 1)} | "
                     f"{_md(st['invalid']) if st.get('invalid') else 'meets the SLO' if ok else '**misses the SLO**'} |")
        L.append("")
    return L


def perf_diagnostics(verdicts: Mapping[str, Any]) -> dict[str, dict[str, dict[str, dict[str, Any]]]]:
    """client -> engine -> case -> record, from every perf verdict's ``diagnostics`` (another client's
    numbers, kept apart from ``cases``: never in the performance or A/B tables)."""
    out: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
    for rel, v in _by_gate(verdicts, "perf").items():
        for client, cases in (v.get("metrics", {}).get("diagnostics") or {}).items():
            out.setdefault(client, {}).setdefault(_engine_of(rel, v), {}).update(cases or {})
    return out


# a diagnostic client's label (the results store's `client`) -> the name its section carries
DIAGNOSTIC_TITLES = {"sglang-bench-serving": "sglang.bench_serving"}


def _diagnostics_section(verdicts: Mapping[str, Any], cases: Mapping[str, Mapping[str, Any]]) -> list[str]:
    L: list[str] = []
    for client, engines in perf_diagnostics(verdicts).items():
        L += [f"## Diagnostic client: {DIAGNOSTIC_TITLES.get(client, client)} (not part of the A/B table)", "",
              "One run per case, after the case's main rounds, on the same requests the pinned client sent "
              "(drawn by vLLM's own dataset code, replayed through the other client). For reference only: the "
              "main client's median is shown beside it; these numbers never enter the performance tables, the "
              "engine comparison or the results store's main table.", "",
              "| engine | case | conc | completed | out tok/s | main client median out tok/s | ratio | req/s | "
              "TTFT p50 ms | TTFT p99 ms | TPOT p99 ms | ITL p99 ms | E2E p99 ms | requests |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for e, recs in engines.items():
            for name, r in sorted(recs.items()):
                main = ((cases.get(e, {}).get(name) or {}).get("table", {}).get("output_throughput") or {})
                conc = (cases.get(e, {}).get(name) or {}).get("concurrency")
                if r.get("error"):
                    err = str(r["error"]).replace("|", "\\|")
                    L.append(f"| {e} | {name} | {_fmt(conc)} | – | not measured: {err} | {_fmt(main.get('median'))} "
                             "| – | – | – | – | – | – | – | – |")
                    continue
                tput, med = r.get("output_throughput"), main.get("median")
                ratio = f"{tput / med:.2f}x" if tput and med else "–"
                L.append(f"| {e} | {name} | {_fmt(conc if conc is not None else r.get('max_concurrency'))} | "
                         f"{r.get('completed')}/{r.get('num_prompts')} | {_fmt(tput)} | {_fmt(med)} | {ratio} | "
                         f"{_fmt(r.get('request_throughput'), 2)} | {_fmt(r.get('p50_ttft_ms'), 0)} | "
                         f"{_fmt(r.get('p99_ttft_ms'), 0)} | {_fmt(r.get('p99_tpot_ms'))} | "
                         f"{_fmt(r.get('p99_itl_ms'))} | {_fmt(r.get('p99_e2el_ms'), 0)} | "
                         f"`{r.get('requests_sha256', '?')}` |")
        L.append("")
    return L


def perf_meta(verdicts: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for rel, v in _by_gate(verdicts, "perf").items():
        meta = v.get("metrics", {}).get("meta") or {}
        if meta:
            out.setdefault(_engine_of(rel, v), meta)
    return out


def fair_ab(profile: Any, engines: list[str],
            attention: Mapping[str, Mapping[str, str] | None] | None = None) -> tuple[bool, str]:
    """(comparable, why): the same topology (tp/ep/dp, nodes), context and options (pure). ``attention``: engine ->
    its attention backends as Gate 0's engine-check resolved its command with the engine's own code; they stay
    out of the rule (kernels are how an engine implements the experiment) but ``why`` says what each runs."""
    if len(engines) < 2:
        return False, "only one engine ran: nothing to compare"
    if profile is None:
        return False, "the profile is unknown, so topology and options cannot be shown to match"
    missing = [e for e in engines[:2] if e not in profile.engines]
    if missing:
        return False, f"{', '.join(missing)} not in profile {profile.name}: its options are unknown"
    a, b = (profile.engines[e].args.model_dump() for e in engines[:2])
    diffs = [k for k in (*TOPOLOGY, *AB_OPTIONS) if a.get(k) != b.get(k)]
    if diffs:
        return False, (f"{engines[0]} and {engines[1]} differ in {', '.join(diffs)} "
                       f"({'; '.join(f'{k}: {a.get(k)!r} vs {b.get(k)!r}' for k in diffs)})")
    return True, (f"same topology ({', '.join(f'{k}={a.get(k)}' for k in TOPOLOGY)}), context and options"
                  f"{_attention_text(engines[:2], attention or {})}")


def _attention_text(engines: list[str], attention: Mapping[str, Mapping[str, str] | None]) -> str:
    """What each engine runs for attention, compared: one profile value sets different knobs on different
    engines (SGLang's --decode-attention-backend, vLLM's whole --attention-backend), and a phase left to the
    engine (``auto``) is each engine's own choice, never the same kernel (pure)."""
    missing = [e for e in engines if not attention.get(e)]
    if missing:
        return (f"; the attention backends {', '.join(missing)} run{'s' * (len(missing) == 1)} are not recorded "
                "(Gate 0's engine-check resolves them)")
    a, b = (attention[e] or {} for e in engines)
    shown = "; ".join(f"{e} " + ", ".join(f"{k} {v}" for k, v in (attention[e] or {}).items()) for e in engines)
    same = all(k in b and str(v).lower() == str(b[k]).lower() and v != "auto" for k, v in a.items()) and \
        set(a) == set(b)
    if same:
        return f"; the same attention backends, as each engine resolves its command ({shown})"
    return (f"; attention backends differ, as each engine resolves its command (kernels are the engine's, not the "
            f"workload's; auto: the engine picks at start-up): {shown}")


AB_METRICS = (("output_throughput", "out tok/s", 1), ("p50_ttft_ms", "TTFT p50 ms", 0),
              ("p99_tpot_ms", "TPOT p99 ms", 1), ("p99_e2el_ms", "E2E p99 ms", 0))


def _request_sets(case: Mapping[str, Any]) -> set[str] | None:
    """The digests of the request sets a case's valid rounds sent (steps/client/request_set.py); None when a
    valid round recorded none (not drawn: the set is then assumed, not known) or none is valid (pure)."""
    valid = [r for r in case.get("rounds") or [] if isinstance(r, Mapping) and r.get("valid")]
    digests = {r.get("requests_sha256") for r in valid}
    return None if not valid or None in digests else {str(d) for d in digests}


def _ab_table(cases: Mapping[str, Mapping[str, Any]], a: str, b: str) -> list[str]:
    """Case x metric: both engines' median [min-max] over their rounds, the ratio, and whether the two
    ranges are apart (every round of one beyond every round of the other) or overlap (pure). A case whose two
    engines sent different request sets is shown without a ratio, "not compared"; one whose request sets are
    not recorded on both sides is named below the table: the same requests are assumed there, not checked."""
    lines = [f"| case | metric | {a} | {b} | {b} / {a} | rounds apart |", "|---|---|---|---|---|---|"]
    unchecked: list[str] = []
    for name in sorted(set(cases[a]) & set(cases[b])):
        sa, sb = _request_sets(cases[a][name]), _request_sets(cases[b][name])
        differ = sa is not None and sb is not None and sa != sb
        if sa is None or sb is None:
            unchecked.append(name)
        for key, label, nd in AB_METRICS:
            ta, tb = (cases[e][name].get("table", {}).get(key) or {} for e in (a, b))
            if ta.get("median") is None or tb.get("median") is None:
                continue
            if differ:
                lines.append(f"| {name} | {label} | {_cell(ta, nd)} | {_cell(tb, nd)} | – | not compared: different "
                             f"requests ({a} `{', '.join(sorted(sa or ()))}`, {b} `{', '.join(sorted(sb or ()))}`) |")
                continue
            ratio = tb["median"] / ta["median"] if ta["median"] else None
            apart = tb["min"] > ta["max"] or ta["min"] > tb["max"]
            lines.append(f"| {name} | {label} | {_cell(ta, nd)} | {_cell(tb, nd)} | "
                         f"{'–' if ratio is None else f'{ratio:.2f}x'} | {'yes' if apart else 'no: within noise'} |")
    if unchecked:
        lines += ["", f"Request sets not recorded on both engines for {', '.join(unchecked)}: the same requests are "
                      "assumed there, not checked (each round records its digest when the client runs in-process)."]
    return lines


def _known_deviations(verdicts: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for rel, d in _by_gate(verdicts, "smoke").items():
        kd = d.get("metrics", {}).get("known_deviations") or {}
        if kd:
            out.setdefault(_engine_of(rel, d), {}).update(kd)
    return out


def corrupt_line(rel: str, why: str) -> str:
    """How the report names a verdict file that is not a verdict."""
    return f"{verdict_path(PurePosixPath(rel))}: corrupt verdict ({why})"


def _first_problem(d: Mapping[str, Any]) -> str | None:
    """A verdict's first failing check, ``name: detail``, not counting ``upstream`` (the task failed because one
    before it did); None when it has no other."""
    for c in d.get("checks") or []:
        if isinstance(c, dict) and c.get("status") in ("fail", "error") and c.get("name") != UPSTREAM:
            return f"{c.get('name')}: {str(c.get('detail', ''))[:300]}"
    return None


def not_passed(data: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(task path, phase, what failed) of every task that did not pass, in the graph's order (pure).

    The phases are the run's (``data["tasks"]``: the main DAG's, from the report's ``--upstream``) and each
    engine sequence's (its teardown's ``upstream`` metrics: ``<engine>/<task>``); a failed verdict whose phase
    nobody recorded (the teardown itself, a gate run by hand) is named too. What failed: the task's verdict's
    first failing check; "ran anyway" for a task that fails only because one before it did not pass
    (``upstream``); for a task without a verdict, why it has none."""
    v = data.get("verdicts") or {}
    corrupt = data.get("corrupt") or {}
    inner: dict[str, dict[str, str]] = {}          # engine -> {<engine>/<task>: phase}, from its teardown
    for rel, d in v.items():
        up = (d.get("metrics") or {}).get("upstream")
        engine, _, task = rel.partition("/")
        if task == "teardown" and isinstance(up, dict):
            inner[engine] = {f"{engine}/{k}": str(p) for k, p in up.items()}
    by_start = sorted(set(v) | set(corrupt), key=lambda r: (str((v.get(r) or {}).get("started", "")), r))
    ordered: list[tuple[str, str | None]] = []     # phase None: not recorded, judged by its verdict
    for path, phase in (data.get("tasks") or {}).items():
        ordered.append((str(path), str(phase)))
        ordered += list(inner.pop(str(path), {}).items())
        ordered += [(r, None) for r in by_start if r.startswith(f"{path}/")]
    for rest in inner.values():
        ordered += list(rest.items())
    ordered += [(r, None) for r in by_start]

    def bad(path: str, phase: str | None) -> bool:
        if phase is not None:
            return phase not in PASSED_PHASES
        return path in corrupt or (v.get(path) or {}).get("status") in ("fail", "error")

    rows: list[tuple[str, str, str]] = []
    seen: set[str] = set()
    for path, phase in ordered:
        if path in seen or not bad(path, phase):
            continue
        seen.add(path)
        d = v.get(path)
        if path in corrupt:
            why = corrupt_line(path, corrupt[path])
        elif d is not None:
            carried = any(isinstance(c, dict) and c.get("name") == UPSTREAM for c in d.get("checks") or [])
            why = _first_problem(d) or ("ran anyway (it runs whatever happened before it); it fails only because a "
                                        "task before it did not pass" if carried else
                                        f"verdict {d.get('status')} with no failing check")
        elif phase == "Omitted":
            why = "not run: a task it depends on did not pass"
        elif any(p.startswith(f"{path}/") and bad(p, ph) for p, ph in ordered):
            why = "a task of its sequence did not pass (below)"
        else:
            why = "no verdict: the step wrote none (its pod was killed, timed out or never started; see its log)"
        rows.append((path, phase or f"verdict {(d or {}).get('status', 'corrupt')}", why))
    return rows


def _not_passed_section(data: Mapping[str, Any]) -> list[str]:
    rows = not_passed(data)
    if not rows:
        return (["## What did not pass", "", "Every task before the report passed or was skipped.", ""]
                if data.get("tasks") else [])
    failed = sum(ph != "Omitted" for _, ph, _ in rows)
    L = ["## What did not pass", "",
         f"This run did not pass: {failed} task(s) failed, {len(rows) - failed} not run (Omitted).", "",
         "| task | phase | what failed |", "|---|---|---|"]
    L += [f"| {_md(p)} | **{_md(ph)}** | {_md(why)} |" for p, ph, why in rows]
    return [*L, ""]


def _md(text: Any) -> str:
    """Text for one Markdown table cell or line: no pipes or line breaks of its own."""
    return str(text).replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def _fmt(x: Any, nd: int = 1) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def _cell(t: Mapping[str, Any] | None, nd: int = 1) -> str:
    if not t or t.get("median") is None:
        return "–"
    s = f"{t['median']:.{nd}f} [{t['min']:.{nd}f}–{t['max']:.{nd}f}]"
    if t.get("iqr") is not None:
        s += f" IQR {t['iqr']:.{nd}f}"
    return s


PERF_COLUMNS = (("output_throughput", "out tok/s", 1), ("request_throughput", "req/s", 2),
                ("p50_ttft_ms", "TTFT p50 ms", 0), ("p99_ttft_ms", "TTFT p99 ms", 0),
                ("p99_tpot_ms", "TPOT p99 ms", 1), ("p99_itl_ms", "ITL p99 ms", 1),
                ("p99_e2el_ms", "E2E p99 ms", 0))


def _perf_table(cases: Mapping[str, Mapping[str, Any]]) -> list[str]:
    hdr = "| case | conc | in/out | valid | " + " | ".join(c[1] for c in PERF_COLUMNS) + " | spread | stable |"
    lines = [hdr, "|" + "---|" * (hdr.count("|") - 1)]
    for name, c in sorted(cases.items(), key=lambda kv: (kv[1].get("concurrency", 0), kv[0])):
        t = c.get("table", {})
        st = c.get("stability") or {}
        valid = sum(1 for r in c.get("rounds", []) if r.get("valid"))
        cells = " | ".join(_cell(t.get(m), nd) for m, _, nd in PERF_COLUMNS)
        spread = st.get("spread_rel")
        lines.append(f"| {name} | {c.get('concurrency')} | {c.get('input_len')}/{c.get('output_len')} | "
                     f"{valid}/{len(c.get('rounds', []))} | {cells} | {_fmt(spread * 100 if spread is not None else None)}% | "
                     f"{'yes' if st.get('stable') else 'no: ' + str(st.get('reason', ''))} |")
    return lines


def _ladders(verdicts: Mapping[str, Any], profile: Any) -> dict[str, list[dict[str, Any]]]:
    """engine -> rungs, from every longctx verdict; the profile's rungs that never ran are 'not run'."""
    ladders: dict[str, list[dict[str, Any]]] = {}
    for rel, d in _by_gate(verdicts, "longctx").items():
        ladders.setdefault(_engine_of(rel, d), []).extend(d.get("metrics", {}).get("ladder") or [])
    if profile is not None:
        for e in ladders:
            ran = {r["tokens"] for r in ladders[e]}
            for r in profile.longctx.ladder:
                if r.tokens not in ran:
                    ladders[e].append({"tokens": r.tokens, "expect": r.expect, "outcome": "not-run",
                                       "label": "not run", "detail": "requires every lower rung to pass, a probe "
                                       "included" if r.requires_all_lower else "not run in this run",
                                       "probes": [], "probe": r.probe})
    return ladders


def _restart_lines(verdicts: Mapping[str, Any], engine: str) -> list[str]:
    """One line per Gate 5 restart of ``engine`` (a rung over the served context), in the ladder's order."""
    lines = []
    for rel, d in _by_gate(verdicts, "longctx").items():
        if _engine_of(rel, d) != engine:
            continue
        for rs in d.get("metrics", {}).get("engine_restarts") or []:
            how = (f"ready in {rs.get('seconds')} s (start-up {rs.get('startup_s')} s), args {rs.get('args_hash')}"
                   if rs.get("ok") else f"FAILED after {rs.get('seconds')} s: {rs.get('detail')}")
            lines.append(f"- restarted {engine} at context {rs.get('to_context')} (was {rs.get('from_context')}) "
                         f"for the {rs.get('rung')}-token rung: {how}")
    return sorted(lines, key=lambda ln: int(ln.split(" at context ")[1].split()[0])) + ([""] if lines else [])


def _resources_table(cases: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """What the machine and engine did during the rounds (max over rounds unless noted)."""
    def mx(rs: list[dict[str, Any]], k: str) -> Any:
        v = [r[k] for r in rs if r.get(k) is not None]
        return max(v) if v else None

    lines = ["", "| case | CPU util | GPU util | GPU mem used | GPU power W | engine RSS GiB | KV usage | "
             "running / waiting | net rx+tx MB | headroom |", "|---|---|---|---|---|---|---|---|---|---|"]
    any_row = False
    for name, c in sorted(cases.items(), key=lambda kv: (kv[1].get("concurrency", 0), kv[0])):
        rs = [r.get("resources") or {} for r in c.get("rounds", [])]
        if not any(rs):
            continue
        any_row = True
        rss = mx(rs, "engine_tree_rss_bytes_max") or mx(rs, "engine_engine_rss_bytes_max")
        net = [(r.get("net_rx_bytes") or 0) + (r.get("net_tx_bytes") or 0) for r in rs]

        def pct(x: Any) -> str:
            return "–" if x is None else f"{x:.0%}"
        gpu_util = mx(rs, "gpu_util_mean")
        lines.append(f"| {name} | {pct(mx(rs, 'cpu_util_mean'))} | {'–' if gpu_util is None else f'{gpu_util:.0f}%'} | "
                     f"{pct(mx(rs, 'gpu_mem_used_frac_max'))} | {_fmt(mx(rs, 'gpu_power_w_max'), 0)} | "
                     f"{'–' if rss is None else f'{rss / 2**30:.2f}'} | {pct(mx(rs, 'engine_kv_usage_max'))} | "
                     f"{_fmt(mx(rs, 'engine_running_max'), 0)} / {_fmt(mx(rs, 'engine_waiting_max'), 0)} | "
                     f"{max(net) / 1e6:.2f} | {pct(min((r['headroom'] for r in rs if r.get('headroom') is not None), default=None))} |")
    return lines + [""] if any_row else []


def _rank_rows(cs: Mapping[str, Mapping[str, Any]]) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """(case, rank) -> that rank's telemetry in each valid round of the case (the rank's own node, per round)."""
    out: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for name, c in cs.items():
        for r in c.get("rounds", []):
            if not r.get("valid"):
                continue
            for rk in (r.get("telemetry") or {}).get("ranks") or []:
                out.setdefault((name, int(rk.get("rank", 0))), []).append(rk)
    return out


def _rank_telemetry_section(engine: str, cs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """A table per rank and case: what each engine rank's node did during the valid rounds (sampled beside the
    rank, never on the client's machine); a rank whose sampler did not answer is named."""
    rows = _rank_rows(cs)
    notes = sorted({str(n) for c in cs.values() for r in c.get("rounds", [])
                    for n in [(r.get("telemetry") or {}).get("note")] if n})
    if not rows:
        return ([f"- per-rank telemetry of {engine}: none ({'; '.join(notes) or 'not collected by this perf step'})",
                 ""] if any(c.get("rounds") for c in cs.values()) else [])

    def mean(rs: list[dict[str, Any]], k: str) -> float | None:
        v = [x[k] for x in rs if x.get(k) is not None]
        return sum(v) / len(v) if v else None

    def mx(rs: list[dict[str, Any]], k: str) -> float | None:
        v = [x[k] for x in rs if x.get(k) is not None]
        return max(v) if v else None

    def pair(a: float | None, b: float | None, nd: int) -> str:
        return f"{_fmt(a, nd)} / {_fmt(b, nd)}"
    L = [f"#### Per-rank telemetry: {engine}", "",
         "Sampled beside each engine rank on its own node (steps/cluster/telemetry.py), over each valid round's window; "
         "means are over the rounds' samples, maxima over all of them. GB/s: 1e9 bytes/s.", "",
         "| case | rank | node | rounds | GPU util % mean / max | GPU mem max GiB | power W mean / max (per GPU) | "
         "SM MHz | CPU % | RDMA tx / rx GB/s | NIC tx / rx GB/s | GPU source |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    unreachable: list[str] = []
    for (case, rank), rs in sorted(rows.items(), key=lambda kv: ((cs[kv[0][0]].get("concurrency") or 0), kv[0])):
        ok = [x for x in rs if x.get("reachable") and x.get("samples")]
        unreachable += [str(x.get("error")) for x in rs if not x.get("reachable") or not x.get("samples")]
        node = next((x.get("node") or x.get("where") for x in rs if x.get("node") or x.get("where")), "?")
        if not ok:
            L.append(f"| {_md(case)} | {rank} | {_md(node)} | 0/{len(rs)} | **unreachable** | – | – | – | – | – | – | – |")
            continue
        mem, total = mx(ok, "gpu_mem_used_gib_max"), mx(ok, "gpu_mem_total_gib")
        L.append(f"| {_md(case)} | {rank} | {_md(node)} | {len(ok)}/{len(rs)} | "
                 f"{pair(mean(ok, 'gpu_util_mean'), mx(ok, 'gpu_util_max'), 0)} | "
                 f"{_fmt(mem, 1)}{'' if total is None else f' of {total:.0f}'} | "
                 f"{pair(mean(ok, 'power_w_mean'), mx(ok, 'power_w_max'), 0)} | {_fmt(mean(ok, 'sm_clock_mhz_mean'), 0)} | "
                 f"{_fmt(mean(ok, 'cpu_util_mean'), 0)} | "
                 f"{pair(mean(ok, 'rdma_tx_gbps_mean'), mean(ok, 'rdma_rx_gbps_mean'), 2)} | "
                 f"{pair(mean(ok, 'nic_tx_gbps_mean'), mean(ok, 'nic_rx_gbps_mean'), 3)} | "
                 f"{_md(', '.join(sorted({str(x.get('gpu_source')) for x in ok})))} |")
    L.append("")
    L += [f"- **{_md(u)}**" for u in sorted(set(unreachable))]
    return L + ([""] if unreachable else [])


def expert_load_section(engine: str, cs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Per-rank expert load next to throughput, a row per case: only SGLang has a recorder for it."""
    eng = find(engine)
    if eng is None or not eng.expert_recorder:
        name = eng.title if eng else engine
        return [f"- per-rank expert load: not recorded: {name} has no expert distribution interface "
                "(SGLang's /start|stop|dump_expert_distribution_record is the one this pipeline reads)"]
    loads = {n: c["expert_load"] for n, c in cs.items()
             if isinstance(c.get("expert_load"), Mapping) and "skipped" not in c["expert_load"]}
    if not loads:
        why = next((str(c["expert_load"]["skipped"]) for c in cs.values()
                    if isinstance(c.get("expert_load"), Mapping) and c["expert_load"].get("skipped")), None)
        why = why or "engines.sglang.args.expert_distribution_recorder_mode unset"
        return [f"- per-rank expert load: not recorded in this run ({_md(why)})"]
    L = ["", f"#### Per-rank expert load: {engine}", "",
         "SGLang's expert distribution recorder over each case's measured rounds: tokens routed to experts (a token "
         "counts once per expert it picks), summed per EP rank as SGLang places experts; imbalance is max / mean of "
         "the per-rank totals (over the case; per layer: mean and worst).", "",
         "| case | passes | tokens routed | EP ranks | per-rank tokens min–max | imbalance | per layer mean / max "
         "| hottest (layer/expert → rank: × layer mean) |", "|---|---|---|---|---|---|---|---|"]
    notes = []
    for n, e in sorted(loads.items()):
        if e.get("error"):
            L.append(f"| {_md(n)} | — | — | — | — | — | — | not recorded: {_md(e['error'])} |")
            continue
        pr = e.get("per_rank_tokens") or []
        hot = ", ".join(f"L{h['layer']}/E{h['expert']}" + (f"→r{h['rank']}" if h.get("rank") is not None else "")
                        + f": {_fmt(h.get('x_layer_mean'), 1)}×" for h in e.get("hottest") or [])
        L.append(f"| {_md(n)} | {e.get('steps', '—')} | {e.get('tokens', '—')} | {e.get('ep_size') or '—'} | "
                 f"{f'{min(pr)}–{max(pr)}' if pr else '—'} | {_fmt(e.get('imbalance'), 2)} | "
                 f"{_fmt(e.get('imbalance_layer_mean'), 2)} / {_fmt(e.get('imbalance_layer_max'), 2)} | {_md(hot)} |")
        if e.get("note"):
            notes.append(f"- {_md(n)}: {_md(e['note'])}")
    return L + [""] + sorted(set(notes))


def final_regress(verdicts: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The final regress verdicts: the in-sequence suspect stage's labels are repeated (with the confirmation) there."""
    return {k: d for k, d in _by_gate(verdicts, "regress").items() if d.get("metrics", {}).get("stage") != "suspect"}


def _verdict(lb: Mapping[str, Any]) -> str:
    """A stored label's verdict (a verdict written before verdicts were stored: from its label)."""
    from gauntlet.steps.gates.regress import verdict_of
    return str(lb.get("verdict") or verdict_of(str(lb.get("label"))))


def _night_date(n: Mapping[str, Any]) -> str:
    return str(n.get("date") or str(n.get("timestamp") or "?")[:10])


def headline(data: Mapping[str, Any]) -> str:
    """The report's first line (pure): for a nightly, the regression verdicts in one line (steps/gates/regress.py
    ``summary``) and what did not pass; for the qualification, the gates, then the regression verdicts."""
    from gauntlet.steps.gates.regress import summary

    v = data["verdicts"]
    labels = [lb for d in final_regress(v).values() for lb in (d.get("metrics") or {}).get("labels") or []]
    regression = summary(labels)
    statuses = [d.get("status") for d in v.values()]
    failed = sum(s in ("fail", "error") for s in statuses) + len(data.get("corrupt") or {})
    if data.get("run") == "nightly":
        gates = f"; {failed} task(s) did not pass (below)" if failed else ""
        return f"**Nightly**: {regression}{gates}."
    gates = f"{sum(s == 'pass' for s in statuses)} task(s) pass, {failed} did not"
    return f"**Qualification**: {gates}; regression: {regression}."


def _left_out_section(data: Mapping[str, Any], profile: Any) -> list[str]:
    """A nightly's report says what of the qualification it did not run, and why (Profile.nightly_left_out)."""
    if data.get("run") != "nightly" or profile is None:
        return []
    n = profile.nightly
    budget = f", {n.gpu_hours:g} GPU-h" if n.gpu_hours is not None else ""
    L = ["## What this nightly left out", "",
         f"The scheduled regression run ({n.window_h:g} h window{budget}): Gate 0, Gate 1, "
         f"{', '.join(profile.nightly_engines())}: deploy, smoke, Gate 4 on "
         f"{', '.join(c.name for c in profile.nightly_cases())} (with the confirm stage), regress, report, cleanup. "
         "Left out, each measured by the qualification run (submitted by hand):", ""]
    L += [f"- **{_md(what)}**: {_md(why)}" for what, why in profile.nightly_left_out()]
    return [*L, ""]


def render_markdown(data: Mapping[str, Any], profile: Any = None, history: Any = None,
                    plots: Mapping[str, str] | None = None) -> str:
    """The report text (pure over collected evidence)."""
    v = data["verdicts"]
    plots = plots or {}
    L: list[str] = [f"# gauntlet run `{data['run_id']}`", "", headline(data), ""]
    if plots.get("history"):
        L += [f"[Nightly history]({plots['history']}): each regression case's trend, noise band and verdict "
              "marks, night by night (opens in a browser, no network needed).", ""]
    if profile is not None:
        L += [f"Profile **{profile.name}**: {profile.description}", ""]
    order = sorted(v.items(), key=lambda kv: (kv[1].get("started", ""), kv[0]))
    statuses = [d.get("status") for _, d in order]
    corrupt = data.get("corrupt") or {}
    L += [f"Gates: {sum(s == 'pass' for s in statuses)} pass, {sum(s == 'fail' for s in statuses)} fail, "
          f"{sum(s == 'error' for s in statuses)} error, {sum(s == 'skip' for s in statuses)} skip"
          f"{f', {len(corrupt)} corrupt verdict(s)' if corrupt else ''}.", ""]
    L += [f"- {note}" for note in data.get("notes") or []] + ([""] if data.get("notes") else [])
    L += _left_out_section(data, profile)
    L += _not_passed_section(data)
    L += ["| task | gate | verdict | checks pass / fail / skip | first problem |", "|---|---|---|---|---|"]
    for rel, why in sorted(corrupt.items()):
        L.append(f"| {_md(rel)} | ? | **corrupt verdict** | – | {_md(corrupt_line(rel, why))} |")
    for rel, d in order:
        cs = d.get("checks", [])
        n = {k: sum(c.get("status") == k for c in cs) for k in ("pass", "fail", "error", "skip", "probe")}
        bad = next((c for c in cs if c.get("status") in ("fail", "error")), None)
        why = f"{bad['name']}: {str(bad.get('detail', ''))[:120]}".replace("|", "\\|") if bad else ""
        probes = f" (+ {n['probe']} probe)" if n["probe"] else ""    # Gate 5's probe rungs: shown, never failing
        L.append(f"| {rel} | {d.get('gate')} | **{d.get('status')}** | {n['pass']} / {n['fail'] + n['error']} / "
                 f"{n['skip']}{probes} | {why} |")
    L.append("")

    # environment
    L += ["## Environment", ""]
    meta = perf_meta(v)
    if profile is not None:
        import shlex

        from gauntlet.params import load_images
        from gauntlet.steps.engines.commands import args_hash, engine_env, engine_flags
        images = load_images()
        L += ["| engine | role | image | digest | args hash | topology |", "|---|---|---|---|---|---|"]
        for e, spec in profile.engines.items():
            img = images.get(spec.image)
            a = spec.args
            L.append(f"| {e} | {spec.role} | `{img.ref if img else spec.image}` | `{img.digest[:19] if img else '?'}…` "
                     f"| `{args_hash(e, spec)}` | tp{a.tp_size} ep{a.ep_size or 1} dp{a.dp_size or 1}, "
                     f"{max(1, len(profile.hardware.nodes))} node(s), context {a.context_length} |")
        L.append("")
        for e, spec in profile.engines.items():
            # shell-quoted as a person would paste them; a Secret as its reference only
            env = [f"{k}={shlex.quote(val)}" for k, val in engine_env(e, spec).items()]
            env += [f"{k}={ref}" for k, ref in spec.secret_env.items()]
            L += [f"- **{e}** flags: `{shlex.join(engine_flags(e, spec))}`", f"  env: `{' '.join(env) or '(none)'}`"]
        nodes = ", ".join(n.name for n in profile.hardware.nodes) or "this machine (local)"
        L += [f"- nodes: {nodes}; hardware {profile.hardware.gpu_model or profile.hardware.gpu_arch}", ""]
    for e, m in meta.items():
        L.append(f"- {e} measured: client {m.get('client')} ({m.get('client_version')}), model fingerprint "
                 f"`{m.get('model_fingerprint')}`, git `{m.get('git_rev')}`, image `{m.get('image')}`")
    L.append("")

    # gate verdicts
    L += ["## Gate verdicts", ""]
    for rel, why in sorted(corrupt.items()):
        L += [f"### {_md(rel)}: **CORRUPT VERDICT**", "", _md(corrupt_line(rel, why)) + ": the gate's result is "
              "unknown; its evidence is left out of every section below.", ""]
    for rel, d in order:
        L.append(f"### {rel} — {d.get('gate')}: **{str(d.get('status')).upper()}**")
        L.append("")
        L += ["| check | status | detail |", "|---|---|---|"]
        for c in d.get("checks", []):
            detail = str(c.get("detail", "")).replace("|", "\\|").replace("\n", " ")
            L.append(f"| {c.get('name')} | {c.get('status')} | {detail} |")
        L.append("")

    # performance
    cases = perf_cases(v)
    L += ["## Performance (Gate 4)", "",
          "Median of the valid rounds [min–max] and IQR; never the best round. A round counts only when every "
          "prompt completed and none failed.", ""]
    if not cases:
        L += ["No perf results in this run.", ""]
    for e, cs in cases.items():
        L += [f"### {e}", "", *_perf_table(cs), ""]
        L += _resources_table(cs)
        L += _slo_section(cs)
        L += _engine_figures_section(e, cs, plots)
        res = [r.get("resources") or {} for c in cs.values() for r in c.get("rounds", [])]
        if res:
            L.append(f"- sampled: GPU {_md(res[0].get('gpu_source'))}; headroom min "
                     f"{_fmt(min((r['headroom'] for r in res if r.get('headroom') is not None), default=None), 3)}")
            L += expert_load_section(e, cs)
            L.append("")
        L += _rank_telemetry_section(e, cs)
        if f"telemetry-{e}" in plots:
            L += [f"![per-rank telemetry of {e}]({plots[f'telemetry-{e}']})", ""]
    for key in ("throughput", "latency"):
        if key in plots:
            L += [f"![{key}]({plots[key]})", ""]
    L += _climb_section(perf_climbs(v))
    # the baseline first: the comparison reads "experimental / baseline"
    order = profile.engine_order() if profile is not None else []
    engines = sorted(cases, key=lambda e: (order.index(e) if e in order else len(order), e))
    ok, why = fair_ab(profile, engines, {_engine_of(rel, d): d.get("metrics", {}).get("attention")
                                         for rel, d in _by_gate(v, "engine-check").items()})
    if len(engines) >= 2:
        L += ["### Engine comparison", ""]
        if ok:
            L += [f"Fair A/B: {why}; one client, the same seed, and per case the request sets' digests compared.", ""]
            L += _ab_table(cases, engines[0], engines[1]) + [""]
            devs = _known_deviations(v)
            for e in engines:
                if devs.get(e):
                    L.append(f"- {e} passed Gate 3 with {len(devs[e])} declared known deviation(s): "
                             f"{', '.join(sorted(devs[e]))} (engines.{e}.known_deviations)")
        else:
            L += [f"No comparison table: {why}. Each engine's results above are a separate experiment."]
        L.append("")
    L += _diagnostics_section(v, cases)

    # ladder
    L += ["## Long context (Gate 5)", ""]
    ladders = _ladders(v, profile)
    if not ladders:
        L += ["No ladder in this run.", ""]
    for e, rungs in ladders.items():
        L += [f"### {e}", "", "| tokens | expect | outcome | detail | prompt tokens | GPU memory (peak GiB) |",
              "|---|---|---|---|---|---|"]
        for r in sorted(rungs, key=lambda x: x["tokens"]):
            pt = ", ".join(str(p.get("prompt_tokens")) for p in r.get("probes", []) if p.get("prompt_tokens"))
            # a probe (Rung.probe) is shown as one: its result never failed the gate
            expect = f"{r['expect']}, probe" if r.get("probe") else r["expect"]
            mem = (r.get("memory") or {}).get("used_gib_max")
            mem_cell = f"{mem:.1f}: {r.get('memory_detail', '')}" if mem is not None else (
                r.get("memory_detail") or "–")
            L.append(f"| {r['tokens']} | {expect} | {r['label']} | {_md(r['detail'])} | {pt or '–'} | "
                     f"{_md(mem_cell)} |")
        L.append("")
        L += _restart_lines(v, e)
    if "ladder" in plots:
        L += [f"![ladder]({plots['ladder']})", ""]

    # experiments
    L += ["## Experiments vs baseline (Gate 6)", ""]
    exps = _by_gate(v, "experiment")
    if not exps:
        L += ["No experiments in this run.", ""]
    for rel, d in exps.items():
        m = d.get("metrics", {})
        L += [f"### {m.get('variant', rel)} on {m.get('engine', '?')}: **{m.get('verdict', d.get('status'))}**", "",
              f"Change: `{json.dumps(m.get('change'))}`. {m.get('verdict_reason', '')}", ""]
        comparisons = m.get("comparisons") or ({m.get("main_phase") or "measure": m["comparison"]}
                                               if m.get("comparison") else {})
        verdicts = m.get("phase_verdicts") or {}
        for phase, rows in comparisons.items():
            pv = verdicts.get(phase) or {}
            L += [f"**{phase.replace('_', ' ')} phase, baseline vs variant on the same workload** "
                  f"(expected: {pv.get('expected') or '–'}): **{pv.get('verdict') or '–'}**. {pv.get('why') or ''}", "",
                  "| case | out tok/s baseline → variant | TTFT p99 ms | TPOT p99 ms | ITL p99 ms | E2E p99 ms | "
                  "out tok/s rounds: baseline / variant |",
                  "|---|---|---|---|---|---|---|"]
            for r in rows:
                def pair(k: str, r: Mapping[str, Any] = r) -> str:
                    x = r.get(k) or {}      # evidence older than the TPOT/ITL rule has no such column
                    ch = f" ({x['change_rel']:+.1%})" if x.get("change_rel") is not None else ""
                    return f"{_fmt(x.get('baseline'))} → {_fmt(x.get('variant'))}{ch}" if x else "–"
                br = r["output_throughput"].get("baseline_range") or [None, None]
                vr = r["output_throughput"].get("variant_range") or [None, None]
                L.append(f"| {r['case']} | {pair('output_throughput')} | {pair('p99_ttft_ms')} | "
                         f"{pair('p99_tpot_ms')} | {pair('p99_itl_ms')} | "
                         f"{pair('p99_e2el_ms')} | {_fmt(br[0])}–{_fmt(br[1])} / {_fmt(vr[0])}–{_fmt(vr[1])} |")
            L.append("")
        for phase, tables in (m.get("tables") or {}).items():
            hits = (m.get("prefix_cache_hit_rate") or {}).get(phase, {})
            bhits = (m.get("baseline_prefix_cache_hit_rate") or {}).get(phase, {})
            L += [f"{phase.replace('_', ' ')} phase, variant rounds:", "",
                  "| case | out tok/s | TTFT p99 ms | prefix-cache hit rate: variant / baseline |", "|---|---|---|---|"]
            for case, t in tables.items():
                hr = [h for h in hits.get(case, []) if h is not None]
                bh = [h for h in bhits.get(case, []) if h is not None]
                L.append(f"| {case} | {_cell(t.get('output_throughput'))} | {_cell(t.get('p99_ttft_ms'), 0)} | "
                         f"{', '.join(f'{h:.0%}' for h in hr) or '–'} / {', '.join(f'{h:.0%}' for h in bh) or '–'} |")
            L.append("")
        spec = m.get("speculative") or {}
        # SGLang counts no accepted drafts (no rate), only its acceptance length: either one shows the table
        if any((s or {}).get(k) is not None for s in spec.values() for k in ("acceptance_rate_pct", "acceptance_length")):
            L += ["| case | acceptance rate % | acceptance length | draft tokens | engine RSS max: variant / baseline | "
                  "GPU memory used max: variant / baseline |", "|---|---|---|---|---|---|"]
            for case, s in spec.items():
                L.append(f"| {case} | {_fmt(s.get('acceptance_rate_pct'))} | {_fmt(s.get('acceptance_length'), 2)} | "
                         f"{_fmt(s.get('draft_tokens'), 0)} | {_fmt(s.get('engine_rss_bytes_max'), 0)} / "
                         f"{_fmt(s.get('baseline_engine_rss_bytes_max'), 0)} | {_fmt(s.get('gpu_mem_used_frac_max'), 2)} / "
                         f"{_fmt(s.get('baseline_gpu_mem_used_frac_max'), 2)} |")
            L.append("")

    # regression
    L += ["## Nightly regression", ""]
    reg = final_regress(v)
    labels = [lb for d in reg.values() for lb in d.get("metrics", {}).get("labels", [])]
    if not labels:
        L += ["No regression verdict in this run." if not reg else
              str((next(iter(reg.values())).get("checks") or [{}])[0].get("detail", "")), ""]
    else:
        L += ["Each case and metric is one of **regressed**, **suspicious**, **no regression** or **insufficient "
              "data**. A night worse than its history's band is suspected; the run then measures that case again on "
              "fresh rounds, and only a *confirmed* suspicion is regressed and fails the gate; one the fresh rounds "
              "do not confirm is suspicious (docs/regression.md).", "",
              "| engine | case | metric | verdict | note | value | history median | change | nights | "
              "confirmation (rounds) | confirmation change |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        rank = {name: i for i, name in enumerate(VERDICTS)}
        for lb in sorted(labels, key=lambda x: rank.get(_verdict(x), len(rank))):
            ch = f"{lb['change_rel']:+.1%}" if lb.get("change_rel") is not None else "–"
            cch = f"{lb['confirm_change_rel']:+.1%}" if lb.get("confirm_change_rel") is not None else "–"
            conf = (f"{_fmt(lb.get('confirm_value'), 2)} ({lb.get('confirm_rounds')})" if lb.get("confirm_rounds")
                    else "–")
            L.append(f"| {lb['engine']} | {lb['case']} | {lb['metric']} | **{_verdict(lb)}** | "
                     f"{_md(lb.get('note') or '')} | {_fmt(lb.get('value'), 2)} "
                     f"| {_fmt(lb.get('centre'), 2)} | {ch} | {lb.get('nights')} | {conf} | {cch} |")
        L.append("")
        origins: dict[str, tuple[list[str], dict[str, Any]]] = {}   # one line per case and origin
        for lb in labels:
            o = lb.get("origin") or {}
            if o.get("first_bad"):
                key = f"{lb['engine']}/{lb['case']} " + json.dumps(o, sort_keys=True, default=str)
                origins.setdefault(key, ([], o))[0].append(f"{lb['metric']} {_verdict(lb)}")
        for key, (metrics, o) in origins.items():
            what = "; ".join(f"{k}: `{v['last_good']}` → `{v['first_bad']}`" for k, v in o["differed"].items())
            good, first = o.get("last_good"), o["first_bad"]
            same = ("nothing recorded differs (image digest, engine args, driver, nodes, model, git revision)"
                    if good else "nothing to compare it with")
            L += [f"Where {key.split(' ')[0]} ({', '.join(metrics)}) changed: last good night "
                  + (f"{good['run_id']} ({_night_date(good)})" if good else "none in the window")
                  + f", first bad night {first['run_id']} ({_night_date(first)}); {what or same}.", ""]
        rounds = {k: r for d in reg.values() for k, r in ((d.get("metrics") or {}).get("rounds") or {}).items()}
        suspected = sorted({f"{lb['engine']}/{lb['case']}" for lb in labels if lb.get("suspected")})
        for key in suspected:
            first = (rounds.get("measure") or {}).get(key) or []
            again = (rounds.get("confirm") or {}).get(key) or []
            L += [f"Rounds of {key}, output tok/s: night {', '.join(_fmt(r.get('output_throughput'), 2) for r in first) or '–'}"
                  f"; confirmation {', '.join(_fmt(r.get('output_throughput'), 2) for r in again) or 'not measured'}.", ""]
    if "trend" in plots:
        L += [f"![nightly trend]({plots['trend']})", ""]
    return "\n".join(L) + "\n"


# ---- plots -------------------------------------------------------------------

def _plots(run_dir: Path, data: Mapping[str, Any], profile: Any, history: Any) -> dict[str, str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out: dict[str, str] = {}
    cases = perf_cases(data["verdicts"])
    if cases:
        fig, ax = plt.subplots(figsize=(6, 4))
        for e, cs in cases.items():
            pts = sorted((c.get("concurrency", 0), c.get("table", {}).get("output_throughput", {})) for c in cs.values())
            pts = [(x, t) for x, t in pts if t.get("median") is not None]
            if pts:
                xs = [x for x, _ in pts]
                med = [t["median"] for _, t in pts]
                err = [[t["median"] - t["min"] for _, t in pts], [t["max"] - t["median"] for _, t in pts]]
                ax.errorbar(xs, med, yerr=err, marker="o", capsize=4, label=e)
        concs = sorted({c.get("concurrency", 0) for cs in cases.values() for c in cs.values()})
        ax.set_xticks(concs, [str(x) for x in concs])
        ax.set_xlim(min(concs) - 1, max(concs) + 1)
        ax.set_ylim(bottom=0)
        ax.set(xlabel="concurrency", ylabel="output tokens/s (median, min–max)",
               title="Throughput vs concurrency")
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(run_dir / "throughput.png", dpi=100)
        plt.close(fig)
        out["throughput"] = "throughput.png"

        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        labels, width = [], 0.25
        rows = [(e, n, c) for e, cs in cases.items() for n, c in sorted(cs.items())]
        for ax, metric in zip(axes, ("ttft", "tpot"), strict=True):
            for i, p in enumerate((50, 95, 99)):
                vals = [(c.get("table", {}).get(f"p{p}_{metric}_ms") or {}).get("median") or 0 for _, _, c in rows]
                ax.bar([j + i * width for j in range(len(rows))], vals, width, label=f"p{p}")
            labels = [f"{e}\n{n}" for e, n, _ in rows]
            ax.set_xticks([j + width for j in range(len(rows))], labels, fontsize=7)
            ax.set(ylabel="ms (median of rounds)", title=metric.upper() + " percentiles")
            ax.legend()
        fig.tight_layout()
        fig.savefig(run_dir / "latency.png", dpi=100)
        plt.close(fig)
        out["latency"] = "latency.png"

    for e, cs in cases.items():
        drawn = _telemetry_plot(run_dir, e, cs, plt)
        if drawn:
            out[f"telemetry-{e}"] = drawn
        for name, case_rec in cs.items():
            drawn = _engine_metrics_plot(run_dir, e, name, case_rec, plt)
            if drawn:
                out[f"engine-{e}-{name}"] = drawn

    ladders = [(e, r) for e, rs in _ladders(data["verdicts"], profile).items() for r in rs]
    if ladders:
        colors = {"passed": "tab:green", "missed": "tab:red", "exhausted": "tab:brown", "refused": "tab:orange",
                  "error": "black",
                  "blocked": "tab:purple", "not-run": "lightgrey"}
        fig, ax = plt.subplots(figsize=(6, 3))
        engines = sorted({e for e, _ in ladders})
        for e, r in ladders:
            known = r.get("status") == "pass" and r["outcome"] in ("missed", "refused")  # expected limit
            ax.scatter(r["tokens"], engines.index(e), s=200, zorder=3,
                       color="tab:orange" if known else colors.get(r["outcome"], "grey"))
            ax.annotate(r["label"], (r["tokens"], engines.index(e)), textcoords="offset points", xytext=(0, 12),
                        ha="center", fontsize=7)
        ax.set_xscale("log", base=2)
        ticks = sorted({r["tokens"] for _, r in ladders})
        ax.set_xticks(ticks, [f"{t // 1024}K" if t >= 1024 else str(t) for t in ticks])
        ax.set_xlim(min(ticks) / 1.5, max(ticks) * 1.5)
        ax.set_yticks(range(len(engines)), engines)
        ax.set_ylim(-0.7, len(engines) - 0.3)
        ax.set(xlabel="rung (tokens)", title="Long-context ladder outcome")
        ax.grid(alpha=0.3, axis="x")
        fig.tight_layout()
        fig.savefig(run_dir / "ladder.png", dpi=100)
        plt.close(fig)
        out["ladder"] = "ladder.png"

    series = trend_series(history or [])
    if series:
        import matplotlib.dates as mdates

        fig, axes = plt.subplots(len(series), 1, figsize=(8, 2.6 * len(series)), squeeze=False, sharex=True)
        for ax, ((e, c), trend) in zip(axes[:, 0], sorted(series.items())):
            when = [p["date"] for p in trend]
            banded = [p for p in trend if p["lo"] is not None]
            if len(banded) == 1:       # one judged night: its band as a bar, not a zero-width fill
                one = banded[0]
                ax.errorbar([one["date"]], [one["centre"]], yerr=[[one["centre"] - one["lo"]], [one["hi"] - one["centre"]]],
                            fmt="none", ecolor="tab:blue", alpha=0.5, lw=6, label="band (suspect beyond)")
            elif banded:
                ax.fill_between([p["date"] for p in banded], [p["lo"] for p in banded], [p["hi"] for p in banded],
                                step="mid", alpha=0.2, color="tab:blue", label="band (suspect beyond)")
            if banded:
                ax.plot([p["date"] for p in banded], [p["centre"] for p in banded], color="tab:blue", lw=0.8,
                        ls="--", marker="_" if len(banded) == 1 else None, label="history median")
            ax.plot(when, [p["value"] for p in trend], marker="o", ms=3, lw=1, color="black", label="night median")
            bad = [p for p in trend if p["suspected"]]
            if bad:
                ax.plot([p["date"] for p in bad], [p["value"] for p in bad], "o", ms=7, mfc="none", color="tab:red",
                        label="worse than the band")
            ax.set(ylabel="out tok/s", title=f"{e} {c}")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, loc="lower left")
        ax = axes[-1, 0]
        loc = mdates.AutoDateLocator(minticks=2, maxticks=8)
        ax.xaxis.set_major_locator(loc)
        ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(loc))
        first = min(p["date"] for pts in series.values() for p in pts)
        last = max(p["date"] for pts in series.values() for p in pts)
        pad = max((last - first) * 0.03, timedelta(hours=12))      # one night still gets a readable axis
        ax.set_xlim(first - pad, last + pad)
        fig.suptitle("Nightly trend (output throughput, median of each night's rounds)")
        fig.tight_layout()
        fig.savefig(run_dir / "trend.png", dpi=100)
        plt.close(fig)
        out["trend"] = "trend.png"
    return out


def _telemetry_plot(run_dir: Path, engine: str, cs: Mapping[str, Mapping[str, Any]], plt: Any) -> str | None:
    """GPU utilisation, power, memory and network of each rank over the last valid round of each case."""
    panels = []
    for name, c in sorted(cs.items(), key=lambda kv: (kv[1].get("concurrency") or 0, kv[0])):
        last = next((r for r in reversed(c.get("rounds", [])) if r.get("valid") and r.get("telemetry")), None)
        ranks = [rk for rk in ((last or {}).get("telemetry") or {}).get("ranks") or [] if rk.get("series")]
        if ranks:
            panels.append((name, (last or {}).get("round"), ranks))
    if not panels:
        return None
    cols = (("GPU util %", 1), ("GPU power W (node)", 2), ("GPU mem GiB (max GPU)", 3), ("RDMA+NIC GB/s", 4))
    fig, axes = plt.subplots(len(panels), len(cols), figsize=(14, 2.4 * len(panels)), squeeze=False)
    for row, (name, rnd, ranks) in zip(axes, panels, strict=True):
        for ax, (label, i) in zip(row, cols, strict=True):
            for rk in ranks:
                pts = [(p[0], p[i]) for p in rk["series"] if p[i] is not None]
                if pts:
                    ax.plot([x for x, _ in pts], [y for _, y in pts], lw=1, label=f"rank {rk.get('rank')}")
            ax.set(title=f"{name} round {rnd}: {label}", xlabel="s into the round")
            ax.title.set_fontsize(8)
            ax.grid(alpha=0.3)
        row[0].legend(fontsize=7)
    fig.tight_layout()
    fname = f"telemetry-{engine}.png"
    fig.savefig(run_dir / fname, dpi=90)
    plt.close(fig)
    return fname


def _engine_metrics_plot(run_dir: Path, engine: str, case: str, c: Mapping[str, Any], plt: Any) -> str | None:
    """One case's rounds as the engine saw them: KV usage at its peak, running and waiting requests at their
    peak, and the prefix-cache hit rate, per round (nothing drawn where the engine reported none of them)."""
    rounds = [r for r in c.get("rounds", []) if "engine_notes" in r]
    panels = (("KV usage max", ("engine_kv_usage_max",), True), ("requests max", ("engine_running_max",
              "engine_waiting_max"), False), ("prefix-cache hit rate", ("prefix_cache_hit_rate",), True))
    if not rounds or not any(r.get(k) is not None for r in rounds for _, ks, _ in panels for k in ks):
        return None
    fig, axes = plt.subplots(1, 3, figsize=(11, 2.8))
    xs = [r.get("round") for r in rounds]
    for ax, (title, keys, frac) in zip(axes, panels, strict=True):
        drawn = False
        for k in keys:
            pts = [(x, r[k]) for x, r in zip(xs, rounds, strict=True) if r.get(k) is not None]
            if pts:
                drawn = True
                ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=k.replace("engine_", "")
                        .replace("_max", ""))
        if not drawn:
            ax.text(0.5, 0.5, "no reading (the table says why)", ha="center", va="center", transform=ax.transAxes, color="grey")
        if frac:
            ax.set_ylim(0, 1)
        else:
            ax.set_ylim(bottom=0)
            ax.legend(fontsize=7)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set(title=title, xlabel="round")
        ax.title.set_fontsize(9)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{engine} {case}: the engine's own /metrics per round", fontsize=10)
    fig.tight_layout()
    fname = f"engine-{engine}-{case}.png"
    fig.savefig(run_dir / fname, dpi=90)
    plt.close(fig)
    return fname


def trend_series(history: list[Mapping[str, Any]], metric: str = "output_throughput"
                 ) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """(engine, case) -> nights oldest first: date, night median, and the band regress would have drawn
    from the nights before it (centre, lo, hi; None with too little history), and whether it fell outside."""
    from gauntlet.steps.gates.regress import METRICS, judge_two_stage, nightly_medians

    stamps: dict[str, str] = {}
    for r in history:
        if r.get("valid") and r.get("timestamp"):
            stamps[r["run_id"]] = max(stamps.get(r["run_id"], ""), str(r["timestamp"]))
    direction, floor = METRICS[metric]
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for rid, night in nightly_medians(history, [metric]).items():
        if rid not in stamps:
            continue
        date = datetime.fromisoformat(stamps[rid][:19])
        for key, vals in night.items():
            v = vals.get(metric)
            if v is None:
                continue
            prior = [p["value"] for p in out.get(key, [])]
            j = judge_two_stage(v, prior, direction, floor)
            pt = {"run_id": rid, "date": date, "value": v, "centre": None, "lo": None, "hi": None, "suspected": False}
            if j["suspect_threshold"] is not None:
                sb = j["suspect_threshold"]
                pt.update(centre=j["centre"], lo=j["centre"] - sb, hi=j["centre"] + sb, suspected=j["suspected"])
            out.setdefault(key, []).append(pt)
    return out


def _profile_of(run_dir: Path) -> Any:
    from gauntlet.params import ProfileError, load_profile

    run = _load(Path(run_dir) / "run.json")   # the local runner's record of the run
    if isinstance(run, dict) and isinstance(run.get("profile"), str) and run["profile"]:
        try:
            return load_profile(run["profile"])
        except (ProfileError, OSError, ValueError):
            pass
    for rounds in sorted(Path(run_dir).rglob("rounds.json")):
        doc = _load(rounds)
        if isinstance(doc, list) and doc and isinstance(doc[0], dict) and isinstance(doc[0].get("profile"), str) \
                and doc[0]["profile"]:
            try:
                return load_profile(doc[0]["profile"])
            except (ProfileError, OSError, ValueError):
                return None
    return None


def screen(data: Mapping[str, Any], profile: Any = None) -> dict[str, Any]:
    """``data`` with every verdict whose evidence the report cannot read moved to ``corrupt``: each verdict's
    sections are drawn alone first, and one that raises is named with why, never a traceback."""
    good, corrupt = {}, dict(data.get("corrupt") or {})
    for rel, doc in data["verdicts"].items():
        try:
            render_markdown({**data, "verdicts": {rel: doc}, "corrupt": {}}, profile)
        except Exception as exc:  # noqa: BLE001 - any shape a hand-edited or damaged file can have
            corrupt[rel] = f"its metrics do not read: {type(exc).__name__}: {str(exc)[:160]}"
        else:
            good[rel] = doc
    return {**data, "verdicts": good, "corrupt": corrupt}


def _quarantined(data: Mapping[str, Any]) -> list[str]:
    """The store files regress moved aside in this run (from its verdicts), one line each."""
    lines = []
    for d in _by_gate(data["verdicts"], "regress").values():
        for q in d.get("metrics", {}).get("quarantined") or []:
            if isinstance(q, dict):
                lines.append(f"{q.get('path')} ({q.get('why')}): "
                             f"{'moved to ' + str(q['moved_to']) if q.get('moved_to') else 'skipped'}")
    return lines


def _history_page(out: Path, data: dict[str, Any], profile: Any, stored: list[dict[str, Any]],
                  plots: dict[str, str]) -> None:
    """history.html beside report.md (steps/evidence/history.py), judged by this run's regress rule."""
    from dataclasses import fields

    from gauntlet.steps.evidence.history import write_history
    from gauntlet.steps.gates.regress import DEFAULT_RULE, Rule

    rule = DEFAULT_RULE
    for d in final_regress(data["verdicts"]).values():
        got = (d.get("metrics") or {}).get("rule")
        if isinstance(got, dict):
            rule = Rule(**{f.name: got[f.name] for f in fields(Rule) if f.name in got})
    try:
        plots["history"] = write_history(out, stored, profile=profile, rule=rule).name
    except Exception as exc:  # noqa: BLE001 - a page that does not draw leaves the report whole
        data["notes"] = [*data.get("notes", []), f"history page not drawn: {type(exc).__name__}: {str(exc)[:200]}"]


@dataclass(frozen=True)
class Written:
    """What :func:`build_report` wrote and what it found wrong on the way (each one line)."""

    path: Path
    corrupt: tuple[str, ...] = ()        # verdict files that are not verdicts (corrupt_line)
    quarantined: tuple[str, ...] = ()    # results-store files moved aside in this run


def write_report(run_dir: str | Path, results: Any = None, *, profile: Any = None, out: Path | None = None) -> Path:
    """Write ``report.md`` (+ PNGs) for a run directory; ``results`` is a store URI or rows of history."""
    return build_report(run_dir, results, profile=profile, out=out).path


def build_report(run_dir: str | Path, results: Any = None, *, profile: Any = None,
                 out: Path | None = None, tasks: Mapping[str, str] | None = None, run: str = "qualification"
                 ) -> Written:
    """:func:`write_report`, returning what it found wrong as well. ``tasks``: the phase each task of the main
    DAG ended in (the report step's ``--upstream``), for "What did not pass". ``run``: the qualification or the
    nightly (whose report says what it left out of the qualification, and why)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"run directory {run_dir} does not exist")
    out = Path(out) if out else run_dir
    out.mkdir(parents=True, exist_ok=True)
    profile = profile or _profile_of(run_dir)
    data = screen(collect(run_dir), profile)
    if tasks:
        data["tasks"] = dict(tasks)
    data["run"] = run
    quarantined = _quarantined(data)
    history = None
    stored: list[dict[str, Any]] | None = None      # the profile's baseline rows, both phases: the history page
    if results is not None:
        uri = results
    elif profile is not None:
        uri = profile.results_store()
    else:
        uri = os.environ.get("GAUNTLET_RESULTS_URI")
    if isinstance(uri, (str, Path)):
        from gauntlet.steps.evidence.history import STORE_COLUMNS
        from gauntlet.steps.evidence.results import load_rounds
        try:
            got = load_rounds(uri, profile=profile.name if profile is not None else None, columns=STORE_COLUMNS)
            stored = [r for r in got.table.to_pylist() if (r.get("experiment") or "baseline") == "baseline"]
            history = [r for r in stored if r.get("phase") == "measure"]
            quarantined += [q.line() for q in got.quarantined]
        except (OSError, TransientError) as exc:      # a bad URI (UsageError) still stops the step: exit 2
            history = None
            data["notes"] = [*data.get("notes", []), f"nightly trend not drawn: the results store did not read "
                             f"({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''})"]
    elif uri is not None:
        stored = [r for r in uri if (r.get("experiment") or "baseline") == "baseline"]
        history = [r for r in stored if r.get("phase", "measure") == "measure"]
    if quarantined:
        data["quarantined"] = quarantined
        data["notes"] = [*data.get("notes", []), *(f"results store: quarantined {_md(q)}; its rows are out of "
                                                    "the history" for q in quarantined)]
    try:
        plots = _plots(out, data, profile, history)
    except Exception as exc:  # noqa: BLE001 - evidence that draws no plot still gets its report
        plots = {}
        data["notes"] = [*data.get("notes", []), f"plots not drawn: {type(exc).__name__}: {str(exc)[:200]}"]
    if stored is not None:
        _history_page(out, data, profile, stored, plots)
    try:
        md = render_markdown(data, profile, history, plots)
    except Exception as exc:  # noqa: BLE001 - verdicts that read alone but not together: gates and checks only
        bare = {rel: {**d, "metrics": {}} for rel, d in data["verdicts"].items()}
        data["notes"] = [*data.get("notes", []), f"the sections drawn from metrics are left out: "
                         f"{type(exc).__name__}: {str(exc)[:200]}"]
        md = render_markdown({**data, "verdicts": bare}, profile, None, {})
    path = out / "report.md"
    path.write_text(md)
    return Written(path, tuple(corrupt_line(rel, why) for rel, why in sorted(data["corrupt"].items())),
                   tuple(quarantined))
