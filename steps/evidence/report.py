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

__all__ = ["write_report", "build_report", "Written", "collect", "screen", "fair_ab", "render_markdown", "corrupt_line", "AB_OPTIONS"]

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
    """engine -> case -> case record, from every perf verdict."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for rel, v in _by_gate(verdicts, "perf").items():
        for name, c in (v.get("metrics", {}).get("cases") or {}).items():
            out.setdefault(_engine_of(rel, v), {})[name] = c
    return out


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


def fair_ab(profile: Any, engines: list[str]) -> tuple[bool, str]:
    """(comparable, why): the same topology (tp/ep/dp, nodes), context and options (pure)."""
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
    return True, f"same topology ({', '.join(f'{k}={a.get(k)}' for k in TOPOLOGY)}), context and options"


AB_METRICS = (("output_throughput", "out tok/s", 1), ("p50_ttft_ms", "TTFT p50 ms", 0),
              ("p99_tpot_ms", "TPOT p99 ms", 1), ("p99_e2el_ms", "E2E p99 ms", 0))


def _ab_table(cases: Mapping[str, Mapping[str, Any]], a: str, b: str) -> list[str]:
    """Case x metric: both engines' median [min-max] over their rounds, the ratio, and whether the two
    ranges are apart (every round of one beyond every round of the other) or overlap (pure)."""
    lines = [f"| case | metric | {a} | {b} | {b} / {a} | rounds apart |", "|---|---|---|---|---|---|"]
    for name in sorted(set(cases[a]) & set(cases[b])):
        for key, label, nd in AB_METRICS:
            ta, tb = (cases[e][name].get("table", {}).get(key) or {} for e in (a, b))
            if ta.get("median") is None or tb.get("median") is None:
                continue
            ratio = tb["median"] / ta["median"] if ta["median"] else None
            apart = tb["min"] > ta["max"] or ta["min"] > tb["max"]
            lines.append(f"| {name} | {label} | {_cell(ta, nd)} | {_cell(tb, nd)} | "
                         f"{'–' if ratio is None else f'{ratio:.2f}x'} | {'yes' if apart else 'no: within noise'} |")
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
                                       "label": "not run", "detail": "requires every lower rung to pass"
                                       if r.requires_all_lower else "not run in this run", "probes": []})
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


def render_markdown(data: Mapping[str, Any], profile: Any = None, history: Any = None,
                    plots: Mapping[str, str] | None = None) -> str:
    """The report text (pure over collected evidence)."""
    v = data["verdicts"]
    plots = plots or {}
    L: list[str] = [f"# gauntlet run `{data['run_id']}`", ""]
    if profile is not None:
        L += [f"Profile **{profile.name}**: {profile.description}", ""]
    order = sorted(v.items(), key=lambda kv: (kv[1].get("started", ""), kv[0]))
    statuses = [d.get("status") for _, d in order]
    corrupt = data.get("corrupt") or {}
    L += [f"Gates: {sum(s == 'pass' for s in statuses)} pass, {sum(s == 'fail' for s in statuses)} fail, "
          f"{sum(s == 'error' for s in statuses)} error, {sum(s == 'skip' for s in statuses)} skip"
          f"{f', {len(corrupt)} corrupt verdict(s)' if corrupt else ''}.", ""]
    L += [f"- {note}" for note in data.get("notes") or []] + ([""] if data.get("notes") else [])
    L += ["| task | gate | verdict | checks pass / fail / skip | first problem |", "|---|---|---|---|---|"]
    for rel, why in sorted(corrupt.items()):
        L.append(f"| {_md(rel)} | ? | **corrupt verdict** | – | {_md(corrupt_line(rel, why))} |")
    for rel, d in order:
        cs = d.get("checks", [])
        n = {k: sum(c.get("status") == k for c in cs) for k in ("pass", "fail", "error", "skip")}
        bad = next((c for c in cs if c.get("status") in ("fail", "error")), None)
        why = f"{bad['name']}: {str(bad.get('detail', ''))[:120]}".replace("|", "\\|") if bad else ""
        L.append(f"| {rel} | {d.get('gate')} | **{d.get('status')}** | {n['pass']} / {n['fail'] + n['error']} / "
                 f"{n['skip']} | {why} |")
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
    # the baseline first: the comparison reads "experimental / baseline"
    order = profile.engine_order() if profile is not None else []
    engines = sorted(cases, key=lambda e: (order.index(e) if e in order else len(order), e))
    ok, why = fair_ab(profile, engines)
    if len(engines) >= 2:
        L += ["### Engine comparison", ""]
        if ok:
            L += [f"Fair A/B: {why}; one client, the same seed and requests.", ""]
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
        L += [f"### {e}", "", "| tokens | expect | outcome | detail | prompt tokens |", "|---|---|---|---|---|"]
        for r in sorted(rungs, key=lambda x: x["tokens"]):
            pt = ", ".join(str(p.get("prompt_tokens")) for p in r.get("probes", []) if p.get("prompt_tokens"))
            L.append(f"| {r['tokens']} | {r['expect']} | {r['label']} | {r['detail']} | {pt or '–'} |")
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
                  "| case | out tok/s baseline → variant | TTFT p99 ms | E2E p99 ms | out tok/s rounds: baseline / variant |",
                  "|---|---|---|---|---|"]
            for r in rows:
                def pair(k: str, r: Mapping[str, Any] = r) -> str:
                    x = r[k]
                    ch = f" ({x['change_rel']:+.1%})" if x.get("change_rel") is not None else ""
                    return f"{_fmt(x['baseline'])} → {_fmt(x['variant'])}{ch}"
                br = r["output_throughput"].get("baseline_range") or [None, None]
                vr = r["output_throughput"].get("variant_range") or [None, None]
                L.append(f"| {r['case']} | {pair('output_throughput')} | {pair('p99_ttft_ms')} | "
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
        if any((s or {}).get("acceptance_rate_pct") is not None for s in spec.values()):
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
    # the final verdict only: the in-sequence suspect stage's labels are repeated (with the confirmation) there
    reg = {k: d for k, d in _by_gate(v, "regress").items() if d.get("metrics", {}).get("stage") != "suspect"}
    labels = [lb for d in reg.values() for lb in d.get("metrics", {}).get("labels", [])]
    if not labels:
        L += ["No regression verdict in this run." if not reg else
              str((next(iter(reg.values())).get("checks") or [{}])[0].get("detail", "")), ""]
    else:
        L += ["A night worse than its history's band is *suspected*; the run then measures that case again on fresh "
              "rounds, and only a *confirmed* suspicion is labelled regressed (docs/regression.md).", "",
              "| engine | case | metric | label | value | history median | change | nights | suspected | "
              "confirmation (rounds) | confirmation change |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for lb in labels:
            ch = f"{lb['change_rel']:+.1%}" if lb.get("change_rel") is not None else "–"
            cch = f"{lb['confirm_change_rel']:+.1%}" if lb.get("confirm_change_rel") is not None else "–"
            conf = (f"{_fmt(lb.get('confirm_value'), 2)} ({lb.get('confirm_rounds')})" if lb.get("confirm_rounds")
                    else "–")
            L.append(f"| {lb['engine']} | {lb['case']} | {lb['metric']} | **{lb['label']}** | {_fmt(lb.get('value'), 2)} "
                     f"| {_fmt(lb.get('centre'), 2)} | {ch} | {lb.get('nights')} | "
                     f"{'yes' if lb.get('suspected') else 'no'} | {conf} | {cch} |")
        L.append("")
        origins: dict[str, tuple[list[str], dict[str, Any]]] = {}   # one line per case and origin
        for lb in labels:
            o = lb.get("origin") or {}
            if o.get("last_good"):
                key = f"{lb['engine']}/{lb['case']} " + json.dumps(o, sort_keys=True, default=str)
                origins.setdefault(key, ([], o))[0].append(lb["metric"])
        for key, (metrics, o) in origins.items():
            what = "; ".join(f"{k}: `{v['last_good']}` → `{v['first_bad']}`" for k, v in o["differed"].items())
            L += [f"Where {key.split(' ')[0]} ({', '.join(metrics)}) changed: last good night "
                  f"{o['last_good']['run_id']} ({o['last_good'].get('timestamp') or '?'}), first bad night "
                  f"{o['first_bad']['run_id']} ({o['first_bad'].get('timestamp') or '?'}); "
                  f"{what or 'same image digest, engine args, model, git revision and nodes'}.", ""]
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

    ladders = [(e, r) for e, rs in _ladders(data["verdicts"], profile).items() for r in rs]
    if ladders:
        colors = {"passed": "tab:green", "missed": "tab:red", "refused": "tab:orange", "error": "black",
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
                 out: Path | None = None) -> Written:
    """:func:`write_report`, returning what it found wrong as well."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"run directory {run_dir} does not exist")
    out = Path(out) if out else run_dir
    out.mkdir(parents=True, exist_ok=True)
    profile = profile or _profile_of(run_dir)
    data = screen(collect(run_dir), profile)
    quarantined = _quarantined(data)
    history = None
    if results is not None:
        uri = results
    elif profile is not None:
        uri = profile.results_store()
    else:
        uri = os.environ.get("GAUNTLET_RESULTS_URI")
    if isinstance(uri, (str, Path)):
        from gauntlet.steps.evidence.results import load_rounds
        try:
            got = load_rounds(uri, profile=profile.name if profile is not None else None,
                              columns=["run_id", "engine", "case", "valid", "timestamp", "output_throughput",
                                       "experiment", "phase"])
            history = [r for r in got.table.to_pylist() if (r.get("experiment") or "baseline") == "baseline"
                       and r.get("phase") == "measure"]
            quarantined += [q.line() for q in got.quarantined]
        except (OSError, TransientError) as exc:      # a bad URI (UsageError) still stops the step: exit 2
            history = None
            data["notes"] = [*data.get("notes", []), f"nightly trend not drawn: the results store did not read "
                             f"({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''})"]
    elif uri is not None:
        history = list(uri)
    if quarantined:
        data["quarantined"] = quarantined
        data["notes"] = [*data.get("notes", []), *(f"results store: quarantined {_md(q)}; its rows are out of "
                                                    "the history" for q in quarantined)]
    try:
        plots = _plots(out, data, profile, history)
    except Exception as exc:  # noqa: BLE001 - evidence that draws no plot still gets its report
        plots = {}
        data["notes"] = [*data.get("notes", []), f"plots not drawn: {type(exc).__name__}: {str(exc)[:200]}"]
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
