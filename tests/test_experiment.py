"""Gate 6: variant validation, the comparison against the baseline, the verdict."""

import subprocess
import sys

import pytest
from pydantic import ValidationError

from gauntlet.params import load_profile
from gauntlet.params.models import Variant
from gauntlet.steps.engines.commands import apply_change
from test_engine_client import engine, fake_bench  # noqa: F401 - fixtures: the recording engine, bench

from gauntlet.steps.gates.experiment import (acceptance_problems, args_diff, baseline_cases, compare, decision,
                                             one_change_problems, phase_plan, phase_verdicts, rejection, verdict)


def test_model_rejects_two_changes_at_once():
    with pytest.raises(ValidationError, match="exactly one variable"):
        Variant(name="two", change={"prefix_cache": True, "tp_size": 2})


def test_deployed_spec_must_differ_in_exactly_one_variable():
    spec = load_profile("local-cpu").engines["vllm"]
    one = apply_change(spec, {"prefix_cache": True})
    assert one_change_problems(spec.args, one.args) == []
    assert args_diff(spec.args, one.args) == {"prefix_cache": (False, True)}
    two = apply_change(one, {"max_running_requests": 2})
    assert "changes 2 variables" in one_change_problems(spec.args, two.args)[0]
    assert "nothing to compare" in one_change_problems(spec.args, spec.args)[0]


def test_speculative_change_is_one_variable():
    spec = load_profile("local-cpu").engines["vllm"]
    v = apply_change(spec, {"speculative": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}})
    assert list(args_diff(spec.args, v.args)) == ["speculative"]


def _t(tput, p99, spread=0.02, tpot=40.0, itl=45.0):
    def t(m):
        return {"median": m, "min": m * (1 - spread / 2), "max": m * (1 + spread / 2), "spread_rel": spread}
    return {"output_throughput": t(tput), "p99_ttft_ms": t(p99), "p99_e2el_ms": t(p99 * 5),
            "p99_tpot_ms": t(tpot), "p99_itl_ms": t(itl)}


@pytest.mark.parametrize("var,decision,why", [
    (_t(120, 300), "adopt variant", "throughput better"),
    (_t(101, 300), "keep baseline", "not better beyond noise"),
    (_t(130, 400), "keep baseline", "worse P99"),
    (_t(80, 200), "keep baseline", "not better"),
])
def test_verdict(var, decision, why):
    rows = compare({"c2": _t(100, 300)}, {"c2": var})
    d, reason = verdict(rows)
    assert d == decision and why in reason


@pytest.mark.parametrize("tail,var", [("p99_tpot_ms", _t(130, 300, tpot=48.0)), ("p99_itl_ms", _t(130, 300, itl=60.0))])
def test_a_worse_tpot_or_itl_tail_keeps_the_baseline_despite_the_throughput(tail, var):
    """The plan's rule: throughput better *and* no token-latency tail worse (TPOT, ITL p99), not only TTFT/E2E."""
    rows = compare({"c2": _t(100, 300)}, {"c2": var})
    assert rows[0]["throughput_better"]
    d, why = verdict(rows)
    assert d == "keep baseline" and f"c2 {tail}" in why
    assert decision(phase_verdicts({"measure": rows}))[0] == "keep baseline"


def test_a_speculative_gain_without_accepted_drafts_is_not_adopted():
    better = phase_verdicts({"measure": compare({"c2": _t(100, 300)}, {"c2": _t(130, 300)})})
    assert decision(better)[0] == "adopt variant"
    vetoes = acceptance_problems({"c2": {"acceptance_length": None}}, ["c2"])
    d, why, phase = decision(better, vetoes)
    assert d == "keep baseline" and phase == "measure" and "no acceptance length" in why
    assert decision(better, acceptance_problems({"c2": {"acceptance_length": 2.9}}, ["c2"]))[0] == "adopt variant"


