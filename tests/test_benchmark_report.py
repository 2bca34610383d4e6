"""Each round as a Benchmark Report v0.2 (steps/evidence/benchmark_report.py), validated against the schema as
llm-d-benchmark defines it (re-stated as our models, source commit in the module), from a real vLLM bench serve
result; and the report step writing the reports and the history page beside report.md."""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from gauntlet.params import load_profile
from gauntlet.steps.client.bench import parse_result
from gauntlet.steps.evidence.benchmark_report import (REPORTS_DIR, BenchmarkReportV02, dump, read_reports,
                                                      round_report, stack_of, write_round_reports)

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "vllm-0.32.0-cpu/bench-serve-result.json"
RESULT = json.loads(FIXTURE.read_text())


def _row(**over) -> dict:
    """A round as the perf gate writes it to rounds.json: the run's metadata, the client's record, the case."""
    return {"run_id": "night07", "profile": "kimi-k3-h20", "engine": "sglang", "date": "2026-12-02",
            "timestamp": "2026-12-02T12:30:00+00:00", "client": "vllm-bench-serve", "client_version": "vllm 0.32.0",
            "image": "lmsysorg/sglang@sha256:ab", "image_digest": "sha256:ab", "args_hash": "6ab0592a4224b384",
            "model_fingerprint": "config:6f13", "git_rev": "a67ef72", "topology": "tp16-ep16-dp1-nodes2",
            "nodes": "h20-a,h20-b", "driver": "550.54", "context_length": 131072, "experiment": "baseline",
            "phase": "measure", "case": "c16-1k-1k", "input_len": 1024, "output_len": 1024, "concurrency": 16,
            "prefix_len": 0, "round": 2, "valid": True, **parse_result(RESULT), "window": [1796214780.0, 1796214786.6],
            "engine_kv_usage_mean": 0.41, "engine_kv_usage_max": 0.52, "prefix_cache_hit_rate": 0.0,
            "gpu_util_mean": 93.5, "requests_sha256": "9fb412d06dba4b1b", **over}


def test_a_real_round_is_a_valid_report_with_the_clients_numbers(tmp_path):
    stack = stack_of(load_profile("kimi-k3-h20"))
    doc = dump(round_report(_row(), stack))
    assert doc["version"] == "0.2" and len(doc["run"]["uid"]) == 32 and doc["run"]["eid"] == "night07"
    assert doc["run"]["time"]["duration"] == f"PT{RESULT['duration']:.3f}S"
    assert doc["run"]["time"]["start"].startswith("2026-12-02T") and doc["run"]["time"]["end"] > doc["run"]["time"]["start"]
    agg = doc["results"]["request_performance"]["aggregate"]
    assert agg["requests"] == {"total": 16, "failures": 0, "incomplete": 0,
                               "input_length": {"units": "count", "mean": 2528 / 16},
                               "output_length": {"units": "count", "mean": 512 / 16}}
    ttft = agg["latency"]["time_to_first_token"]
    assert ttft == {"units": "ms", "mean": RESULT["mean_ttft_ms"], "stddev": RESULT["std_ttft_ms"],
                    "p50": RESULT["p50_ttft_ms"], "p95": RESULT["p95_ttft_ms"], "p99": RESULT["p99_ttft_ms"]}
    assert agg["latency"]["time_per_output_token"]["units"] == "ms/token"
    assert agg["latency"]["request_latency"]["mean"] == RESULT["mean_e2el_ms"]
    assert agg["throughput"]["output_token_rate"] == {"units": "tokens/s", "mean": RESULT["output_throughput"]}
    assert agg["throughput"]["request_rate"] == {"units": "queries/s", "mean": RESULT["request_throughput"]}
    engine = doc["scenario"]["stack"][0]
    assert engine["metadata"]["label"] == "sglang" and engine["metadata"]["cfg_id"] == "6ab0592a4224b384"
    assert engine["standardized"]["kind"] == "inference_engine" and engine["standardized"]["model"]["name"] == \
        "moonshotai/Kimi-K3"
    assert engine["standardized"]["accelerator"] == {"model": "NVIDIA H20", "count": 16, "parallelism": {
        "tp": 16, "dp": 1, "dp_local": 1, "workers": 2, "ep": 16, "pp": 1}}
    load = doc["scenario"]["load"]["standardized"]
    assert load["tool"] == "vllm-benchmark" and load["concurrency"] == 16 and load["source"] == "random"
    assert load["input_seq_len"] == {"distribution": "fixed", "value": 1024} and "prefix" not in load
    obs = doc["results"]["observability"]["components"][0]
    assert obs["component_label"] == "sglang" and obs["aggregate"]["kv_cache_usage"] == \
        {"units": "fraction", "mean": 0.41, "max": 0.52}
    # one uid per round, the same on every export of it
    assert dump(round_report(_row(round=3), stack))["run"]["uid"] != doc["run"]["uid"]
    assert dump(round_report(_row(), stack))["run"]["uid"] == doc["run"]["uid"]
    # a prefix case: one shared prefix before every prompt
    pre = dump(round_report(_row(prefix_len=512), stack))["scenario"]["load"]["standardized"]["prefix"]
    assert pre == {"prefix_len": {"distribution": "fixed", "value": 512}, "num_groups": 1,
                   "num_users_per_group": 16, "num_prefixes": 1}


