"""Evaluate the nightly regression rule on noise recorded from real local runs.

Record (real engine, real client, one case, N rounds)::

    .venv/bin/python benchmarks/regression_eval.py record --endpoint http://127.0.0.1:8791 \
        --rounds 40 --out benchmarks/data/noise-local-cpu.json

Evaluate (synthetic nights resampled from those rounds, injected changes)::

    .venv/bin/python benchmarks/regression_eval.py evaluate benchmarks/data/noise-local-cpu.json

A synthetic night is the median of ``rounds`` rounds drawn without replacement
from the recorded pool, exactly how a real night's value is formed; the last
night gets the injected change (throughput x (1 - drop), P99 TTFT x (1 + rise)).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from params import load_profile  # noqa: E402
from steps._bench import BenchRequest, parse_result, run_client  # noqa: E402
from steps._stats import median, round_validity  # noqa: E402
from steps.regress import METRICS, Rule, judge  # noqa: E402


def record(args: argparse.Namespace) -> None:
    profile = load_profile(args.profile)
    case = next(c for c in profile.bench.cases if c.name == args.case)
    n = case.num_prompts or profile.bench.prompts_per_concurrency * case.concurrency
    tok = str(Path(profile.model.host_cache_path).resolve())
    out = Path(args.out)
    rounds = []
    raw = Path(args.raw_dir)
    for i in range(args.rounds + 1):  # round 0 is the warmup, not kept
        req = BenchRequest(args.endpoint, profile.model.served_name, tok, case.input_len, case.output_len,
                           case.concurrency, n if i else profile.bench.warmup_prompts,
                           profile.bench.seed + (1000 if i == 0 else 0), raw / f"round{i}.json")
        run = run_client(req)
        rec = parse_result(run.result, req.num_prompts)
        ok, why = round_validity(rec, req.num_prompts)
        rec.update(valid=ok, client_s=run.client_s, wall_s=run.wall_s, t=time.time())
        if i:
            rounds.append(rec)
        print(f"round {i}: {rec['output_throughput']:.2f} tok/s p99 ttft {rec['p99_ttft_ms']:.0f} ms "
              f"({'valid' if ok else why})", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    keep = ("output_throughput", "request_throughput", "p99_ttft_ms", "p99_tpot_ms", "p99_e2el_ms",
            "p50_ttft_ms", "duration_s", "valid", "client_s", "wall_s", "t")
    doc = {"profile": profile.name, "case": case.name, "num_prompts": n, "endpoint": args.endpoint,
           "rounds": [{k: r.get(k) for k in keep} for r in rounds]}
    out.write_text(json.dumps(doc, indent=1))
    print(f"wrote {len(rounds)} rounds to {out}")


def _night(rng: random.Random, pool: list[dict], k: int, drop: float = 0.0, rise: float = 0.0) -> dict:
    picks = rng.sample(pool, k)
    night = {m: median(r[m] for r in picks) for m in METRICS}
    for m in ("output_throughput", "request_throughput"):
        night[m] *= 1 - drop
    night["p99_ttft_ms"] *= 1 + rise
    return night


def rates(pool: list[dict], rule: Rule, trials: int, k: int, drop: float = 0.0, rise: float = 0.0,
          target: str | None = None, seed: int = 0) -> float:
    """Fraction of trials flagged: any metric regressed (target None) or the target metric."""
    rng = random.Random(seed)
    hits = 0
    for _ in range(trials):
        hist = [_night(rng, pool, k) for _ in range(rule.window)]
        cur = _night(rng, pool, k, drop, rise)
        labels = judge({("e", "c"): cur}, {("e", "c"): hist}, rule)
        flagged = [lb.metric for lb in labels if lb.label == "regressed"]
        hits += bool(flagged) if target is None else (target in flagged)
    return hits / trials


def evaluate(args: argparse.Namespace) -> None:
    doc = json.loads(Path(args.noise).read_text())
    pool = [r for r in doc["rounds"] if r["valid"]]
    if args.shrink != 1.0:  # sensitivity: the same noise shape, `shrink` times its size
        med = {m: median(r[m] for r in pool) for m in METRICS}
        pool = [dict(r, **{m: med[m] + (r[m] - med[m]) * args.shrink for m in METRICS}) for r in pool]
        print(f"(deviations from the pool median scaled by {args.shrink})")
    tput = [r["output_throughput"] for r in pool]
    ttft = [r["p99_ttft_ms"] for r in pool]
    print(f"{len(pool)} valid real rounds of {doc['case']} ({doc['profile']}): output throughput median "
          f"{median(tput):.2f} tok/s, range {min(tput):.2f}-{max(tput):.2f} "
          f"({(max(tput) - min(tput)) / median(tput):.1%}); P99 TTFT median {median(ttft):.0f} ms, "
          f"range {min(ttft):.0f}-{max(ttft):.0f}")
    k = args.rounds_per_night
    print(f"\nrule: median ± max(k·1.4826·MAD, floor·median), trials {args.trials}, {k} rounds a night")
    print("| window (nights) | k | false alarm (no change, any metric) | 5% tput drop | 10% tput drop | "
          "P99 TTFT +25% | P99 TTFT +50% |")
    print("|---|---|---|---|---|---|---|")
    t0 = time.perf_counter()
    for window in (7, 14):
        for kk in (3.0,):
            rule = Rule(k=kk, window=window, min_history=window)
            fa = rates(pool, rule, args.trials, k, seed=1)
            d5 = rates(pool, rule, args.trials, k, drop=0.05, target="output_throughput", seed=2)
            d10 = rates(pool, rule, args.trials, k, drop=0.10, target="output_throughput", seed=3)
            r25 = rates(pool, rule, args.trials, k, rise=0.25, target="p99_ttft_ms", seed=4)
            r50 = rates(pool, rule, args.trials, k, rise=0.50, target="p99_ttft_ms", seed=5)
            fat = rates(pool, rule, args.trials, k, target="output_throughput", seed=1)
            print(f"| {window} | {kk:g} | {fa:.1%} (throughput alone {fat:.1%}) | {d5:.1%} | {d10:.1%} | "
                  f"{r25:.1%} | {r50:.1%} |")
    print(f"\n({time.perf_counter() - t0:.1f} s)")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("--endpoint", required=True)
    r.add_argument("--profile", default="local-cpu")
    r.add_argument("--case", default="c2-128-32")
    r.add_argument("--rounds", type=int, default=40)
    r.add_argument("--out", default="benchmarks/data/noise-local-cpu.json")
    r.add_argument("--raw-dir", default="/tmp/gauntlet-noise")
    e = sub.add_parser("evaluate")
    e.add_argument("noise")
    e.add_argument("--trials", type=int, default=2000)
    e.add_argument("--rounds-per-night", type=int, default=3)
    e.add_argument("--shrink", type=float, default=1.0, help="scale the recorded noise (sensitivity only)")
    a = p.parse_args(argv)
    record(a) if a.cmd == "record" else evaluate(a)


if __name__ == "__main__":
    main()
