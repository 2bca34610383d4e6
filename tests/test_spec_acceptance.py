"""Gate 6: a speculative variant's acceptance from the engine's own figures, SGLang's read where its server reports
them: the Prometheus text SGLang 0.5.23's own collectors render (sglang/srt/observability/metrics_collector.py,
``TokenizerMetricsCollector`` and ``SchedulerMetricsCollector`` on a registry of their own through their
``_StatLoggerDIMixin`` hooks), differenced over a round as the sampler does, compared with SGLang's own per-request
figures (``TokenizerManager._calculate_spec_decoding_metrics``, what it puts in a response's ``meta_info``).

No SGLang server runs here (no GPU): the collectors are fed what its tokenizer manager and scheduler feed them.
"""

from __future__ import annotations

import functools
import types

import pytest

from gauntlet.steps.client.sampler import engine_gauges, parse_prometheus, summarize_samples
from gauntlet.steps.engines import engine
from gauntlet.steps.gates.experiment import acceptance_problems, speculation, speculative_figures
from conftest import require_sglang

WINDOW = 8          # DSpark gamma 7: SGLang verifies gamma + 1 (speculative_num_draft_tokens)
LABELS = {"model_name": "kimi-k3", "engine_type": "unified"}


@pytest.fixture(scope="module")
def sglang():
    require_sglang()
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Summary, generate_latest
    from sglang.srt import runtime_context
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from sglang.srt.observability import metrics_collector as mc
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(model_path="dummy", enable_metrics=True, speculative_algorithm="DSPARK",
                      speculative_num_draft_tokens=WINDOW)
    ctx = runtime_context.create_context(args, role="tokenizer")
    # SGLang registers a few gauges (sglang:routing_key_running_req_count) on the process' default registry
    # whatever _gauge_cls says: a second collector in the same pytest worker would collide; drop the first's
    import prometheus_client as _pc
    for _c, _names in list(_pc.REGISTRY._collector_to_names.items()):
        if any(n.startswith("sglang:") for n in _names):
            _pc.REGISTRY.unregister(_c)
    reg = CollectorRegistry()
    di = {"_counter_cls": functools.partial(Counter, registry=reg), "_gauge_cls": functools.partial(Gauge, registry=reg),
          "_histogram_cls": functools.partial(Histogram, registry=reg),
          "_summary_cls": functools.partial(Summary, registry=reg)}
    with runtime_context.use_context(ctx):
        tok = type("Tok", (mc.TokenizerMetricsCollector,), di)(server_args=args, labels=LABELS)
        # the labels SchedulerMetricsCollector.init_new gives rank 0's scheduler
        sched = type("Sched", (mc.SchedulerMetricsCollector,), di)(
            labels={**LABELS, "tp_rank": 0, "pp_rank": 0, "moe_ep_rank": 0}, server_args=args)

    def finish(completion: int, verify: int, correct: int) -> dict:
        """One request finishes: SGLang's own meta_info figures for it, and its counters as the tokenizer counts it."""
        meta: dict = {}
        rec = types.SimpleNamespace(spec_verify_ct=[verify], spec_num_correct_drafts=[correct],
                                    completion_tokens=[completion], spec_correct_drafts_histogram=None)
        with runtime_context.use_context(ctx):
            TokenizerManager._calculate_spec_decoding_metrics(None, meta, rec, 0)
            tok.observe_one_finished_request(LABELS, 128, completion, 0, 1.0, False, None, spec_verify_ct=verify)
        return meta

    def scrape() -> dict[str, float]:
        return parse_prometheus(generate_latest(reg).decode())

    with runtime_context.use_context(ctx):
        sched.log_stats(mc.SchedulerStats(num_running_reqs=mc.QueueCount(total=3), spec_num_draft_tokens=WINDOW,
                                          token_usage=0.25))
    return types.SimpleNamespace(finish=finish, scrape=scrape, text=lambda: generate_latest(reg).decode(),
                                 tok=tok, sched=sched, ctx=ctx)


def test_every_prometheus_name_of_the_sglang_adapter_is_one_sglang_exports(sglang):
    text = sglang.text()       # a metric is declared (HELP/TYPE) before any request has labelled a sample of it
    missing = [n for names in engine("sglang").metrics.values() for n in names if f"# TYPE {n} " not in text]
    assert missing == []
    assert "# TYPE sglang:spec_verifications_total " not in text      # the check can fail


