"""The report's Gate 4 additions: the engine's own metrics per round (a table and a plot per case), goodput under
the SLO, and the climb's answer, drawn from records made by the gate's own functions."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from gauntlet.contract import Check, Verdict, now_iso
from gauntlet.params import load_profile
from gauntlet.params.models import SloSpec
from gauntlet.steps.client.bench import parse_result
from gauntlet.steps.client.sampler import parse_prometheus, summarize_samples
from gauntlet.steps.engines import engine
from gauntlet.steps.evidence.report import build_report
from gauntlet.steps.evidence.stats import engine_figures, stability, token_counts
from gauntlet.steps.gates.perf import CaseResult, ClimbStep, case_slo, climb_decision

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "vllm-0.32.0-cpu/bench-serve-result.json"
LOCAL = load_profile("local-cpu")
LAB = '{engine="0",model_name="smollm2-135m"}'


def _scrape(gen: float, prompt: float, queries: float, hits: float) -> dict[str, float]:
    return parse_prometheus("".join(f"{n}{LAB} {v}\n" for n, v in (
        ("vllm:generation_tokens_total", gen), ("vllm:prompt_tokens_total", prompt),
        ("vllm:prefix_cache_queries_total", queries), ("vllm:prefix_cache_hits_total", hits),
        ("vllm:num_preemptions_total", 0.0))))


def _rounds(extra: int = 0) -> list[dict]:
    base = parse_result(json.loads(FIXTURE.read_text()))
    out, t = [], 0.0
    for i, (kv, hit) in enumerate(((0.2, 0.0), (0.35, 0.5), (0.5, 0.75))):
        n_in, n_out = base["total_input_tokens"], base["total_output_tokens"]
        res = summarize_samples([{"t": 1.0, "engine_kv_usage": kv, "engine_running": 2.0, "engine_waiting": i}], {},
                                {}, _scrape(t, t, t, t * hit), _scrape(t + n_out + (extra if i == 2 else 0), t + n_in,
                                                                        t + n_in, t * hit + n_in * hit), 2.0,
                                engine_metrics=engine("vllm").metrics)
        t += 10_000
        rec = dict(base, valid=True, round=i + 1, resources=res, request_goodput=0.9)
        figures, notes = engine_figures(rec)
        agree, why = token_counts(rec, 0.02)
        rec.update(figures, engine_notes=notes, token_counts_agree=agree, token_counts_detail=why)
        if agree is False:
            rec.update(valid=False, invalid_reason=why)
        out.append(rec)
    return out


def test_the_report_shows_the_engines_metrics_goodput_and_the_climb(tmp_path):
    slo = SloSpec(ttft_p99_ms=10000, tpot_p99_ms=1000, climb=[1, 2, 4], climb_case="c2-128-32")
    run = tmp_path / "runs" / "r1"
    cr = CaseResult("c2-128-32", 2, 128, 32, 8, _rounds(extra=40))
    cr.stability = stability(cr.rounds, 0.25, 3)
    Verdict.of("perf", now_iso(), [Check("c2-128-32/stable", "pass")],
               {"engine": "vllm", "cases": {"c2-128-32": {**cr.to_dict(), "slo": case_slo(cr.rounds, slo)}}}
               ).write(run / "vllm" / "perf")
    steps = [ClimbStep(1, 23.3, 270, 42.1), ClimbStep(2, 42.9, 381, 42.4), ClimbStep(4, 44.0, 990, 80.0)]
    d = climb_decision(steps, slo)
    Verdict.of("perf", now_iso(), [Check("climb/highest", "pass", observed=d.highest)],
               {"engine": "vllm", "cases": {"climb-c1": {**cr.to_dict(), "concurrency": 1}},
                "climb": {"shape": "c2-128-32", "input_len": 128, "output_len": 32, "slo": slo.model_dump(),
                          "highest": d.highest, "saturated": d.saturated, "reason": d.reason, "not_run": [],
                          "steps": [asdict(s) for s in steps]}}).write(run / "vllm" / "perf-climb")
    md = build_report(run, [], profile=LOCAL).path.read_text()
    # the round's engine figures beside the client's counts, the disagreeing round named
    assert "| c2-128-32 | 2 | yes | 35.0% | 2 / 1 | 50.0% | 0 | – |" in md
    assert "**disagree**" in md and "| c2-128-32 | 3 | no | 50.0% | 2 / 2 | 75.0% |" in md
    assert "- – in prefix_cache_hit_rate: the engine looked up no prompt token" not in md       # it did, each round
    assert "vllm:spec_decode_num_drafts_total not in the engine's /metrics" in md
    png = run / "engine-vllm-c2-128-32.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "](engine-vllm-c2-128-32.png)" in md
    # goodput under the SLO: the two valid rounds' medians
    assert "| c2-128-32 | 2 |" in md and "| met | 0.900 |" in md
    # the climb: its answer and why it stopped, its steps kept out of the case tables
    assert "### Highest load meeting the SLO: vllm" in md and "**C4** meets" in md
    assert "C4 saturates the server: output throughput +2.6% over C2" in md
    assert "| 4 | 44.0 | 990 | 80.0 | meets the SLO |" in md and "climb-c1" not in md
    assert not (run / "engine-vllm-climb-c1.png").exists()
