"""Sampler parsers on real outputs, and the headroom rule."""

from pathlib import Path

import pytest

from gauntlet.steps.client.sampler import (cpu_times, engine_gauges, headroom, parse_nvidia_smi_csv, parse_proc_net_dev,
                            parse_prometheus, summarize_samples)

GPU = Path(__file__).resolve().parent / "fixtures" / "gpu/nvidia-h200-1gpu/nvidia-smi-query.csv"

VLLM_METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="smollm2-135m"} 3.0
vllm:num_requests_waiting{engine="0",model_name="smollm2-135m"} 1.0
vllm:kv_cache_usage_perc{engine="0",model_name="smollm2-135m"} 0.25
vllm:prefix_cache_queries_total{engine="0",model_name="smollm2-135m"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="smollm2-135m"} 400.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="0.3",model_name="smollm2-135m"} 2.0
process_resident_memory_bytes 1.5e+09
"""


def test_nvidia_smi_query_fixture():
    rows = parse_nvidia_smi_csv(GPU.read_text())
    assert len(rows) == 1
    r = rows[0]
    assert r["memory.total"] == 143771 and r["memory.used"] == 0
    assert r["power.draw"] == 126.06 and r["utilization.gpu"] == 0 and r["index"] == 0


def test_proc_net_dev():
    text = Path("/proc/net/dev").read_text()
    d = parse_proc_net_dev(text)
    assert "lo" in d and d["lo"]["rx_bytes"] >= 0


def test_prometheus_and_gauges():
    m = parse_prometheus(VLLM_METRICS)
    g = engine_gauges(m)
    assert g["running"] == 3 and g["waiting"] == 1 and g["kv_usage"] == 0.25
    assert "vllm:e2e_request_latency_seconds_bucket" not in m
    assert g["engine_rss_bytes"] == 1.5e9
    assert engine_gauges(parse_prometheus("sglang:token_usage 0.5\n"))["kv_usage"] == 0.5


def test_cpu_times():
    busy, total = cpu_times("cpu  100 0 50 800 50 0 0 0 0 0\n")
    assert (busy, total) == (150, 1000)


def test_summary_headroom_and_expert_load_unavailable():
    samples = [{"engine_kv_usage": 0.2, "host_mem_free_frac": 0.6}, {"engine_kv_usage": 0.7, "host_mem_free_frac": 0.5}]
    start = parse_prometheus(VLLM_METRICS)
    end = dict(start, **{"vllm:prefix_cache_queries_total": 1200.0, "vllm:prefix_cache_hits_total": 500.0})
    net0 = {"eth0": {"rx_bytes": 10, "tx_bytes": 20}, "lo": {"rx_bytes": 0, "tx_bytes": 0}}
    net1 = {"eth0": {"rx_bytes": 110, "tx_bytes": 220}, "lo": {"rx_bytes": 5, "tx_bytes": 5}}
    s = summarize_samples(samples, net0, net1, start, end, 3.0)
    assert abs(s["headroom"] - 0.3) < 1e-9  # KV usage peaked at 70%
    assert s["net_rx_bytes"] == 100 and s["net_tx_bytes"] == 200 and s["net_lo_bytes"] == 5
    assert s["prefix_cache_hit_rate"] == 0.5
    assert s["expert_load"]["available"] is False and "no per-rank expert load" in s["expert_load"]["reason"]
    assert s["gpu_source"].startswith("unavailable")


def test_headroom_is_the_engines_kv_cache_not_gpu_or_host_memory():
    """SGLang's static pool (--mem-fraction-static 0.9) shows as 95% GPU memory used at any load; a bench pod's
    host memory says nothing of the GPUs: neither decides, the engine's KV usage gauge does (none: unknown)."""
    static_pool = {"engine_kv_usage_max": 0.1, "gpu_mem_used_frac_max": 0.95, "gpu_source": "nvidia-smi"}
    assert headroom(static_pool) == pytest.approx(0.9)
    assert headroom({"engine_kv_usage_max": None, "host_mem_free_frac_min": 0.6,
                     "gpu_source": "not sampled on the engine's nodes: rank 0 unreachable"}) is None
    assert headroom({"gpu_mem_used_frac_max": 0.2, "gpu_source": "nvidia-smi"}) is None
    assert headroom({}) is None