def test_a_variant_that_answers_wrongly_or_loses_a_rank_is_rejected():
    from gauntlet.contract import Check
    ok = [Check("arithmetic", "pass"), Check("image", "skip")]
    wrong = [Check("arithmetic", "fail", detail="'What is 2+3?': expected 5, got 6"), Check("models", "pass")]
    up = Check("engine_ranks", "pass", detail="all 1 rank(s) up")
    down = Check("engine_ranks", "fail", detail="rank 1 restarted during variant dspark")
    assert rejection(ok, up) is None and rejection(ok, None) is None
    assert "not measured: arithmetic: 'What is 2+3?': expected 5, got 6" in rejection(wrong, up)
    assert "rank 1 restarted during variant dspark" in rejection(ok, down)


def test_fp8_kv_cache_is_refused_in_a_variant_on_hopper_as_in_the_baseline(tmp_path):
    """A variant's change merged onto the baseline's args meets the baseline's rules (params/models.py, one owner)."""
    import yaml

    from gauntlet.params import ProfileError
    from gauntlet.params.loader import PROFILES_DIR

    doc = yaml.safe_load((PROFILES_DIR / "kimi-k3-h20.yaml").read_text())
    i = len(doc["experiments"])
    doc["experiments"].append({"name": "fp8-kv", "engine": "sglang", "change": {"kv_cache_dtype": "fp8_e4m3"}})
    bad = tmp_path / "fp8.yaml"
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(ProfileError, match=rf"experiments\.{i}\.change \(fp8-kv\): FP8 KV cache is refused on "
                                           r"Hopper \(got 'fp8_e4m3'\)"):
        load_profile(bad)
    r = subprocess.run([sys.executable, "-m", "gauntlet.workflows.cli", "lint", "--profile", str(bad)],
                       capture_output=True, text=True)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "FP8 KV cache is refused on Hopper" in lines[0], r.stderr
    doc["hardware"]["gpu_arch"] = "blackwell"       # the rule is Hopper's
    bad.write_text(yaml.safe_dump(doc))
    assert load_profile(bad).experiments[-1].name == "fp8-kv"


def test_overlapping_rounds_are_noise_even_with_a_higher_median():
    # the t1 case: baseline rounds 28.4-35.9 (one slow neighbour), variant 33.1-36.2: not a win
    base = {"output_throughput": {"median": 28.8, "min": 28.4, "max": 35.9, "spread_rel": 0.26}}
    var = {"output_throughput": {"median": 35.6, "min": 33.1, "max": 36.2, "spread_rel": 0.09}}
    rows = compare({"c2": base}, {"c2": var})
    assert rows[0]["output_throughput"]["change_rel"] > 0.2
    assert verdict(rows)[0] == "keep baseline"


def test_no_common_case_keeps_baseline():
    assert verdict(compare({"a": _t(1, 1)}, {"b": _t(2, 1)}))[0] == "keep baseline"


def test_baseline_cases_read_from_perf_evidence(tmp_path):
    from gauntlet.contract import Check, Verdict
    ok = [Check("c", "pass")]
    Verdict.of("perf", "t", ok, {"cases": {"c2": {"table": {}}}}).write(tmp_path / "perf")
    Verdict.of("perf", "t", ok, {"cases": {"c4": {"table": {}}}}).write(tmp_path / "perf-c4")
    (tmp_path / "perf-c8").mkdir()
    (tmp_path / "perf-c8" / "verdict.json").write_text('{"metrics": {"cases": {"c8": {}}}}')   # not a verdict
    assert sorted(baseline_cases(tmp_path / "perf")) == ["c2", "c4"]


# ---- like for like: phase by phase ------------------------------------------------

def test_prefix_cache_plan_has_both_phases_and_spec_has_one():
    prof = load_profile("local-cpu")
    pc = next(v for v in prof.experiments if v.name == "prefix-cache")
    plan = phase_plan(pc, prof)
    assert list(plan) == ["cold", "reusable_prefix"]
    assert len(set(plan["cold"]["seeds"])) == prof.bench.rounds          # a new request set every round
    assert plan["reusable_prefix"]["prefix_len"] == pc.prefix_len
    spec = Variant(name="s", change={"speculative": {"method": "ngram", "num_speculative_tokens": 3}})
    assert phase_plan(spec, prof) == {"measure": {}}


