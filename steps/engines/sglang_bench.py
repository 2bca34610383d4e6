"""Gate 4's diagnostic client: SGLang's own ``sglang.bench_serving`` on the requests ``vllm bench serve`` sends.

It answers one question: does another client see the same engine? Its numbers are
never mixed with the pinned client's (the plan forbids mixing two clients' numbers):
they go to the verdict's ``metrics["diagnostics"]``, the results store's
``diagnostics`` table and a report section of their own.

The same requests, not similar ones: SGLang's ``random`` dataset would draw other
prompts, so the request set is sampled with vLLM's own dataset code exactly as
``vllm bench serve`` does for the round's argv (steps/client/request_set.py
``sample_requests``: the same parser, seeds, tokenizer, ``get_samples`` and prompt
alignment, and the digest each main round records), written as the
JSONL SGLang's ``custom`` dataset reads (one ``{"conversations": [{"content": prompt},
{"content": ""}]}`` a line), and replayed with ``--sharegpt-output-len`` fixing every
output length. SGLang shuffles the file by ``--seed`` and keeps every prompt of two
tokens or more, so it sends the same multiset of prompts in its own order; its
``vllm`` backend posts them to ``/v1/completions`` streamed with ``temperature 0``
and ``ignore_eos``, as the pinned client does.

Pure argv/parse functions, plus :func:`run_sglang_client`, the one place that runs
the client (a subprocess of a Python that has sglang; by default this one).
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gauntlet.contract import TransientError, UsageError
from gauntlet.steps.client.bench import BenchRequest, client_available, client_version, run_logged
from gauntlet.steps.client.http import EngineClient, normalize_endpoint
from gauntlet.steps.client.request_set import Sample, requests_digest, sample_requests

__all__ = ["CLIENT", "DIAGNOSTIC_CLIENTS", "SglangRun", "dataset_lines", "sglang_argv", "parse_sglang_result",
           "sglang_missing", "run_sglang_client"]

CLIENT = "sglang-bench-serving"            # its label: the results store's `client`, the verdict's key
DIAGNOSTIC_CLIENTS = (CLIENT,)
MODULE = "sglang.bench_serving"
MIN_OUTPUT_LEN = 4                         # sglang's custom dataset refuses a fixed output length below 4

# sglang's summary keys -> the round record's (vllm bench serve's) names
_PERCENTILES = {"p50": "median", "p95": "p95", "p99": "p99"}
_LATENCIES = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2el": "e2e_latency"}


@dataclass
class SglangRun:
    record: dict[str, Any]
    client_s: float
    log_path: Path
    dataset_path: Path
    result_path: Path


def dataset_lines(samples: Sequence[Sample]) -> list[str]:
    """SGLang's ``custom`` dataset JSONL, one request a line (pure)."""
    return [json.dumps({"conversations": [{"content": s.prompt}, {"content": ""}]}) for s in samples]


def sglang_argv(req: BenchRequest, dataset_path: Path, result_path: Path) -> list[str]:
    """``python -m sglang.bench_serving`` arguments replaying the dataset file (pure).

    ``--model`` is the tokenizer path and ``--served-model-name`` the name the requests carry: the
    client then checks the chat template on the local tokenizer, never on a hub name.
    ``--warmup-requests 0`` and ``--ready-check-timeout-sec 0`` as the pinned client's
    ``--ready-check-timeout-sec 0``: every request sent is a measured one.
    """
    if req.output_len < MIN_OUTPUT_LEN:
        raise UsageError(f"output_len {req.output_len}: sglang.bench_serving's custom dataset needs a fixed "
                         f"output length of at least {MIN_OUTPUT_LEN}")
    argv = [
        "--backend", "vllm", "--base-url", normalize_endpoint(req.base_url, "--base-url"),
        "--model", req.tokenizer, "--served-model-name", req.model, "--tokenizer", req.tokenizer,
        "--dataset-name", "custom", "--dataset-path", str(dataset_path),
        "--num-prompts", str(req.num_prompts), "--sharegpt-output-len", str(req.output_len),
        "--max-concurrency", str(req.concurrency), "--request-rate", "inf", "--seed", str(req.seed),
        "--warmup-requests", "0", "--ready-check-timeout-sec", "0",
        "--output-file", str(result_path), "--output-details", "--disable-tqdm",
    ]
    if not req.keep_alive:    # as the pinned client (steps/client/bench.py)
        argv += ["--header", "Connection=close"]
    return argv


def parse_sglang_result(result: Mapping[str, Any], num_prompts: int) -> dict[str, Any]:
    """One record in the pinned client's round shape (``steps.client.bench.parse_result``) from
    ``sglang.bench_serving``'s output line; metrics it does not write are None (pure)."""
    completed = int(result.get("completed") or 0)
    errors = result.get("errors")
    failed = sum(1 for e in errors if e) if isinstance(errors, list) else num_prompts - completed
    duration = _num(result.get("duration")) or 0.0
    rec: dict[str, Any] = {
        "num_prompts": num_prompts,
        "completed": completed,
        "failed": int(failed),
        "success_rate": completed / num_prompts if num_prompts else 0.0,
        "duration_s": duration,
        "total_input_tokens": int(result.get("total_input_tokens") or 0),
        "total_output_tokens": int(result.get("total_output_tokens") or 0),
        "request_throughput": _num(result.get("request_throughput")),
        "input_throughput": _num(result.get("input_throughput")),
        "output_throughput": _num(result.get("output_throughput")),
        "total_token_throughput": _num(result.get("total_throughput")),
        "max_concurrency": result.get("max_concurrency"),
    }
    for ours, theirs in _LATENCIES.items():
        for p, key in _PERCENTILES.items():
            rec[f"{p}_{ours}_ms"] = _num(result.get(f"{key}_{theirs}_ms"))
    first = next((str(e) for e in errors if e), "") if isinstance(errors, list) else ""
    rec["first_error"] = (first.strip().splitlines() or [""])[-1][:200] or None
    return rec


