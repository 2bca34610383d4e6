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
from gauntlet.steps.gates.regress import Label

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
    label = Label("vllm", "c2-128-32", "output_throughput", "unconfirmed", 70.0, 77.0, 2.3, -0.09, 14, suspected=True,
                  confirm_value=76.5, confirm_threshold=2.9, confirm_change_rel=-0.0065, confirm_rounds=6).to_dict()
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
    assert reg.count("| vllm | c2-128-32 | output_throughput |") == 1
    assert "| **suspicious** | night -9.0%, not confirmed by 6 fresh rounds -0.7% |" in reg
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
    assert ("Where vllm/c2-128-32 (output_throughput regressed) changed: last good night n12 (2026-11-30), "
            "first bad night n13 (2026-12-01); image_digest: `sha256:aaa` → `sha256:bbb`.") in reg


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


def test_the_engine_comparison_checks_both_engines_sent_the_same_requests():
    """Each round records its request set's digest; the A/B table compares a case only where the two engines'
    digests agree, refuses the ratio where they differ, and names the cases where they were not recorded."""
    from gauntlet.steps.evidence.report import render_markdown

    def perf(engine: str, tput: float, digest: str | None) -> dict:
        rounds = [{"valid": True, "round": i, "output_throughput": tput, "requests_sha256": digest} for i in (1, 2, 3)]
        t = {"output_throughput": {"min": tput - 1, "median": tput, "max": tput + 1}}
        return {"gate": "perf", "status": "pass", "metrics": {"engine": engine, "cases": {
            "c2-128-32": {"concurrency": 2, "rounds": rounds, "table": t}}}}

    def ab(vllm_digest: str | None, llamacpp_digest: str | None) -> str:
        verdicts = {"vllm/perf": perf("vllm", 40.0, vllm_digest), "llamacpp/perf": perf("llamacpp", 55.0, llamacpp_digest)}
        md = render_markdown({"run_id": "r", "verdicts": verdicts}, load_profile("local-cpu"))
        return md[md.index("### Engine comparison"):md.index("## Long context")]

    same = ab("5a1c0ffee0000001", "5a1c0ffee0000001")
    assert "| c2-128-32 | out tok/s | 40.0 [39.0–41.0] | 55.0 [54.0–56.0] | 1.38x | yes |" in same
    assert "Request sets not recorded" not in same and "not compared" not in same
    # the client re-aligned its prompts to one server's tokenizer: other requests, no ratio
    differ = ab("5a1c0ffee0000001", "77e5e7e5e7e5e7e5")
    assert ("| c2-128-32 | out tok/s | 40.0 [39.0–41.0] | 55.0 [54.0–56.0] | – | not compared: different requests "
            "(vllm `5a1c0ffee0000001`, llamacpp `77e5e7e5e7e5e7e5`) |") in differ and "1.38x" not in differ
    unknown = ab("5a1c0ffee0000001", None)
    assert "1.38x" in unknown and "Request sets not recorded on both engines for c2-128-32" in unknown


def _store_with_a_regression(store):
    """Ten quiet nights of local-cpu's c2-128-32 (vLLM, 50 tok/s, image a, driver 550), then night10 12% down on
    image b and driver 570, repeated by six confirmation rounds: real store rows."""
    import random

    from gauntlet.steps.evidence.results import append_rounds

    rng = random.Random(3)

    def night(i, value, digest, drv, phase="measure", rounds=3):
        return [dict(run_id=f"night{i:02d}", profile="local-cpu", engine="vllm", date=f"2026-11-{i + 1:02d}",
                     timestamp=f"2026-11-{i + 1:02d}T0{2 if phase == 'measure' else 3}:00:00",
                     client="vllm-bench-serve", args_hash="h", experiment="baseline", phase=phase, case="c2-128-32",
                     round=r + 1, valid=True, image_digest=digest, driver=drv, nodes="node-a", model_fingerprint="fp",
                     git_rev="abc", output_throughput=value, request_throughput=50.0 / 32, p99_ttft_ms=300.0,
                     p99_tpot_ms=40.0, p99_e2el_ms=1500.0) for r in range(rounds)]
    rows = [r for i in range(10) for r in night(i, 50.0 * (1 + rng.uniform(-0.01, 0.01)), "sha256:aaa", "550.54.15")]
    rows += night(10, 44.0, "sha256:bbb", "570.86.10") + night(10, 44.0, "sha256:bbb", "570.86.10", "confirm", 6)
    append_rounds(rows, store)


def test_report_md_opens_with_the_nights_verdict_in_one_line(tmp_path):
    """The real regress step on real store rows, then the report: the line after the title is the night's
    verdict, for a nightly and for the qualification."""
    from gauntlet.steps.evidence.report import build_report
    from gauntlet.steps.gates.regress import Options, run as regress

    store = tmp_path / "store"
    _store_with_a_regression(store)
    run_dir = tmp_path / "runs" / "night10"
    profile = load_profile("local-cpu")
    checks, metrics = regress(Options(profile=profile, results_uri=str(store), run_id="night10"), run_dir / "regress")
    Verdict.of("regress", now_iso(), checks, metrics).write(run_dir / "regress")
    verdict = ("1 regressed (vllm/c2-128-32 output_throughput -11.7%, first bad night10: image sha256:aaa->sha256:bbb, "
               "driver 550.54.15->570.86.10), 4 no regression")
    for kind, first in (("nightly", f"**Nightly**: {verdict}; 1 task(s) did not pass (below)."),
                        ("qualification", f"**Qualification**: 0 task(s) pass, 1 did not; regression: {verdict}.")):
        md = build_report(run_dir, [], profile=profile, run=kind).path.read_text()
        lines = md.splitlines()
        assert lines[0] == "# gauntlet run `night10`"
        assert next(x for x in lines[1:] if x.strip()) == first
    reg = md[md.index("## Nightly regression"):]
    assert "| vllm | c2-128-32 | output_throughput | **regressed** | night -11.7%, confirmed by 6 fresh rounds -11.7% |" \
        in reg
    assert ("Where vllm/c2-128-32 (output_throughput regressed) changed: last good night night09 (2026-11-10), "
            "first bad night night10 (2026-11-11); image_digest: `sha256:aaa` → `sha256:bbb`; "
            "driver: `550.54.15` → `570.86.10`.") in reg
    # the regressed row comes first, then the four metrics with no regression
    rows = [x for x in reg.splitlines() if x.startswith("| vllm |")]
    assert [r.split(" | ")[3] for r in rows] == ["**regressed**"] + ["**no regression**"] * 4