def test_each_phase_gets_its_own_verdict_and_the_target_phase_decides():
    same, better = compare({"c2": _t(100, 300)}, {"c2": _t(100, 300)}), compare({"c2": _t(100, 300)}, {"c2": _t(130, 300)})
    v = phase_verdicts({"cold": same, "reusable_prefix": better})
    assert v["cold"]["verdict"] == "no gain beyond noise" and "no gain expected" in v["cold"]["expected"]
    assert v["reusable_prefix"]["verdict"] == "better"
    assert decision(v)[0] == "adopt variant" and decision(v)[2] == "reusable_prefix"
    # the cold phase alone (the old single number) would have said keep baseline
    assert verdict(same)[0] == "keep baseline"


def test_a_phase_worse_beyond_noise_vetoes_the_gain():
    slower = compare({"c2": _t(100, 300)}, {"c2": _t(80, 300)})
    better = compare({"c2": _t(100, 300)}, {"c2": _t(130, 300)})
    v = phase_verdicts({"cold": slower, "reusable_prefix": better})
    assert v["cold"]["verdict"] == "worse"
    d, why, _ = decision(v)
    assert d == "keep baseline" and why.startswith("cold:")


def test_without_a_compared_target_phase_the_baseline_is_kept():
    v = phase_verdicts({"cold": compare({"c2": _t(100, 300)}, {"c2": _t(130, 300)})})
    assert decision(v)[0] == "keep baseline"


# ---- real engine --------------------------------------------------------------



@pytest.mark.engine
def test_prefix_cache_experiment_real_engine(tmp_path, endpoint):
    """Baseline perf and the baseline's run of the variant's phases on the shared engine (the sequence's perf and
    baseline-phases tasks), then the prefix-cache variant on its own engine, compared phase by phase."""
    import json

    import yaml

    from gauntlet.params import profile_path
    from gauntlet.steps.engines.local_vllm import free_port, port_open
    from gauntlet.workflows.cli import main as gauntlet

    doc = yaml.safe_load(profile_path("local-cpu").read_text())
    doc["bench"].update(warmup_prompts=1, prompts_per_concurrency=1)
    doc["bench"]["cases"] = [dict(doc["bench"]["cases"][0], output_len=8)]
    for e in doc["engines"].values():      # the plan's per-case rates name only cases the profile has
        if (e.get("plan") or {}).get("case_tps"):
            e["plan"]["case_tps"] = {k: v for k, v in e["plan"]["case_tps"].items() if k == "c2-128-32"}
    port = free_port()
    doc["engines"]["vllm"]["port"] = port      # its own port: the shared engine stays up
    prof = tmp_path / "local-small.yaml"
    prof.write_text(yaml.safe_dump(doc))
    seq = tmp_path / "run" / "vllm"
    store = str(tmp_path / "store")
    assert gauntlet(["step", "perf", "--profile", str(prof), "--out", str(seq / "perf"), "--engine", "vllm",
                     "--endpoint", endpoint, "--cases", "c2-128-32", "--results-uri", store]) == 0
    assert gauntlet(["step", "experiment-baseline", "--profile", str(prof), "--out", str(seq / "baseline-phases"),
                     "--engine", "vllm", "--endpoint", endpoint, "--results-uri", store]) == 0
    out = seq / "exp-prefix-cache"
    rc = gauntlet(["step", "experiment", "--profile", str(prof), "--out", str(out), "--engine", "vllm",
                   "--variant", "prefix-cache", "--results-uri", store])
    v = json.loads((out / "verdict.json").read_text())
    assert rc == 0, [c for c in v["checks"] if c["status"] != "pass"]
    names = {c["name"]: c for c in v["checks"]}
    assert names["variant-one-change"]["status"] == "pass" and names["deployed-one-change"]["status"] == "pass"
    # before it was measured the variant answered Gate 3's content checks, and its own ranks were watched
    assert {"content/models", "content/arithmetic", "content/tool-call", "content/streaming"} <= set(names)
    assert (out / "content" / "exchanges.jsonl").stat().st_size > 0
    assert names["engine_ranks"]["status"] == "pass", names["engine_ranks"]
    assert "from the start of variant prefix-cache to its end" in names["engine_ranks"]["detail"]
    m = v["metrics"]
    assert set(m["tables"]) == {"cold", "reusable_prefix"}
    assert m["verdict"] in ("keep baseline", "adopt variant") and m["comparison"][0]["case"] == "c2-128-32"
    # like for like: the baseline engine ran both phases too, and each phase has its own verdict
    assert set(m["comparisons"]) == set(m["phase_verdicts"]) == {"cold", "reusable_prefix"}
    assert m["main_phase"] == "reusable_prefix"
    assert m["baseline_tables"]["reusable_prefix"]["c2-128-32"]["output_throughput"]["median"] > 0
    warm = [h for h in m["prefix_cache_hit_rate"]["reusable_prefix"]["c2-128-32"] if h is not None]
    cold = [h for h in m["prefix_cache_hit_rate"]["cold"]["c2-128-32"] if h is not None]
    assert warm and max(warm) > 0.4          # the shared half-prompt prefix is served from the cache
    assert cold and max(cold) < max(warm)
    assert not port_open("127.0.0.1", port)   # torn down