def sglang_missing(python: str) -> str | None:
    """Why ``python`` cannot run the client (None when it can); one line."""
    probe = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('sglang') else 3)"
    try:
        proc = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=60, check=False)
    except FileNotFoundError:
        return f"diagnostic python {python!r} not found"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"diagnostic python {python!r} did not start: {type(exc).__name__}"
    if proc.returncode == 3:
        return f"sglang is not importable by {python} (install it there, or pass --diagnostic-python)"
    if proc.returncode != 0:
        return f"diagnostic python {python!r} exited {proc.returncode}: {_last_line(proc.stderr)}"
    return None


def sglang_version(python: str) -> str:
    if python == sys.executable:
        try:
            return f"sglang {importlib.metadata.version('sglang')}"
        except importlib.metadata.PackageNotFoundError:
            return "unknown"
    probe = "import importlib.metadata as m; print(m.version('sglang'))"
    try:
        out = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return f"sglang {out.stdout.strip()}" if out.returncode == 0 and out.stdout.strip() else "unknown"


def run_sglang_client(req: BenchRequest, *, python: str | None = None, timeout_s: float | None = None,
                      samples: Sequence[Sample] | None = None) -> SglangRun:
    """Sample ``req``'s requests (vLLM's code), replay them with ``sglang.bench_serving`` and parse its result.

    Files: ``req.result_path`` (the client's output line), beside it ``<stem>-requests.jsonl`` (the
    requests replayed) and ``<stem>.log``. A missing sglang or Python is a UsageError, a
    client that fails a TransientError: each one line naming the cause.
    """
    start = time.perf_counter()
    python = python or sys.executable
    if samples is None and not client_available():
        raise UsageError("vLLM is not importable in this interpreter: the diagnostic draws its requests with "
                         "vLLM's own dataset code")
    missing = sglang_missing(python)
    if missing:
        raise UsageError(missing)
    unreachable = _unreachable(req.base_url)
    if unreachable:           # otherwise sglang fails every request, then crashes on empty percentiles
        raise TransientError(unreachable)
    result = Path(req.result_path)
    dataset, log = result.with_name(f"{result.stem}-requests.jsonl"), result.with_suffix(".log")
    dataset.parent.mkdir(parents=True, exist_ok=True)
    samples = sample_requests(req) if samples is None else samples
    if len(samples) != req.num_prompts or any(s.output_len != req.output_len for s in samples):
        raise UsageError(f"vLLM sampled {len(samples)} requests of output lengths "
                         f"{sorted({s.output_len for s in samples})}; the replay needs {req.num_prompts} of "
                         f"{req.output_len}")
    dataset.write_text("\n".join(dataset_lines(samples)) + "\n")
    argv = sglang_argv(req, dataset, result)
    result.unlink(missing_ok=True)               # the client appends to its output file
    rc, client_s = run_logged([python, "-m", MODULE, *argv], log, "diagnostic", timeout_s)
    if rc != 0:
        text = log.read_text(errors="replace")
        why = "every request failed" if "All requests failed" in text else _last_line(text)
        raise TransientError(f"{MODULE} exited {rc}: {why}; log: {log}")
    try:
        line = [x for x in result.read_text().splitlines() if x.strip()][-1]
        raw = json.loads(line)
    except (OSError, ValueError, IndexError) as exc:
        raise TransientError(f"{MODULE} wrote no result ({type(exc).__name__}); log: {log}") from None
    rec = parse_sglang_result(raw, req.num_prompts)
    # client_s: the subprocess (its imports included); wall_s: the whole diagnostic (probe, sampling, client)
    rec.update(client=CLIENT, client_version=sglang_version(python), client_s=round(client_s, 3),
               wall_s=round(time.perf_counter() - start, 3),
               seed=req.seed, requests_sha256=requests_digest(samples),
               requests_sampled_by=client_version())
    return SglangRun(rec, client_s, log, dataset, result)


def _unreachable(base_url: str, timeout_s: float = 10.0) -> str | None:
    """Why nothing answers HTTP at ``base_url`` (None when something does, whatever the status)."""
    with EngineClient(base_url, timeout_s) as client:
        ex = client.models()
    return None if ex.reached else f"no answer from {client.url('/v1/models')}: {ex.error}"


def _last_line(text: str) -> str:
    lines = [x.strip() for x in (text or "").splitlines() if x.strip()]
    return (lines[-1] if lines else "(no output)")[:200]


def _num(v: Any) -> float | None:
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        return None
