"""The engine's own metrics beside every Gate 4 round, and the client's token counts held to them.

The pure rules (a counter's growth over a round, the token-count check, the figures and why one is missing) on
their own; then the real Sampler, scraping a loopback /metrics in vLLM 0.32's names, inside measure_case: a round
whose engine counted other tokens than the client is not valid and the case check names both numbers, while
the warmup's tokens, counted before the round's window opens, never count against the round.
"""

from __future__ import annotations

import threading
from http.server import ThreadingHTTPServer
from typing import Any

import pytest

from gauntlet.params import load_profile
from gauntlet.steps.client.bench import ClientRun
from gauntlet.steps.client.sampler import counter_delta, parse_prometheus, summarize_samples
from gauntlet.steps.engines import engine
from gauntlet.steps.evidence.stats import ENGINE_COLUMNS, engine_figures, token_counts
from loopback import JsonHandler

LOCAL = load_profile("local-cpu")


def _vllm_text(c: dict[str, float]) -> str:
    """/metrics as vLLM 0.32 writes these series (names and labels from a real scrape of the local engine)."""
    lab = '{engine="0",model_name="smollm2-135m"}'
    return "".join(f"# TYPE {n} counter\n{n}{lab} {v}\n" if n.endswith("_total") else f"{n}{lab} {v}\n"
                   for n, v in c.items())


# ---- pure ------------------------------------------------------------------------------------------------------

def test_a_counters_growth_over_the_round():
    start, end = {"vllm:generation_tokens_total": 100.0}, {"vllm:generation_tokens_total": 356.0}
    assert counter_delta("generation_tokens", start, end) == 256
    # created during the round (SGLang makes a labelled child at its first count): it started at 0
    assert counter_delta("preemptions", {"sglang:token_usage": 0.1},
                         {"sglang:token_usage": 0.2, "sglang:num_retracted_requests_total": 3.0}) == 3
    # absent from both scrapes: unknown, unless the engine's counters appear at their first count
    assert counter_delta("preemptions", {"sglang:token_usage": 0.1}, {"sglang:token_usage": 0.2}) is None
    assert counter_delta("preemptions", {"sglang:token_usage": 0.1}, {"sglang:token_usage": 0.2}, True) == 0
    # a scrape that failed is no reading, whatever the engine
    assert counter_delta("preemptions", {}, {"sglang:token_usage": 0.2}, True) is None
    assert engine("sglang").counters_from_first_count and not engine("vllm").counters_from_first_count


def test_every_missing_reading_says_why():
    start = {"vllm:num_requests_running": 0.0, "vllm:prefix_cache_queries_total": 0.0,
             "vllm:prefix_cache_hits_total": 0.0, "vllm:num_preemptions_total": 0.0}
    end = dict(start)
    s = summarize_samples([{"t": 1.0, "engine_running": 2.0}], {}, {}, start, end, 1.0,
                          engine_metrics=engine("vllm").metrics)
    cols, why = engine_figures({"resources": s})
    assert set(cols) == set(ENGINE_COLUMNS)
    assert cols["engine_running_max"] == 2 and cols["engine_preemptions"] == 0
    assert {k for k, v in cols.items() if v is None} == set(why)       # every None has its reason, nothing else
    assert "vllm:kv_cache_usage_perc" in why["engine_kv_usage_max"]
    assert why["prefix_cache_hit_rate"] == "the engine looked up no prompt token in its prefix cache during the round"
    assert "vllm:spec_decode_num_drafts_total" in why["engine_spec_acceptance_length"]
    assert "vllm:generation_tokens_total" in why["engine_generation_tokens"]
    # the engine answered nothing: that is the reason, for every counter
    s = summarize_samples([], {}, {}, {}, {}, 1.0, ["/metrics: ConnectError: refused"])
    assert s["engine_notes"]["preemptions"].startswith("/metrics did not answer") and "refused" in \
        s["engine_notes"]["preemptions"]
    # llama.cpp's adapter names no metric at all
    s = summarize_samples([], {}, {}, {"x": 1.0}, {"x": 1.0}, 1.0, engine_metrics=engine("llamacpp").metrics)
    assert "names no metric" in s["engine_notes"]["generation_tokens"]


def test_prefix_hit_rate_and_acceptance_per_round():
    s = summarize_samples([], {}, {}, parse_prometheus(_vllm_text({
        "vllm:prefix_cache_queries_total": 1000, "vllm:prefix_cache_hits_total": 400,
        "vllm:spec_decode_num_drafts_total": 10, "vllm:spec_decode_num_draft_tokens_total": 30,
        "vllm:spec_decode_num_accepted_tokens_total": 15})), parse_prometheus(_vllm_text({
            "vllm:prefix_cache_queries_total": 2000, "vllm:prefix_cache_hits_total": 1150,
            "vllm:spec_decode_num_drafts_total": 110, "vllm:spec_decode_num_draft_tokens_total": 330,
            "vllm:spec_decode_num_accepted_tokens_total": 165})), 1.0)
    cols, why = engine_figures({"resources": s})
    assert cols["prefix_cache_hit_rate"] == 0.75
    assert cols["engine_spec_acceptance_length"] == 2.5 and cols["engine_spec_acceptance_rate_pct"] == 50
    assert "prefix_cache_hit_rate" not in why and "engine_spec_acceptance_length" not in why


