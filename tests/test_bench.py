"""The bench client wrapper: argv the real client accepts, and parsing its real JSON."""

import importlib.util
import json
from pathlib import Path

import pytest

from gauntlet.steps.client.bench import BenchRequest, client_argv, parse_result

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "vllm-0.32.0-cpu/bench-serve-result.json"


def test_parse_real_fixture():
    raw = json.loads(FIXTURE.read_text())
    rec = parse_result(raw)
    assert rec["num_prompts"] == 16 and rec["completed"] == 16 and rec["failed"] == 0
    assert rec["success_rate"] == 1.0
    assert rec["output_throughput"] == pytest.approx(77.0856, rel=1e-4)
    assert rec["request_throughput"] == pytest.approx(2.4089, rel=1e-4)
    assert rec["input_throughput"] == pytest.approx(2528 / 6.641965875000096)
    assert rec["p99_ttft_ms"] == pytest.approx(308.659, rel=1e-5)
    assert rec["p50_tpot_ms"] == pytest.approx(44.9586, rel=1e-5)
    assert rec["p95_itl_ms"] == pytest.approx(49.101, rel=1e-4)
    assert rec["p99_e2el_ms"] == pytest.approx(1706.285, rel=1e-5)
    assert rec["spec_decode_acceptance_rate"] is None  # no speculative decoding in that run


def test_failed_derived_from_errors_when_absent():
    raw = {"num_prompts": 4, "completed": 3, "errors": ["", "", "timeout", ""], "duration": 1.0}
    rec = parse_result(raw)
    assert rec["failed"] == 1 and rec["success_rate"] == 0.75


def test_spec_decode_fields_are_kept():
    raw = dict(json.loads(FIXTURE.read_text()), spec_decode_acceptance_rate=41.5,
               spec_decode_acceptance_length=2.2, spec_decode_draft_tokens=300)
    rec = parse_result(raw)
    assert rec["spec_decode_acceptance_rate"] == 41.5 and rec["spec_decode_draft_tokens"] == 300


@pytest.mark.slow  # imports vLLM (10-25 s on 2 cores)
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed")
def test_argv_is_accepted_by_the_real_client_parser(tmp_path):
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    req = BenchRequest("http://127.0.0.1:1/", "m", "tok", 128, 32, 4, 16, 42, tmp_path / "r.json", prefix_len=64)
    p = FlexibleArgumentParser()
    add_cli_args(p)
    a = p.parse_args(client_argv(req))
    assert (a.random_input_len, a.random_output_len, a.max_concurrency, a.num_prompts, a.seed) == (128, 32, 4, 16, 42)
    assert a.random_prefix_len == 64 and a.ignore_eos and a.save_result
    assert a.base_url == "http://127.0.0.1:1" and a.result_filename == "r.json"
    assert a.metric_percentiles == "50,95,99" and "e2el" in a.percentile_metrics
