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
    assert a.trust_remote_code is False
    # the profile trusts the model's code (Kimi's tokenizer is its own): the client loads it the same way
    trusting = BenchRequest("http://127.0.0.1:1/", "m", "tok", 128, 32, 4, 16, 42, tmp_path / "r.json",
                            trust_remote_code=True)
    assert p.parse_args(client_argv(trusting)).trust_remote_code is True


@pytest.mark.slow  # the real client in-process (its import, 10-25 s on 2 cores) against the zero-cost server
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed")
def test_the_round_digest_is_of_the_requests_the_client_really_sent(tmp_path, local_model):
    """The digest each round records is drawn again with vLLM's own dataset code; the zero-cost server
    records every body the real client posts, and the two agree (another seed or length does not)."""
    from gauntlet.steps.client.bench import run_client
    from gauntlet.steps.client.null_server import null_server
    from gauntlet.steps.client.request_set import Sample, requests_digest, sample_requests

    seen = tmp_path / "seen.jsonl"
    with null_server("smol", record_to=str(seen)) as url:
        req = BenchRequest(url, "smol", str(local_model), 64, 8, 2, 6, 42, tmp_path / "r.json", prefix_len=16)
        run_client(req)
        drawn = requests_digest(sample_requests(req))
        other_seed = requests_digest(sample_requests(BenchRequest(url, "smol", str(local_model), 64, 8, 2, 6, 43,
                                                                  tmp_path / "o.json", prefix_len=16)))
    bodies = [json.loads(line) for line in seen.read_text().splitlines()]
    assert len(bodies) == 6
    assert drawn == requests_digest(Sample(b["prompt"], 0, b["max_tokens"]) for b in bodies) != other_seed
    assert drawn != requests_digest(Sample(b["prompt"], 0, b["max_tokens"] + 1) for b in bodies)
