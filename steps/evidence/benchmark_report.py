"""Each measured round as a Benchmark Report v0.2: the common result format of llm-d-benchmark, which its
harnesses (inference-perf, vllm-benchmark, guidellm, aiperf) write and its analysis tools read.

The schema is theirs; the models below are our own statement of it, field for field where we fill a field and
for every field it requires, with their constraints (``extra`` forbidden, the units each statistic may take, the
bounds). Source: llm-d/llm-d-benchmark at commit 8bc9f1ddd873a24f1657d6cca2e0d0fb6947dd36,
``llmdbenchmark/analysis/benchmark_report/schema_v0_2.py`` (``BenchmarkReportV02``), ``schema_v0_2_components.py``
(``InferenceEngine``) and ``base.py`` (``Units``). Their dump is ``model_dump(mode="json", exclude_none=True)``
to YAML, one report per file named ``benchmark_report_v0.2,_<name>.yaml`` (what their tools glob): so is ours.

What a round fills: ``run`` (a stable uid per round, the gauntlet run as the experiment id, the round's window),
``scenario.stack`` (the engine: image, args hash, model, accelerators and parallelism), ``scenario.load`` (the
client, the case's fixed input / output / prefix lengths and concurrency), ``results.request_performance`` (the
client's counts, latencies and rates) and ``results.observability`` (the engine's KV-cache usage and prefix-cache
hit rate, the GPUs' utilisation). A statistic needs a mean in the schema: the client's latency means and standard
deviations are kept from its JSON (steps/client/bench.py ``LATENCY_MOMENTS``); a round recorded before they were
has no latency block rather than a made-up mean. :func:`round_report` is pure; :func:`write_round_reports` does
the I/O.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from gauntlet.steps.evidence.runmeta import topology_parts

__all__ = ["VERSION", "SOURCE", "BenchmarkReportV02", "Stack", "stack_of", "round_report", "dump", "file_name",
           "write_round_reports", "REPORTS_DIR"]

VERSION: Literal["0.2"] = "0.2"
SOURCE = "llm-d/llm-d-benchmark@8bc9f1ddd873a24f1657d6cca2e0d0fb6947dd36"
REPORTS_DIR = "benchmark-reports"
# their WorkloadGenerator's name for vLLM's bench serve (base.py VLLM_BENCHMARK)
CLIENT_TOOL = {"vllm-bench-serve": "vllm-benchmark"}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---- statistics, by the units each may take (base.py UNITS_*) --------------------------------------------------

class _Stat(_Model):
    mean: float
    stddev: float | None = Field(None, ge=0)
    min: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    max: float | None = None


class QuantityStat(_Stat):
    units: Literal["count", "pixels"]


class TimeStat(_Stat):
    units: Literal["ms", "s"]


class GenLatencyStat(_Stat):
    units: Literal["ms/token", "s/token"]


class TokenRateStat(_Stat):
    units: Literal["tokens/s"]


class RequestRateStat(_Stat):
    units: Literal["queries/s"]


class PortionStat(_Stat):
    units: Literal["percent", "fraction"]


# ---- run ---------------------------------------------------------------------------------------------------

class RunTime(_Model):
    start: datetime | None = None
    end: datetime | None = None
    duration: str | None = None            # ISO-8601 duration


class Run(_Model):
    uid: str
    eid: str | None = None
    cid: str | None = None
    pid: str | None = None
    time: RunTime | None = None
    user: str | None = None
    description: str | None = None
    keywords: list[str] | None = None


# ---- scenario: the stack (schema_v0_2_components.py) and the load ------------------------------------------

class ComponentMetadata(_Model):
    schema_version: str = "0.0.1"
    label: str
    cfg_id: str
    description: str | None = None


class Parallelism(_Model):
    tp: int = Field(1, ge=0)
    dp: int = Field(1, ge=0)
    dp_local: int = Field(1, ge=0)
    workers: int = Field(1, ge=0)
    ep: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)


class Accelerator(_Model):
    model: str
    count: int = Field(..., ge=0)
    parallelism: Parallelism


class EngineModel(_Model):
    name: str


class InferenceEngine(_Model):
    kind: Literal["inference_engine"] = "inference_engine"
    tool: str
    tool_version: str
    role: Literal["replica", "prefill", "decode"]
    replicas: int = Field(..., ge=1)
    model: EngineModel
    accelerator: Accelerator


class Native(_Model):
    args: dict[str, Any] | None = None
    envars: dict[str, Any] | None = None
    config: Any | None = None


class Component(_Model):
    metadata: ComponentMetadata
    standardized: InferenceEngine
    native: Native


class LoadMetadata(_Model):
    schema_version: str = "0.0.1"
    cfg_id: str | None = None
    description: str | None = None


class SequenceLength(_Model):
    distribution: Literal["fixed", "gaussian", "uniform", "other"]
    value: float = Field(..., ge=0)
    std_dev: float | None = Field(None, ge=0)
    min: int | None = Field(None, ge=0)
    max: int | None = Field(None, ge=1)


class LoadPrefix(_Model):
    prefix_len: SequenceLength
    num_groups: int = Field(..., ge=1)
    num_users_per_group: int = Field(..., ge=1)
    num_prefixes: int = Field(..., ge=1)


class LoadStandardized(_Model):
    tool: str
    tool_version: str
    parallelism: int = Field(1, ge=1)
    source: Literal["random", "sampled", "unknown"]
    stage: int = Field(0, ge=0)
    input_seq_len: SequenceLength
    output_seq_len: SequenceLength | None = None
    prefix: LoadPrefix | None = None
    rate_qps: float | None = Field(None, gt=0)
    concurrency: int | None = Field(None, ge=1)


class Load(_Model):
    metadata: LoadMetadata
    standardized: LoadStandardized
    native: Native


class Scenario(_Model):
    stack: list[Component] | None = None
    load: Load | None = None


# ---- results -----------------------------------------------------------------------------------------------

class Requests(_Model):
    total: int = Field(..., ge=0)
    failures: int | None = Field(None, ge=0)
    incomplete: int | None = Field(None, ge=0)
    input_length: QuantityStat | None = None
    output_length: QuantityStat | None = None


class Latency(_Model):
    time_to_first_token: TimeStat | None = None
    normalized_time_per_output_token: GenLatencyStat | None = None
    time_per_output_token: GenLatencyStat | None = None
    inter_token_latency: GenLatencyStat | None = None
    request_latency: TimeStat | None = None


class Throughput(_Model):
    input_token_rate: TokenRateStat | None = None
    output_token_rate: TokenRateStat | None = None
    total_token_rate: TokenRateStat | None = None
    request_rate: RequestRateStat | None = None


class Aggregate(_Model):
    requests: Requests | None = None
    latency: Latency | None = None
    throughput: Throughput | None = None


class RequestPerformance(_Model):
    aggregate: Aggregate | None = None


class ResourceMetrics(_Model):
    kv_cache_usage: PortionStat | None = None
    cache_hit_rate: PortionStat | None = None
    gpu_utilization: PortionStat | None = None


class ComponentObservability(_Model):
    component_label: str
    replica_id: str | None = None
    aggregate: ResourceMetrics | None = None


class Observability(_Model):
    model_config = ConfigDict(extra="allow")     # theirs too: ad-hoc metric keys are allowed here
    components: list[ComponentObservability] | None = None


class Results(_Model):
    request_performance: RequestPerformance | None = None
    observability: Observability | None = None


class BenchmarkReportV02(_Model):
    version: Literal["0.2"] = VERSION
    run: Run
    scenario: Scenario | None = None
    results: Results

    @model_validator(mode="after")
    def _labels_known(self) -> BenchmarkReportV02:
        """An observability entry names a component of the stack (their component_label's meaning)."""
        labels = {c.metadata.label for c in (self.scenario.stack or [])} if self.scenario else set()
        obs = self.results.observability
        for c in (obs.components or []) if obs else []:
            if labels and c.component_label not in labels:
                raise ValueError(f"observability component {c.component_label!r} is not in the stack {sorted(labels)}")
        return self


# ---- the converter -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Stack:
    """What a round's row does not say about the engine's machine: from the profile (:func:`stack_of`)."""

    model: str                 # the model's id
    accelerator: str           # e.g. "NVIDIA H20"; "cpu" for a profile without GPUs
    gpus_per_node: int


def stack_of(profile: Any) -> Stack:
    hw = profile.hardware
    gpu = f"NVIDIA {hw.gpu_model}" if hw.gpu_model else ("cpu" if hw.gpus_per_node == 0 else "NVIDIA GPU")
    return Stack(profile.model.id, gpu, hw.gpus_per_node)


def _f(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _stat(units: str, mean: Any, **more: Any) -> dict[str, Any] | None:
    m = _f(mean)
    if m is None:
        return None
    return {"units": units, "mean": m, **{k: _f(v) for k, v in more.items() if _f(v) is not None}}


def _drop_none(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None and v != {}}


def _latency(row: Mapping[str, Any], m: str, units: str) -> dict[str, Any] | None:
    return _stat(units, row.get(f"mean_{m}_ms"), stddev=row.get(f"std_{m}_ms"), p50=row.get(f"p50_{m}_ms"),
                 p95=row.get(f"p95_{m}_ms"), p99=row.get(f"p99_{m}_ms"))


def round_uid(row: Mapping[str, Any]) -> str:
    key = "/".join(str(row.get(k)) for k in ("run_id", "engine", "case", "experiment", "phase", "round"))
    return uuid.uuid5(uuid.NAMESPACE_URL, f"gauntlet:{key}").hex


def round_report(row: Mapping[str, Any], stack: Stack | None = None) -> BenchmarkReportV02:
    """One round (a results-store row, or a perf gate's ``rounds.json`` entry) as a Benchmark Report v0.2
    (pure). ValueError (pydantic's ValidationError) when the row cannot make a valid report."""
    engine, case = str(row.get("engine")), str(row.get("case"))
    run: dict[str, Any] = {"uid": round_uid(row), "eid": row.get("run_id"), "cid": row.get("profile"),
                           "description": f"{stack.model if stack else row.get('model_fingerprint')} "
                                          f"[{row.get('run_id')} {engine}/{case} {row.get('experiment') or 'baseline'} "
                                          f"{row.get('phase') or 'measure'} round {row.get('round')}]"}
    window = row.get("window")
    duration = _f(row.get("duration_s"))
    when: dict[str, Any] = {"duration": f"PT{duration:.3f}S" if duration is not None else None}
    if isinstance(window, (list, tuple)) and len(window) == 2 and all(_f(t) is not None for t in window):
        when.update(start=datetime.fromtimestamp(float(window[0]), UTC), end=datetime.fromtimestamp(float(window[1]), UTC))
    run["time"] = _drop_none(when) or None

    scenario: dict[str, Any] = {}
    if stack is not None:
        par = topology_parts(str(row.get("topology") or ""))
        nodes = max(1, par.get("nodes", 1))
        scenario["stack"] = [{
            "metadata": {"label": engine, "cfg_id": str(row.get("args_hash") or "unknown"),
                         "description": row.get("image")},
            "standardized": {"tool": engine, "tool_version": str(row.get("image") or "unknown"), "role": "replica",
                             "replicas": 1, "model": {"name": stack.model},
                             "accelerator": {"model": stack.accelerator, "count": stack.gpus_per_node * nodes,
                                             "parallelism": {"tp": par.get("tp", 1), "dp": par.get("dp", 1),
                                                             "ep": par.get("ep", 1), "workers": nodes}}},
            "native": {"config": _drop_none({k: row.get(k) for k in (
                "image_digest", "args_hash", "model_fingerprint", "git_rev", "topology", "nodes", "driver",
                "context_length")})},
        }]
    conc = row.get("concurrency")
    prefix = int(row.get("prefix_len") or 0)
    client = str(row.get("client") or "unknown")
    scenario["load"] = {
        "metadata": {"cfg_id": row.get("requests_sha256"), "description": case},
        "standardized": _drop_none({
            "tool": CLIENT_TOOL.get(client, client), "tool_version": str(row.get("client_version") or "unknown"),
            "source": "random",
            "input_seq_len": {"distribution": "fixed", "value": int(row.get("input_len") or 0)},
            "output_seq_len": ({"distribution": "fixed", "value": int(row["output_len"])}
                               if row.get("output_len") else None),
            # vLLM's random dataset puts one prefix of this length before every prompt
            "prefix": ({"prefix_len": {"distribution": "fixed", "value": prefix}, "num_groups": 1,
                        "num_users_per_group": int(conc or 1), "num_prefixes": 1} if prefix else None),
            "concurrency": int(conc) if conc else None}),
        "native": {"config": _drop_none({k: row.get(k) for k in (
            "case", "experiment", "phase", "round", "seed", "valid", "invalid_reason", "num_prompts",
            "request_goodput", "slo_ttft_p99_ms", "slo_tpot_p99_ms", "slo_met")})},
    }

    completed = int(row.get("completed") or 0)
    total = int(row.get("num_prompts") or 0)
    failed = int(row.get("failed") or 0)
    requests = _drop_none({
        "total": total, "failures": failed, "incomplete": max(0, total - completed - failed),
        "input_length": _stat("count", row["total_input_tokens"] / completed) if completed and
        row.get("total_input_tokens") is not None else None,
        "output_length": _stat("count", row["total_output_tokens"] / completed) if completed and
        row.get("total_output_tokens") is not None else None})
    latency = _drop_none({"time_to_first_token": _latency(row, "ttft", "ms"),
                          "time_per_output_token": _latency(row, "tpot", "ms/token"),
                          "inter_token_latency": _latency(row, "itl", "ms/token"),
                          "request_latency": _latency(row, "e2el", "ms")})
    throughput = _drop_none({"input_token_rate": _stat("tokens/s", row.get("input_throughput")),
                             "output_token_rate": _stat("tokens/s", row.get("output_throughput")),
                             "total_token_rate": _stat("tokens/s", row.get("total_token_throughput")),
                             "request_rate": _stat("queries/s", row.get("request_throughput"))})
    results: dict[str, Any] = {"request_performance": {"aggregate": _drop_none(
        {"requests": requests, "latency": latency or None, "throughput": throughput or None})}}
    resources = _drop_none({
        "kv_cache_usage": _stat("fraction", row.get("engine_kv_usage_mean"), max=row.get("engine_kv_usage_max")),
        "cache_hit_rate": _stat("fraction", row.get("prefix_cache_hit_rate")),
        "gpu_utilization": _stat("percent", row.get("gpu_util_mean"))})
    if resources and stack is not None:
        results["observability"] = {"components": [{"component_label": engine, "aggregate": resources}]}
    return BenchmarkReportV02.model_validate({"run": _drop_none(run), "scenario": scenario, "results": results})


def dump(report: BenchmarkReportV02) -> dict[str, Any]:
    """The report as their tools read it: JSON types, unset fields left out."""
    return report.model_dump(mode="json", exclude_none=True)


def file_name(row: Mapping[str, Any]) -> str:
    parts = [row.get("engine"), row.get("case"), row.get("experiment") or "baseline", row.get("phase") or "measure",
             f"round{row.get('round')}"]
    return "benchmark_report_v0.2,_" + "_".join(re.sub(r"[^A-Za-z0-9.-]+", "-", str(p)) for p in parts) + ".yaml"


def write_round_reports(run_dir: Path, stack: Stack | None = None, out: Path | None = None
                        ) -> tuple[list[Path], list[str]]:
    """One report per round of every perf task's ``rounds.json`` under ``run_dir``, into ``out`` (default
    ``run_dir/benchmark-reports``). Returns (files written, one line per round or file that did not convert)."""
    out = Path(out) if out is not None else Path(run_dir) / REPORTS_DIR
    written: list[Path] = []
    problems: list[str] = []
    for src in sorted(Path(run_dir).rglob("rounds.json")):
        if out in src.parents:
            continue
        try:
            rows = json.loads(src.read_text())
        except (OSError, ValueError) as exc:
            problems.append(f"{src.relative_to(run_dir)}: does not read ({type(exc).__name__})")
            continue
        for row in rows if isinstance(rows, list) else []:
            if not isinstance(row, dict):
                continue
            try:
                doc = dump(round_report(row, stack))
            except ValueError as exc:
                first = str(exc).splitlines()
                problems.append(f"{src.relative_to(run_dir)} {row.get('engine')}/{row.get('case')} round "
                                f"{row.get('round')}: {' '.join(first[:3])[:300]}")
                continue
            out.mkdir(parents=True, exist_ok=True)
            path = out / file_name(row)
            path.write_text(yaml.safe_dump(doc, sort_keys=False))
            written.append(path)
    return written, problems


def read_reports(paths: Iterable[Path]) -> list[BenchmarkReportV02]:
    """The written reports read back and validated (their ``import_benchmark_report`` reads YAML the same way)."""
    return [BenchmarkReportV02.model_validate(yaml.safe_load(Path(p).read_text())) for p in paths]
