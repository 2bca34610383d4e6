"""A known GPU load for the telemetry sampler: bf16 matmuls at several duty cycles, each holding its own memory.

Run beside ``python3 steps/cluster/telemetry.py serve --port P`` on a GPU machine; each phase lasts ``--phase-s``
seconds: duty 0 (nothing allocated), ~30 % (busy 30 ms of every 100 ms, 20 GiB held) and 100 % (busy
all the time, 60 GiB held). Afterwards it fetches the sampler's samples over HTTP for the whole window
and writes ``{"phases": [...], "telemetry": <the /samples answer>}`` to ``--out`` (docs/performance.md,
"Telemetry on a real H200").
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request

import torch

PHASES = ((0.0, 0), (0.3, 20), (1.0, 60))     # (duty, GiB held)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sampler", default="http://127.0.0.1:9401")
    ap.add_argument("--phase-s", type=float, default=20.0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    dev = torch.device("cuda")
    x = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    y = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    torch.cuda.synchronize()
    phases, t_start = [], time.time()
    for duty, gib in PHASES:
        held = torch.empty(gib * 2**30, dtype=torch.uint8, device=dev) if gib else None
        if held is not None:
            held.fill_(1)
        t0, matmuls = time.time(), 0
        while time.time() - t0 < a.phase_s:
            period_end = time.perf_counter() + 0.1
            busy_end = time.perf_counter() + 0.1 * duty
            while duty > 0 and time.perf_counter() < busy_end:
                for _ in range(4):
                    x @ y
                matmuls += 4
                torch.cuda.synchronize()
            rest = period_end - time.perf_counter()
            if rest > 0:
                time.sleep(rest)
        phases.append({"duty": duty, "held_gib": gib, "start": t0, "end": time.time(), "matmuls": matmuls,
                       "tflops": round(matmuls * 2 * 8192**3 / (time.time() - t0) / 1e12, 1)})
        del held
        torch.cuda.empty_cache()
    time.sleep(1.0)
    with urllib.request.urlopen(f"{a.sampler}/samples?since={t_start - 2}&until={time.time()}", timeout=30) as r:
        telemetry = json.loads(r.read())
    with open(a.out, "w") as fh:
        json.dump({"gpu": torch.cuda.get_device_name(0), "phases": phases, "telemetry": telemetry}, fh)
    for p in phases:
        s = [x for x in telemetry["samples"] if p["start"] + 2 <= x["t"] <= p["end"]]
        util = [g["util_pct"] for x in s for g in x["gpus"] if g["util_pct"] is not None]
        power = [g["power_w"] for x in s for g in x["gpus"] if g["power_w"] is not None]
        mem = [g["mem_used_mib"] for x in s for g in x["gpus"] if g["mem_used_mib"] is not None]
        print(f"duty {p['duty']:.0%} held {p['held_gib']} GiB: {len(s)} samples, util mean "
              f"{sum(util) / max(1, len(util)):.1f} %, power mean {sum(power) / max(1, len(power)):.0f} W "
              f"max {max(power, default=0):.0f} W, memory max {max(mem, default=0) / 1024:.1f} GiB, "
              f"{p['tflops']} TFLOP/s over the phase", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
