"""The run report: sections from real-shaped evidence, plots, and the fair A/B rule."""

import json
from pathlib import Path

from gauntlet.params import load_profile
from gauntlet.steps.client.bench import parse_result
from gauntlet.contract import Check, Verdict, now_iso
from gauntlet.steps.evidence.stats import stability
from gauntlet.steps.gates.experiment import compare, verdict
from gauntlet.steps.gates.longctx import RungResult, judge_rung
from gauntlet.steps.gates.perf import CaseResult, case_table
from gauntlet.steps.evidence.report import fair_ab, write_report

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "vllm-0.32.0-cpu/bench-serve-result.json"


def _case(name, conc, scale=1.0):
    base = parse_result(json.loads(FIXTURE.read_text()))
    rounds = []
    for i, f in enumerate((0.98, 1.0, 1.02)):
        r = dict(base, output_throughput=base["output_throughput"] * f * scale, valid=True, round=i + 1,
                 resources={"headroom": 0.8, "gpu_source": "unavailable: no nvidia-smi",
                            "expert_load": {"available": False, "reason": "no per-rank expert load"},
                            "prefix_cache_hit_rate": 0.5})
        rounds.append(r)
    cr = CaseResult(name, conc, 128, 32, 16, rounds)
    cr.stability = stability(rounds, 0.25, 3)
    return cr


def _run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "runs" / "r42"
    c2, c4 = _case("c2-128-32", 2), _case("c4-128-32", 4, 1.6)
    Verdict.of("perf", now_iso(), [Check("c2-128-32/stable", "pass", detail="spread 4.0%")],
               {"engine": "vllm", "cases": {"c2-128-32": c2.to_dict()}}).write(run / "vllm" / "perf")
    (run / "vllm" / "perf" / "rounds.json").write_text(json.dumps([{"profile": "local-cpu"}]))
    Verdict.of("perf", now_iso(), [Check("c4-128-32/stable", "pass")],
               {"engine": "vllm", "cases": {"c4-128-32": c4.to_dict()}}).write(run / "vllm" / "perf-c4-128-32")
    from gauntlet.params.models import Rung
    ladder = []
    for t, exp, oc in ((1024, "pass", "passed"), (2048, "pass", "passed"), (4096, "fail", "missed")):
        st, lb, detail = judge_rung(Rung(tokens=t, expect=exp), oc, [])
        ladder.append(RungResult(t, exp, oc, st, lb, detail).__dict__)
    Verdict.of("longctx", now_iso(), [Check("rung-1024", "pass")],
               {"engine": "vllm", "ladder": ladder}).write(run / "vllm" / "longctx")
    var = _case("c2-128-32", 2, 0.99)
    rows = compare({"c2-128-32": c2.to_dict()["table"]}, {"c2-128-32": case_table(var.rounds)})
    d, why = verdict(rows)
    Verdict.of("experiment", now_iso(), [Check("verdict", "pass", observed=d, detail=why)],
               {"variant": "prefix-cache", "engine": "vllm", "change": {"prefix_cache": True}, "verdict": d,
                "verdict_reason": why, "comparison": rows,
                "tables": {"cold": {"c2-128-32": case_table(var.rounds)},
                           "reusable_prefix": {"c2-128-32": case_table(var.rounds)}},
                "prefix_cache_hit_rate": {"reusable_prefix": {"c2-128-32": [0.4, 0.9, 0.9]}},
                # as the real ngram-spec run recorded them (bench JSON spec_decode_* fields)
                "speculative": {"c2-128-32": {"acceptance_rate_pct": 83.3, "acceptance_length": 3.44,
                                              "draft_tokens": 120.0, "engine_rss_bytes_max": 3182329856}}}
               ).write(run / "vllm" / "exp-prefix-cache")
    Verdict.of("regress", now_iso(), [Check("vllm/c2-128-32/output_throughput", "fail", detail="regressed")],
               {"labels": [{"engine": "vllm", "case": "c2-128-32", "metric": "output_throughput",
                            "label": "regressed", "value": 70.0, "centre": 77.0, "threshold": 2.3,
                            "change_rel": -0.09, "nights": 14}]}).write(run / "regress")
    return run


