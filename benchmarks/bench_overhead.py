"""The bench wrapper's cost against the client's own time, from a real perf verdict.

    gauntlet step perf --profile local-cpu --out /tmp/ovh/run/vllm/perf --engine vllm \
        --endpoint http://127.0.0.1:8791 --cases c2-128-32 --no-store
    .venv/bin/python benchmarks/bench_overhead.py /tmp/ovh/run/vllm/perf/verdict.json

Per round: ``client_s`` is the time inside ``vllm.benchmarks.serve.main`` (what
``vllm bench serve`` itself spends once started); ``wall_s`` is the whole wrapped
round: sampler start/stop (/proc, /metrics), argv, the client, reading and
judging its JSON. Overhead = (wall_s - client_s) / client_s.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(path: str) -> None:
    v = json.loads(Path(path).read_text())
    rows = []
    for name, c in v["metrics"]["cases"].items():
        for r in [c.get("warmup"), *c["rounds"]]:
            if r:
                rows.append((name, r.get("round", "warmup"), r["client_s"], r["wall_s"]))
    for name, rnd, client, wall in rows:
        print(f"{name} round {rnd}: client {client:.3f} s, wrapped {wall:.3f} s, "
              f"overhead {wall - client:.3f} s ({(wall - client) / client:.2%})")
    tc = sum(r[2] for r in rows)
    tw = sum(r[3] for r in rows)
    print(f"total: client {tc:.2f} s, wrapped {tw:.2f} s, overhead {(tw - tc) / tc:.2%} "
          f"(max round {max((r[3] - r[2]) / r[2] for r in rows):.2%})")


if __name__ == "__main__":
    main(sys.argv[1])