@pytest.mark.parametrize("client,eng,agree", [(256, 256, True), (256, 261, True), (256, 262, False),
                                              (256, 200, False), (256, None, None)])
def test_the_client_and_the_engine_count_the_same_tokens(client, eng, agree):
    rec = {"total_output_tokens": client, "total_input_tokens": 1024,
           "resources": {"engine_generation_tokens_delta": eng, "engine_prompt_tokens_delta": 1024.0,
                         "engine_notes": {} if eng is not None else {"generation_tokens": "no counter"}}}
    ok, why = token_counts(rec, 0.02)
    if agree is None:       # the prompt pair alone still compares
        assert ok is True and "output tokens not compared (no counter)" in why
        return
    assert ok is agree and f"output tokens: client {client}, engine {eng}" in why
    assert ("> tolerance 2.0%" in why) is (not agree)


def test_nothing_compared_is_unknown_never_a_pass():
    ok, why = token_counts({"total_output_tokens": 256, "resources": {"engine_notes": {
        "generation_tokens": "vllm:generation_tokens_total not in the engine's /metrics"}}}, 0.02)
    assert ok is None and "not compared" in why and "generation_tokens_total" in why


# ---- the real Sampler over a loopback /metrics, inside measure_case ---------------------------------------------

class _Engine:
    """A /metrics that moves as the fake client's requests would move vLLM's counters."""

    def __init__(self) -> None:
        self.c: dict[str, float] = {"vllm:num_requests_running": 0.0, "vllm:kv_cache_usage_perc": 0.01,
                                    "vllm:generation_tokens_total": 0.0, "vllm:prompt_tokens_total": 0.0,
                                    "vllm:num_preemptions_total": 0.0, "vllm:iteration_tokens_total_sum": 0.0}
        outer = self

        class H(JsonHandler):
            def do_GET(self) -> None:
                self._send(200, _vllm_text(outer.c), "text/plain")
        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"

    def count(self, prompt: int, generated: int) -> None:
        self.c["vllm:prompt_tokens_total"] += prompt
        self.c["vllm:generation_tokens_total"] += generated
        self.c["vllm:iteration_tokens_total_sum"] += prompt + generated


def _measure(tmp_path, monkeypatch, extra_generated: int) -> Any:
    from gauntlet.steps.gates import perf

    eng = _Engine()
    case = LOCAL.bench.cases[0]

    def client(req, **_):
        out = req.num_prompts * req.output_len
        # the engine counts what it served; the rounds' engine served ``extra_generated`` tokens more than asked
        eng.count(req.num_prompts * req.input_len, out + (0 if "warmup" in req.result_path.name else extra_generated))
        return ClientRun({"completed": req.num_prompts, "failed": 0, "duration": 1.0, "output_throughput": 30.0,
                          "total_input_tokens": req.num_prompts * req.input_len, "total_output_tokens": out,
                          "p99_ttft_ms": 100.0, "p99_tpot_ms": 40.0}, 1.0, 1.0, "fake")

    monkeypatch.setattr(perf, "run_client", client)
    monkeypatch.setattr(perf, "sample_requests", lambda req: [])
    try:
        return perf.measure_case(case, LOCAL, endpoint=eng.url, tokenizer="t", out=tmp_path, meta={},
                                 sample_interval=60.0, engine=engine("vllm"))
    finally:
        eng.srv.shutdown()


def test_a_round_whose_counts_disagree_is_not_valid_and_the_check_names_both(tmp_path, monkeypatch):
    from gauntlet.steps.gates.perf import case_checks

    res = _measure(tmp_path, monkeypatch, extra_generated=40)      # 8 prompts x 32 tokens = 256; engine 296
    assert all(r["token_counts_agree"] is False and not r["valid"] for r in res.rounds)
    check = next(c for c in case_checks(res, 0.5) if c.name.endswith("/rounds-valid"))
    assert check.status == "fail"
    assert "output tokens: client 256, engine 296 (15.6% apart > tolerance 2.0%)" in check.detail


def test_the_warmups_tokens_are_outside_the_rounds_window(tmp_path, monkeypatch):
    res = _measure(tmp_path, monkeypatch, extra_generated=0)
    assert res.warmup is not None and res.warmup["engine_generation_tokens"] == LOCAL.bench.warmup_prompts * 32
    for r in res.rounds:
        assert r["valid"] and r["token_counts_agree"] is True
        assert r["engine_generation_tokens"] == r["total_output_tokens"] == 256
        assert r["engine_prompt_tokens"] == r["total_input_tokens"] == 1024
        assert r["engine_preemptions"] == 0 and r["engine_notes"]["prefix_cache_hit_rate"]
