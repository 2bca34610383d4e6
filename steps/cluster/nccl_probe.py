"""The collective probe that runs inside the engine image: all-reduce and all-to-all over sizes.

Self-contained on purpose (standard library + torch, nothing from gauntlet): the network
gate ships this file's source into the engine image's pod and runs it with ``torchrun``
under the engine's exact NCCL/GLOO environment. Run it as::

    torchrun --nproc-per-node 8 steps/cluster/nccl_probe.py --sizes 1048576,268435456 --out result.json

Rank 0 prints one line ``GAUNTLET_NCCL_RESULT {json}`` (the step reads it from the pod
log) and writes ``--out`` when given. Bandwidths follow nccl-tests (doc/PERFORMANCE.md):
algbw = bytes / time; busbw = algbw * 2(n-1)/n for all-reduce, * (n-1)/n for all-to-all,
all-gather and reduce-scatter. Every result is checked against the value it must have.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys
import time
from typing import Any

RESULT_PREFIX = "GAUNTLET_NCCL_RESULT "
OPS = ("all_reduce", "all_to_all")

__all__ = ["RESULT_PREFIX", "OPS", "bus_factor", "busbw", "expected_all_reduce", "expected_all_to_all",
           "run_probe", "nccl_transports", "parse_result_line", "parse_nccl_tests", "main"]


def bus_factor(op: str, nranks: int) -> float:
    """nccl-tests' busbw/algbw factor for an op on n ranks."""
    n = nranks
    if op in ("all_reduce", "allreduce"):
        return 2 * (n - 1) / n
    if op in ("all_to_all", "alltoall", "all_gather", "allgather", "reduce_scatter", "reducescatter"):
        return (n - 1) / n
    if op in ("broadcast", "reduce", "sendrecv"):
        return 1.0
    raise ValueError(f"unknown collective {op!r}")


def busbw(op: str, nbytes: int, seconds: float, nranks: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes) for `nbytes` per rank moved in `seconds`."""
    alg = nbytes / seconds / 1e9
    return alg, alg * bus_factor(op, nranks)


# Values are small integers in float32, so every sum is exact and a wrong or missing
# contribution shows as a wrong number, not as rounding.
def _pattern(torch: Any, numel: int, device: Any) -> Any:
    return (torch.arange(numel, device=device, dtype=torch.int64) % 7).to(torch.float32)


def expected_all_reduce(rank_values: list[int], pattern_value: int) -> float:
    """All-reduce(sum) of (r + 1) + pattern on every rank: sum(r + 1) + n * pattern."""
    return float(sum(rank_values) + len(rank_values) * pattern_value)


def expected_all_to_all(src_rank: int, dst_rank: int, nranks: int) -> float:
    """All-to-all: the chunk rank `src` sends to rank `dst` holds src * n + dst."""
    return float(src_rank * nranks + dst_rank)


def _timed(torch: Any, dist: Any, fn: Any, iters: int, warmup: int, cuda: bool) -> float:
    """Mean seconds per call on this rank, then the slowest rank's (what the collective really cost)."""
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    if cuda:
        torch.cuda.synchronize()
    dt = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64,
                      device="cuda" if cuda else "cpu")
    dist.all_reduce(dt, op=dist.ReduceOp.MAX)
    return float(dt.item())


def _check_all_reduce(torch: Any, dist: Any, numel: int, device: Any, rank: int, n: int) -> tuple[bool, str]:
    pat = _pattern(torch, numel, device)
    x = pat + (rank + 1)
    dist.all_reduce(x)
    want = pat * n + n * (n + 1) / 2
    bad = int((x != want).sum().item())
    return bad == 0, "" if bad == 0 else f"{bad} of {numel} elements wrong (first got {x[(x != want)][0].item()})"


def _check_all_to_all(torch: Any, dist: Any, numel: int, device: Any, rank: int, n: int) -> tuple[bool, str]:
    chunk = numel // n
    send = torch.cat([torch.full((chunk,), expected_all_to_all(rank, j, n), device=device) for j in range(n)])
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    want = torch.cat([torch.full((chunk,), expected_all_to_all(k, rank, n), device=device) for k in range(n)])
    bad = int((recv != want).sum().item())
    return bad == 0, "" if bad == 0 else f"{bad} of {numel} elements wrong"