@pytest.mark.engine
def test_a_variant_that_answers_wrongly_is_rejected_before_it_is_measured(tmp_path, local_model):
    """A real broken variant: vLLM CPU serving SmolLM2 at a 64-token context comes up, lists the model and does
    its arithmetic, but refuses the multi-turn conversation (turn 2 is over its context, HTTP 400): Gate 3's content
    checks fail on it, so it is "reject variant", never measured, its ranks watched and its engine torn down."""
    import json

    import yaml

    from conftest import require_vllm

    from gauntlet.params import profile_path
    from gauntlet.steps.engines.local_vllm import free_port, port_open
    from gauntlet.workflows.cli import main as gauntlet

    require_vllm()
    doc = yaml.safe_load(profile_path("local-cpu").read_text())
    port = free_port()
    doc["engines"]["vllm"]["port"] = port
    doc["experiments"] = [{"name": "tiny-context", "engine": "vllm", "change": {"context_length": 64}}]
    prof = tmp_path / "local-tiny.yaml"
    prof.write_text(yaml.safe_dump(doc))
    out = tmp_path / "run" / "vllm" / "exp-tiny-context"
    rc = gauntlet(["step", "experiment", "--profile", str(prof), "--out", str(out), "--engine", "vllm",
                   "--variant", "tiny-context", "--results-uri", str(tmp_path / "store")])
    v = json.loads((out / "verdict.json").read_text())
    names = {c["name"]: c for c in v["checks"]}
    assert rc == 1 and v["status"] == "fail"
    assert names["deploy/engine-ready"]["status"] == "pass" and names["content/models"]["status"] == "pass"
    assert names["content/multi-turn"]["status"] == "fail" and "maximum context length is 64" in \
        names["content/multi-turn"]["detail"]
    assert v["metrics"]["verdict"] == "reject variant" and names["verdict"]["status"] == "fail"
    assert "content checks failed on the variant, so it was not measured: multi-turn" in v["metrics"]["verdict_reason"]
    assert v["metrics"]["phases"] == {} and not (out / "raw").exists()         # no bench round ran
    assert names["engine_ranks"]["status"] == "pass" and names["teardown/engine-stopped"]["status"] == "pass"
    assert not port_open("127.0.0.1", port)