def _bad(doc: dict, path: str, value) -> dict:
    doc = copy.deepcopy(doc)
    *parents, last = path.split(".")
    node = doc
    for p in parents:
        node = node[int(p)] if p.isdigit() else node[p]
    if value is KeyError:
        del node[last]
    else:
        node[last] = value
    return doc


@pytest.mark.parametrize("path,value", [
    ("run.uid", KeyError),                                              # the one required run field
    ("results", KeyError),
    ("version", "0.3"),
    ("extra", 1),                                                       # extra fields are forbidden
    ("results.request_performance.aggregate.latency.time_per_output_token.units", "ms"),   # TPOT is ms/token
    ("results.request_performance.aggregate.latency.time_to_first_token.units", "ms/token"),
    ("results.request_performance.aggregate.throughput.request_rate.units", "tokens/s"),
    ("results.request_performance.aggregate.latency.time_to_first_token.mean", KeyError),  # a statistic has a mean
    ("results.request_performance.aggregate.latency.time_to_first_token.stddev", -1.0),
    ("results.request_performance.aggregate.requests.total", KeyError),
    ("scenario.load.standardized.concurrency", 0),
    ("scenario.load.standardized.source", "synthetic"),
    ("scenario.stack.0.standardized.role", "leader"),
    ("scenario.stack.0.standardized.replicas", 0),
    ("scenario.stack.0.metadata.cfg_id", KeyError),
    ("results.observability.components.0.component_label", "vllm"),    # not in the stack
    ("results.observability.components.0.aggregate.kv_cache_usage.units", "GiB"),
])
def test_the_model_refuses_what_the_schema_refuses(path, value):
    doc = dump(round_report(_row(), stack_of(load_profile("kimi-k3-h20"))))
    BenchmarkReportV02.model_validate(doc)
    with pytest.raises(ValidationError):
        BenchmarkReportV02.model_validate(_bad(doc, path, value))


def test_a_round_without_the_clients_means_has_no_latency_block():
    row = {k: v for k, v in _row().items() if not k.startswith(("mean_", "std_"))}
    doc = dump(round_report(row, None))
    assert "latency" not in doc["results"]["request_performance"]["aggregate"]
    assert "stack" not in doc["scenario"] and "observability" not in doc["results"]


def test_write_round_reports_one_file_per_round(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "sglang" / "perf").mkdir(parents=True)
    (run_dir / "sglang" / "perf" / "rounds.json").write_text(json.dumps([_row(round=r) for r in (1, 2, 3)]))
    (run_dir / "vllm" / "perf").mkdir(parents=True)
    (run_dir / "vllm" / "perf" / "rounds.json").write_text("[{\"engine\": \"vllm\", \"case\": \"c2\", \"round\": 1, "
                                                           "\"concurrency\": 2, \"num_prompts\": -1}]")
    files, problems = write_round_reports(run_dir, stack_of(load_profile("kimi-k3-h20")))
    assert [f.name for f in files] == [f"benchmark_report_v0.2,_sglang_c16-1k-1k_baseline_measure_round{r}.yaml"
                                       for r in (1, 2, 3)]
    assert {f.parent for f in files} == {run_dir / REPORTS_DIR}
    assert sorted(run_dir.joinpath(REPORTS_DIR).glob("benchmark_report_v0.2,_*.yaml")) == files  # their tools' glob
    assert len(read_reports(files)) == 3 and yaml.safe_load(files[0].read_text())["version"] == "0.2"
    assert len(problems) == 1 and problems[0].startswith("vllm/perf/rounds.json vllm/c2 round 1:")


def test_the_report_step_writes_the_history_page_and_the_reports(tmp_path):
    from gauntlet.steps.evidence.results import append_rounds
    from gauntlet.steps.gates import report as report_step
    from gauntlet.steps.runner import run_step

    run_dir = tmp_path / "run"
    (run_dir / "vllm" / "perf").mkdir(parents=True)
    rows = [_row(profile="local-cpu", engine="vllm", case="c2-128-32", run_id=f"n{i}", round=r,
                 timestamp=f"2026-12-0{i + 1}T02:00:00") for i in range(3) for r in (1, 2, 3)]
    (run_dir / "vllm" / "perf" / "rounds.json").write_text(json.dumps([r for r in rows if r["run_id"] == "n2"]))
    append_rounds(rows, tmp_path / "results")
    args = argparse.Namespace(profile="local-cpu", out=str(run_dir / "report"), run_dir=run_dir,
                              results_uri=str(tmp_path / "results"), regress_verdict=None)
    assert run_step(report_step, args) == 0
    v = json.loads((run_dir / "report" / "verdict.json").read_text())
    checks = {c["name"]: c for c in v["checks"]}
    assert checks["benchmark-report"]["status"] == "pass" and checks["benchmark-report"]["observed"] == \
        "3 written, 0 not"
    assert "[Nightly history](history.html)" in (run_dir / "report.md").read_text()
    page = (run_dir / "history.html").read_text()
    assert 'data-case="c2-128-32"' in page and page.count('data-verdict="insufficient data"') == 5 * 3
    for where in (run_dir, run_dir / "report"):        # the run directory, and the step's own artifact
        assert (where / "history.html").is_file() and len(list((where / REPORTS_DIR).glob("*.yaml"))) == 3
