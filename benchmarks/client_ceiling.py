"""The bench client's own ceiling: the profile's cases against a zero-cost streaming server.

    .venv/bin/python benchmarks/client_ceiling.py --profile local-cpu --repeats 10

Each case is run ``repeats`` times with the pinned client (``vllm bench serve``, in process, as Gate 4
runs it) and the same requests (seed, lengths, prompts, concurrency) against steps/client/null_server.py on
loopback; prints the median output tokens/s with min-max. A measured case at half of this or more is
flagged client-bound (steps/evidence/stats.py ``client_bound``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gauntlet.params import load_profile  # noqa: E402
from gauntlet.steps.client.bench import BenchRequest, parse_result, preload_client, run_client  # noqa: E402
from gauntlet.steps.client.null_server import null_server  # noqa: E402
from gauntlet.steps.gates.perf import tokenizer_for  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", default="local-cpu")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--tokenizer", default=None)
    a = p.parse_args(argv)
    prof = load_profile(a.profile)
    tok = tokenizer_for(prof, a.tokenizer)
    preload_client()
    print("| case | prompts | concurrency | client ceiling, output tok/s: median [min–max] |")
    print("|---|---|---|---|")
    with null_server(prof.model.served_name) as url, tempfile.TemporaryDirectory() as tmp:
        for c in prof.bench.cases:
            n = c.num_prompts or prof.bench.prompts_per_concurrency * c.concurrency
            vals = []
            for i in range(a.repeats):
                req = BenchRequest(url, prof.model.served_name, tok, c.input_len, c.output_len, c.concurrency, n,
                                   prof.bench.seed, Path(tmp) / f"{c.name}-{i}.json")
                vals.append(parse_result(run_client(req).result, n)["output_throughput"])
            print(f"| {c.name} | {n} | {c.concurrency} | {statistics.median(vals):.0f} "
                  f"[{min(vals):.0f}–{max(vals):.0f}] |", flush=True)


if __name__ == "__main__":
    main()
