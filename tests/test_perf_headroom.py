"""Gate 4's C32 rule reads the engine's KV cache under the C16 load, from the engine's own /metrics.

SGLang cannot serve here, so its reading is taken from the text SGLang's own metrics collector renders on
the CPU (``SchedulerMetricsCollector.log_stats``, the call its scheduler makes, through prometheus_client);
vLLM's comes from the real vLLM CPU server under load (tests/test_perf.py ``test_perf_real_engine``).
"""

from __future__ import annotations

import functools
import json
import logging
import time
from pathlib import Path

import pytest

from gauntlet.params import load_profile
from gauntlet.steps.client.sampler import engine_gauges, parse_prometheus, summarize_samples
from gauntlet.steps.engines import engine
from gauntlet.steps.evidence.stats import stability
from gauntlet.steps.gates.perf import CaseResult, measure_case, unlocks
from conftest import require_sglang

FIXTURES = Path(__file__).resolve().parent / "fixtures"
KIMI = load_profile("kimi-k3-h20")
LOCAL = load_profile("local-cpu")


def _need_sglang() -> None:
    require_sglang()


def _sglang_metrics_text(tmp_path: Path, token_usage: float, running: int, decode_tokens: int) -> str:
    """What SGLang's scheduler exports after one stats interval: its own collector, its own ServerArgs."""
    import argparse

    import prometheus_client as pc
    from sglang.srt import runtime_context
    from sglang.srt.observability.metrics_collector import QueueCount, SchedulerMetricsCollector, SchedulerStats
    from sglang.srt.server_args import ServerArgs

    model = tmp_path / "model"            # ServerArgs' resolution reads the model's config.json, nothing else
    model.mkdir()
    (model / "config.json").write_text((FIXTURES / "vllm-0.32.0-cpu" / "smollm2-config.json").read_text())
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = ServerArgs.from_cli_args(parser.parse_args(["--model-path", str(model), "--device", "cpu",
                                                       "--enable-metrics"]))
    # SGLang registers a few gauges (sglang:routing_key_running_req_count) on the process' default registry
    # whatever _gauge_cls says: a second collector in the same pytest worker would collide; drop the first's
    import prometheus_client as _pc
    for _c, _names in list(_pc.REGISTRY._collector_to_names.items()):
        if any(n.startswith("sglang:") for n in _names):
            _pc.REGISTRY.unregister(_c)
    registry = pc.CollectorRegistry()     # its own (the collector's class hooks), not the process' default

    class Collector(SchedulerMetricsCollector):
        _counter_cls = functools.partial(pc.Counter, registry=registry)
        _gauge_cls = functools.partial(pc.Gauge, registry=registry)
        _histogram_cls = functools.partial(pc.Histogram, registry=registry)
        _summary_cls = functools.partial(pc.Summary, registry=registry)

    # the labels sglang.srt.managers.scheduler_components.metrics_reporter gives it on a stats-logging rank
    labels = {"model_name": "kimi-k3", "engine_type": "unified", "tp_rank": 0, "pp_rank": 0, "moe_ep_rank": 0}
    with runtime_context.use_context(runtime_context.create_context(args, role="scheduler")):
        c = Collector(labels=labels, server_args=args)
        c.log_stats(SchedulerStats(num_running_reqs=QueueCount(total=running), token_usage=token_usage))
        c.increment_realtime_tokens(None, prefill_compute_tokens=16 * 1024, decode_tokens=decode_tokens)
    return pc.generate_latest(registry).decode()


@pytest.mark.slow  # imports SGLang (about 10 s on 2 cores)
def test_sglang_kv_usage_and_token_counter_read_from_its_own_collector(tmp_path):
    _need_sglang()
    text = _sglang_metrics_text(tmp_path, token_usage=0.42, running=16, decode_tokens=512)
    g = engine_gauges(parse_prometheus(text))
    assert g["kv_usage"] == pytest.approx(0.42) and g["running"] == 16
    assert g["tokens_processed"] == 16 * 1024 + 512      # prefill and decode: what a hang stops
    # the round's headroom is that gauge's, whatever the static pool shows on the GPUs
    samples = [{"t": 1.0, "engine_kv_usage": g["kv_usage"], "engine_running": g["running"],
                "gpus": [{"utilization.gpu": 90.0, "memory.used": 133000.0, "memory.total": 143771.0}]}]
    rec = summarize_samples(samples, {}, {}, {}, {}, 1.0)
    assert rec["gpu_mem_used_frac_max"] > 0.9 and rec["headroom"] == pytest.approx(0.58)