def test_the_variant_reads_the_baseline_phases_from_their_task(tmp_path):
    """Gate 6 reads the baseline's cold/reusable-prefix rounds from the sequence's baseline-phases task (written
    before the baseline was released), the variant's own name only; none there: measured, not compared."""
    import json

    from gauntlet.steps.gates.experiment import BASELINE_TASK, baseline_phases

    seq = tmp_path / "vllm"
    (seq / BASELINE_TASK).mkdir(parents=True)
    table = {"c2": {"output_throughput": {"median": 10.0}}}
    (seq / BASELINE_TASK / "baseline_phases.json").write_text(json.dumps(
        {"prefix-cache": {"cold": {"tables": table, "prefix_cache_hit_rate": {"c2": [0.0]}}}}))
    assert baseline_phases(seq / BASELINE_TASK, "prefix-cache")["cold"]["tables"] == table
    assert baseline_phases(seq / BASELINE_TASK, "other") == {} and baseline_phases(tmp_path / "none", "x") == {}


@pytest.mark.parametrize("lost", ["before the measurement", "during the measurement"])
def test_a_variant_whose_rank_goes_down_is_rejected(tmp_path, monkeypatch, engine, fake_bench, lost):  # noqa: F811
    """The rank watch on a variant, wired through Gate 6's run: the ranks are read at its ready, after its content
    checks and after its measurement. A rank that exits before the measurement: rejected, never measured; one that
    restarts during it: rejected, no comparison reported. The back end's rank reads (pods on Kubernetes, the
    process group locally, tests/test_rank_watch.py) are played by a stand-in of ``Backend.ranks``'s contract;
    the engine is the recording OpenAI-style server of tests/test_engine_client.py, the bench client its
    recorder."""
    from gauntlet.contract import Check
    from gauntlet.steps.cluster.rank_watch import Rank
    from gauntlet.steps.gates import deploy, experiment, experiment_baseline, teardown

    base, _ = engine
    profile = load_profile("local-cpu")
    monkeypatch.setattr(deploy, "run", lambda opts, out: ([], {"outputs": {"endpoint": base}}))
    monkeypatch.setattr(teardown, "run", lambda opts, out: ([], {}))
    monkeypatch.setattr(experiment, "content_checks",
                        lambda *a: [Check("arithmetic", "pass", 5, 5, "the recorder's answer")])
    up, down = Rank(0, "pid-1", 0, True, "pid 1"), Rank(0, "pid-1", 0, False, "pid 1")
    restarted = Rank(0, "pid-1", 1, True, "pid 1")
    reads = iter([[up], [down], [down]] if lost == "before the measurement" else [[up], [up], [restarted]])
    monkeypatch.setattr(experiment, "snapshot", lambda *a: next(reads))
    bench = {"tokenizer": "t", "no_store": True, "no_ceiling": True, "sample_interval": 60.0}
    seq = tmp_path / "vllm"
    experiment_baseline.run(experiment_baseline.Options(profile=profile, engine="vllm", endpoint=base, **bench),
                            seq / experiment.BASELINE_TASK)
    fake_bench.clear()
    checks, m = experiment.run(experiment.Options(profile=profile, engine="vllm", variant="prefix-cache",
                                                  baseline_dir=tmp_path / "no-perf", **bench), seq / "exp-prefix-cache")
    names = {c.name: c for c in checks}
    assert m["verdict"] == experiment.REJECT and names["verdict"].status == "fail"
    assert names["engine_ranks"].status == "fail" and "variant prefix-cache" in names["engine_ranks"].detail
    assert "its ranks did not stay up: rank 0 " in m["verdict_reason"]
    assert "comparisons" not in m and "phase/reusable_prefix" not in names
    if lost == "before the measurement":
        assert fake_bench == [] and m["phases"] == {} and "exited" in m["verdict_reason"]
    else:
        assert fake_bench and set(m["phases"]) == {"cold", "reusable_prefix"} and "restarted" in m["verdict_reason"]