def test_report_sections_and_plots(tmp_path):
    run = _run_dir(tmp_path)
    history = [dict(run_id=f"n{i}", engine="vllm", case="c2-128-32", valid=True, timestamp=f"2026-11-{i + 1:02d}",
                    output_throughput=77.0 + i % 3) for i in range(10)]
    path = write_report(run, history)
    md = path.read_text()
    for section in ("## Environment", "## Gate verdicts", "## Performance (Gate 4)", "## Long context (Gate 5)",
                    "## Experiments vs baseline (Gate 6)", "## Nightly regression"):
        assert section in md
    assert "`local/vllm-cpu@sha256:" in md and "--no-enable-prefix-caching" in md
    # median with min-max, not the best round
    assert "77.1 [75.5–78.6]" in md
    assert "beyond capability (known)" in md and "| 16384 | refused | not run |" in md
    assert "keep baseline" in md and "reusable prefix phase" in md and "90%" in md
    assert "| c2-128-32 | 83.3 | 3.44 | 120 |" in md
    assert "**regressed**" in md and "per-rank expert load: not recorded: vLLM has no expert distribution" in md
    for png in ("throughput.png", "latency.png", "ladder.png", "trend.png"):
        data = (run / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
        assert f"]({png})" in md


def test_fair_ab_kimi_engines_share_topology_context_and_options():
    # kernel choices differ (custom all-reduce, autotune, symm-mem) but the experiment is the same
    ok, why = fair_ab(load_profile("kimi-k3-h20"), ["sglang", "vllm"])
    assert ok is True and "tp_size=16" in why
    ok1, why1 = fair_ab(load_profile("local-cpu"), ["vllm"])
    assert not ok1 and "only one engine" in why1


def test_fair_ab_rule_on_constructed_profiles():
    p = load_profile("kimi-k3-h20")
    same = p.model_copy(update={"engines": {"sglang": p.engines["sglang"],
                                            "vllm": p.engines["vllm"].model_copy(update={"args": p.engines["sglang"].args})}})
    assert fair_ab(same, ["sglang", "vllm"])[0] is True
    args = p.engines["sglang"].args.model_copy(update={"tp_size": 8, "context_length": 65536})
    diff = p.model_copy(update={"engines": {"sglang": p.engines["sglang"],
                                            "vllm": p.engines["vllm"].model_copy(update={"args": args})}})
    ok, why = fair_ab(diff, ["sglang", "vllm"])
    assert not ok and "tp_size" in why and "context_length" in why


def test_report_says_why_without_an_ab_table(tmp_path):
    run = _run_dir(tmp_path)
    c = _case("c2-128-32", 2)
    Verdict.of("perf", now_iso(), [Check("x", "pass")], {"engine": "sglang", "cases": {"c2-128-32": c.to_dict()}}
               ).write(run / "sglang" / "perf")
    md = write_report(run, [], profile=load_profile("local-cpu")).read_text()
    assert "No comparison table" in md


def test_report_shows_each_phase_and_the_confirmation(tmp_path):
    from gauntlet.steps.gates.experiment import decision, phase_verdicts

    run = _run_dir(tmp_path)
    base, same, faster = _case("c2-128-32", 2), _case("c2-128-32", 2, 1.0), _case("c2-128-32", 2, 1.5)
    comparisons = {"cold": compare({"c2-128-32": base.to_dict()["table"]}, {"c2-128-32": case_table(same.rounds)}),
                   "reusable_prefix": compare({"c2-128-32": base.to_dict()["table"]},
                                              {"c2-128-32": case_table(faster.rounds)})}
    pv = phase_verdicts(comparisons)
    d, why, target = decision(pv)
    Verdict.of("experiment", now_iso(), [Check("verdict", "pass", observed=d, detail=why)],
               {"variant": "prefix-cache", "engine": "vllm", "change": {"prefix_cache": True}, "verdict": d,
                "verdict_reason": why, "comparisons": comparisons, "phase_verdicts": pv, "main_phase": target,
                "comparison": comparisons[target]}).write(run / "vllm" / "exp-prefix-cache")
    label = {"engine": "vllm", "case": "c2-128-32", "metric": "output_throughput", "label": "unconfirmed",
             "value": 70.0, "centre": 77.0, "threshold": 2.3, "change_rel": -0.09, "nights": 14, "suspected": True,
             "confirm_value": 76.5, "confirm_threshold": 2.9, "confirm_change_rel": -0.0065, "confirm_rounds": 6}
    rounds = {"measure": {"vllm/c2-128-32": [{"round": i, "output_throughput": v} for i, v in
                                             enumerate((69.0, 70.0, 71.5), 1)]},
              "confirm": {"vllm/c2-128-32": [{"round": i, "output_throughput": 76.0 + i / 10} for i in range(1, 7)]}}
    Verdict.of("regress", now_iso(), [Check("vllm/c2-128-32/output_throughput", "pass", detail="unconfirmed")],
               {"stage": "final", "labels": [label], "rounds": rounds}).write(run / "regress")
    # the in-sequence suspect stage's own verdict is not a second table
    Verdict.of("regress", now_iso(), [], {"stage": "suspect", "labels": [dict(label, label="suspect")]}
               ).write(run / "vllm" / "suspect")
    md = write_report(run, []).read_text()
    exp = md[md.index("## Experiments"):md.index("## Nightly regression")]
    assert "**cold phase, baseline vs variant on the same workload** (expected: no gain expected" in exp
    assert "**no gain beyond noise**" in exp
    assert "**reusable prefix phase, baseline vs variant on the same workload**" in exp and "**better**" in exp
    assert "adopt variant" in exp
    reg = md[md.index("## Nightly regression"):]
    assert reg.count("| vllm | c2-128-32 | output_throughput |") == 1 and "**unconfirmed**" in reg
    assert "76.50 (6) | -0.7% |" in reg
    assert "night 69.00, 70.00, 71.50; confirmation 76.10, 76.20, 76.30, 76.40, 76.50, 76.60." in reg


def test_report_names_where_a_regression_came_from(tmp_path):
    run = _run_dir(tmp_path)
    origin = {"last_good": {"run_id": "n12", "timestamp": "2026-11-30T02:00:00"},
              "first_bad": {"run_id": "n13", "timestamp": "2026-12-01T02:00:00"},
              "differed": {"image_digest": {"last_good": "sha256:aaa", "first_bad": "sha256:bbb"}}}
    Verdict.of("regress", now_iso(), [Check("vllm/c2-128-32/output_throughput", "fail", detail="regressed")],
               {"stage": "final", "labels": [{"engine": "vllm", "case": "c2-128-32", "metric": "output_throughput",
                                              "label": "regressed", "value": 70.0, "centre": 77.0, "threshold": 2.3,
                                              "change_rel": -0.09, "nights": 14, "origin": origin}]}
               ).write(run / "regress")
    reg = write_report(run, []).read_text().split("## Nightly regression")[1]
    assert ("Where vllm/c2-128-32 (output_throughput) changed: last good night n12 (2026-11-30T02:00:00), "
            "first bad night n13 (2026-12-01T02:00:00); image_digest: `sha256:aaa` → `sha256:bbb`.") in reg


def _nights(n, drop_last=False):
    from datetime import datetime, timedelta
    start = datetime(2026, 9, 1, 2, 0)
    rows = []
    for i in range(n):
        v = 77.0 + (i % 3) - 1
        if drop_last and i == n - 1:
            v = 60.0
        ts = (start + timedelta(days=i)).isoformat()
        rows += [dict(run_id=f"n{i:03d}", engine="vllm", case="c2-128-32", valid=True, timestamp=ts,
                      output_throughput=v) for _ in range(3)]
    return rows


def test_trend_has_dates_and_the_band_from_the_nights_before():
    from datetime import datetime

    from gauntlet.steps.evidence.report import trend_series
    one = trend_series(_nights(1))[("vllm", "c2-128-32")]
    assert len(one) == 1 and one[0]["date"] == datetime(2026, 9, 1, 2, 0) and one[0]["lo"] is None
    many = trend_series(_nights(90, drop_last=True))[("vllm", "c2-128-32")]
    assert len(many) == 90 and all(p["lo"] is None for p in many[:7]) and all(p["lo"] is not None for p in many[7:])
    assert many[-1]["suspected"] and not any(p["suspected"] for p in many[:-1])
    assert many[-1]["lo"] < many[-1]["centre"] < many[-1]["hi"] and many[-1]["value"] < many[-1]["lo"]


def test_trend_plot_reads_with_one_night_and_with_ninety(tmp_path):
    for n in (1, 90):
        run = _run_dir(tmp_path / str(n))
        md = write_report(run, _nights(n, drop_last=n > 1)).read_text()
        assert "![nightly trend](trend.png)" in md and (run / "trend.png").stat().st_size > 10_000
