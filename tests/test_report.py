"""The run report: sections from real-shaped evidence, plots, and the fair A/B rule."""

import json
from pathlib import Path

from params import load_profile
from steps._bench import parse_result
from steps._evidence import Check, Verdict, now_iso
from steps._stats import stability
from steps.experiment import compare, verdict
from steps.longctx import RungResult, judge_rung
from steps.perf import CaseResult, case_table
from steps.report import fair_ab, write_report

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
    from params.models import Rung
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
    assert "**regressed**" in md and "per-rank expert load: unavailable" in md
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