@pytest.mark.slow  # SGLang's own resolution of each rank's argv (its parser and prepare_server_args)
def test_sglang_ranks_are_started_with_metrics_and_its_parser_takes_them():
    """Without --enable-metrics SGLang exports no scheduler gauges (ObservabilityArgs.enable_metrics, off by
    default) and the C32 unlock has nothing to read."""
    _need_sglang()
    from sglang.srt.server_args import prepare_server_args

    from gauntlet.steps.backends.kubernetes import manifests as M
    for argv in M.rank_argvs(KIMI, "sglang", KIMI.engines["sglang"], "10.0.0.1"):
        assert "--enable-metrics" in argv
        handlers, level = logging.root.handlers[:], logging.root.level
        try:                # it calls logging.basicConfig(force=True): the test's log capture is put back
            assert prepare_server_args(argv[3:]).enable_metrics is True
        finally:
            logging.root.handlers[:], logging.root.level = handlers, level


def _stable(headroom: float | None, note: str = "") -> CaseResult:
    rounds = [{"valid": True, "output_throughput": t, "round": i + 1} for i, t in enumerate((50, 51, 52))]
    cr = CaseResult("c16-1k-1k", 16, 1024, 1024, 128, rounds)
    cr.stability = stability(rounds, KIMI.bench.spread_max_rel, 3)
    cr.headroom, cr.headroom_note = headroom, note
    return cr


def test_c32_stays_locked_without_a_kv_reading_and_says_why():
    ok, why = unlocks(KIMI, {"c16-1k-1k": _stable(None, "the engine's /metrics had none of sglang:token_usage "
                                                        "during the rounds")})["c32-1k-1k"]
    assert ok is False
    assert why == ("c16-1k-1k stable; KV-cache headroom unknown (the engine's /metrics had none of "
                   "sglang:token_usage during the rounds): c32-1k-1k stays locked (headroom_min 10%)")
    ok, why = unlocks(KIMI, {"c16-1k-1k": _stable(0.35)})["c32-1k-1k"]
    assert ok and "KV-cache headroom 35.0% >= 10%" in why


def test_llamacpp_has_no_kv_reading_so_its_gated_case_stays_locked(tmp_path, monkeypatch):
    """llama.cpp 11434's /metrics has no KV-cache usage (its adapter declares none): the case it gates is
    locked, naming that, instead of being decided by host memory."""
    from gauntlet.steps.client.bench import ClientRun
    from gauntlet.steps.gates import perf

    assert "kv_usage" not in engine("llamacpp").metrics
    fixture = json.loads((FIXTURES / "vllm-0.32.0-cpu" / "bench-serve-result.json").read_text())
    def client(req, **_):
        time.sleep(0.3)      # a round long enough for the sampler to read the host's memory
        return ClientRun(dict(fixture, num_prompts=req.num_prompts, completed=req.num_prompts), 0.3, 0.3, "x")

    monkeypatch.setattr(perf, "run_client", client)
    monkeypatch.setattr(perf, "sample_requests", lambda req: [], raising=False)
    case = LOCAL.bench.cases[0]
    # nothing answers /metrics at this endpoint, as llama.cpp exports no KV gauge
    res = measure_case(case, LOCAL, endpoint="http://127.0.0.1:9", tokenizer="t", out=tmp_path, meta={},
                       sample_interval=0.05, kv_names=engine("llamacpp").metrics.get("kv_usage", ()))
    assert res.headroom is None and all(r["resources"]["host_mem_free_frac_min"] is not None for r in res.rounds)
    ok, why = unlocks(LOCAL, {case.name: res})["c4-128-32"]
    assert not ok and "the engine's adapter declares no KV-cache usage gauge" in why and "stays locked" in why