def run_probe(sizes: list[int], iters: int = 20, warmup: int = 5, ops: tuple[str, ...] = OPS) -> dict[str, Any]:
    """Run inside an initialised (or initialisable, from torchrun's env) process group; rank 0's view."""
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available() and os.environ.get("GAUNTLET_PROBE_DEVICE", "cuda") != "cpu"
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if not dist.is_initialized():
        if cuda:
            torch.cuda.set_device(device)
            dist.init_process_group("nccl", device_id=device)
        else:
            dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    rows = []
    for op in ops:
        for size in sizes:
            numel = max(n, size // 4) // n * n          # float32 elements, divisible by n for all-to-all
            nbytes = numel * 4
            ok, why = (_check_all_reduce if op == "all_reduce" else _check_all_to_all)(torch, dist, numel, device,
                                                                                      rank, n)
            oks = torch.tensor([1 if ok else 0], device=device)
            dist.all_reduce(oks, op=dist.ReduceOp.MIN)
            if op == "all_reduce":
                buf = torch.ones(numel, device=device)
                fn = functools.partial(dist.all_reduce, buf)
            else:
                src, dst = torch.ones(numel, device=device), torch.empty(numel, device=device)
                fn = functools.partial(dist.all_to_all_single, dst, src)
            secs = _timed(torch, dist, fn, iters, warmup, cuda)
            alg, bus = busbw(op, nbytes, secs, n)
            rows.append({"op": op, "bytes": nbytes, "time_us": secs * 1e6, "algbw_gbps": alg, "busbw_gbps": bus,
                         "correct": bool(oks.item()), "error": why or None})
    nccl_version = None
    if cuda:
        try:
            nccl_version = ".".join(str(x) for x in torch.cuda.nccl.version())
        except Exception:  # version is evidence only
            nccl_version = None
    result = {"world_size": n, "backend": dist.get_backend(), "device": str(device.type),
              "gpu": torch.cuda.get_device_name(local) if cuda else None, "torch": torch.__version__,
              "nccl": nccl_version, "hostname": os.uname().nodename,
              "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(("NCCL_", "GLOO_", "TORCH_NCCL"))},
              "results": rows}
    dist.barrier()
    dist.destroy_process_group()
    return result if rank == 0 else {}


_VIA = re.compile(r"NCCL INFO Channel \S+ : \d+\[[^\]]*\] -> \d+\[[^\]]*\](?: \[\w+\])? via (\S+)")
_NET = re.compile(r"NCCL INFO Using network (\S+)")


def nccl_transports(log: str) -> dict[str, int]:
    """What NCCL_DEBUG=INFO says the channels use: {'P2P/CUMEM': 24, 'NET/IB': 8, 'network:IB': 1, ...}."""
    seen: dict[str, int] = {}
    for m in _VIA.finditer(log):
        key = "/".join(m.group(1).split("/")[:2])
        seen[key] = seen.get(key, 0) + 1
    for m in _NET.finditer(log):
        key = f"network:{m.group(1)}"
        seen[key] = seen.get(key, 0) + 1
    return dict(sorted(seen.items()))


def parse_result_line(log: str) -> dict[str, Any] | None:
    """The probe's result from a pod log, or None when it never got that far."""
    for line in reversed(log.splitlines()):
        i = line.find(RESULT_PREFIX)
        if i >= 0:
            return json.loads(line[i + len(RESULT_PREFIX):])
    return None


_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\w+)\s+(\w+|-)\s+(-?\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)"
                  r"\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)")


def parse_nccl_tests(text: str) -> dict[str, Any]:
    """nccl-tests output (all_reduce_perf, alltoall_perf, ...): rows of out-of-place/in-place figures."""
    rows = []
    for line in text.splitlines():
        m = _ROW.match(line)
        if not m:
            continue
        g = m.groups()
        rows.append({"bytes": int(g[0]), "count": int(g[1]), "type": g[2], "redop": g[3],
                     "out_time_us": float(g[5]), "out_algbw_gbps": float(g[6]), "out_busbw_gbps": float(g[7]),
                     "out_wrong": None if g[8] == "N/A" else int(g[8]),
                     "in_time_us": float(g[9]), "in_algbw_gbps": float(g[10]), "in_busbw_gbps": float(g[11]),
                     "in_wrong": None if g[12] == "N/A" else int(g[12])})
    avg = re.search(r"Avg bus bandwidth\s*:\s*([\d.]+)", text)
    wrong = re.search(r"Out of bounds values\s*:\s*(\d+)", text)
    return {"rows": rows, "avg_busbw_gbps": float(avg.group(1)) if avg else None,
            "out_of_bounds": int(wrong.group(1)) if wrong else None}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="all-reduce and all-to-all probe (torch.distributed)")
    p.add_argument("--sizes", default="1048576,16777216,268435456", help="bytes per rank, comma-separated")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--out", default=None, help="rank 0 writes the result JSON here")
    a = p.parse_args(argv)
    res = run_probe([int(s) for s in a.sizes.split(",") if s], a.iters, a.warmup, tuple(a.ops.split(",")))
    if res:
        line = json.dumps(res, separators=(",", ":"))
        print(RESULT_PREFIX + line, flush=True)
        if a.out:
            with open(a.out, "w") as fh:
                fh.write(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