def test_a_rounds_acceptance_is_sglangs_own_from_its_counters(sglang):
    sglang.finish(40, 20, 10)                  # a warmup request, before the round
    start = sglang.scrape()
    metas = [sglang.finish(c, v, k) for c, v, k in ((64, 20, 30), (32, 16, 12), (100, 25, 60))]
    end = sglang.scrape()
    res = summarize_samples([], {}, {}, start, end, 1.0)
    got = speculation({"valid": True, "resources": res})
    # SGLang's per-request accept length is completion / verify steps; over the round: all tokens / all steps
    steps = sum(m["spec_verify_ct"] for m in metas)
    assert got["acceptance_length"] == pytest.approx(sum(m["spec_accept_length"] * m["spec_verify_ct"]
                                                         for m in metas) / steps)
    assert got["acceptance_length"] == pytest.approx((64 + 32 + 100) / (20 + 16 + 25))
    assert got["draft_tokens"] == sum(m["spec_num_proposed_drafts"] for m in metas) == steps * (WINDOW - 1)
    assert got["drafts"] == steps and got["acceptance_rate_pct"] is None      # SGLang exports no accepted count
    assert engine_gauges(end)["kv_usage"] == 0.25 and engine_gauges(end)["running"] == 3
    figures = speculative_figures([{"valid": True, "resources": res}] * 3)
    assert figures["acceptance_length"] == pytest.approx(got["acceptance_length"])
    assert acceptance_problems({"c1": figures}, ["c1"]) == []


def test_sglangs_retractions_prefix_hits_and_token_counts_from_its_own_collectors(sglang):
    """Gate 4's per-round figures on SGLang: its preemptions are retractions (the scheduler's counter), its prefix
    hit rate cached / prompt tokens and its token counts the tokenizer manager's, per finished request; each a
    labelled child SGLang creates at its first count, so absent at the round's start (and then from 0)."""
    from sglang.srt import runtime_context

    start = sglang.scrape()
    with runtime_context.use_context(sglang.ctx):
        # SGLang's own arguments: prompt, generated and cached tokens, latency, grammar, the cache's sources
        sglang.tok.observe_one_finished_request(LABELS, 1000, 50, 400, 1.0, False, {"device": 300, "host": 100})
        sglang.tok.observe_one_finished_request(LABELS, 1000, 50, 0, 1.0, False, None)
        sglang.sched.increment_retracted_reqs(num_retracted_reqs=2, num_retracted_input_tokens=2000,
                                              num_retracted_output_tokens=30)
    end = sglang.scrape()
    assert "sglang:num_retracted_requests_total" not in start         # created at its first count
    res = summarize_samples([], {}, {}, start, end, 1.0, engine_metrics=engine("sglang").metrics,
                            counters_from_first_count=engine("sglang").counters_from_first_count)
    assert res["engine_preemptions_delta"] == 2
    assert res["engine_prompt_tokens_delta"] == 2000 and res["engine_generation_tokens_delta"] == 100
    assert res["prefix_cache_hit_rate"] == pytest.approx(400 / 2000)
    # nothing retracted in a round: zero, not unknown, for SGLang only
    quiet = summarize_samples([], {}, {}, end, end, 1.0, counters_from_first_count=True)
    assert quiet["engine_preemptions_delta"] == 0 and quiet["engine_spec_accepted_tokens_delta"] == 0


def test_drafts_all_rejected_or_not_read_veto_the_adoption():
    # vLLM: the bench client's own figures (vllm/benchmarks/serve.py), from vLLM's counters
    vllm = speculation({"spec_decode_acceptance_length": 1.0, "spec_decode_acceptance_rate": 0.0,
                        "spec_decode_num_drafts": 90, "spec_decode_draft_tokens": 270, "spec_decode_accepted_tokens": 0})
    assert vllm["acceptance_length"] == 1.0 and vllm["draft_tokens"] == 270
    # the same counters through the sampler when the client wrote none: 1 + accepted / drafts
    counted = speculation({"resources": {"engine_spec_drafts_delta": 90.0, "engine_spec_draft_tokens_delta": 270.0,
                                         "engine_spec_accepted_tokens_delta": 180.0}})
    assert counted["acceptance_length"] == 3.0 and counted["acceptance_rate_pct"] == pytest.approx(200 / 3)
    problems = acceptance_problems({"a": {"acceptance_length": 1.0}, "b": {"acceptance_length": None},
                                    "c": {"acceptance_length": 2.4}}, ["a", "b", "c", "d"])
    assert [p.split(":")[0] for p in problems] == ["a", "b", "d"]
    assert "not accepted" in problems[0] and "not read" in problems[1]


def test_the_sglang_engine_serves_the_metrics_it_is_read_by(sglang):
    """SGLang exports no /metrics unless --enable-metrics (ObservabilityArgs.enable_metrics, off by default): every
    planned rank's argv, parsed by SGLang's own ServerArgs parser, turns it on."""
    from gauntlet.params import load_profile
    from gauntlet.steps.engines.commands import engine_command
    from gauntlet.steps.engines.sglang import SglangAdapter

    kimi = load_profile("kimi-k3-h20")
    argv = engine_command("sglang", kimi.engines["sglang"], model_path="/models/kimi", served_name="kimi-k3")
    err, options = SglangAdapter().parse(argv[3:])          # after `python3 -m sglang.launch_server`
    assert err is None and options is not None and options["--enable-metrics"] is True
