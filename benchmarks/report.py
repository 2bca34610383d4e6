"""Benchmark: the regression verdict and the report from 1,000 stored rounds (budget: 5 s).

    .venv/bin/python benchmarks/report.py [--rounds 1000] [--repeat 3]

Builds a results store of ``--rounds`` rounds (2 cases x 3 rounds a night,
values from the real bench fixture with the recorded local noise), a run
directory whose perf evidence is the last night, then times, end to end in a
fresh process each repeat: ``gauntlet step regress`` (reads the store, labels
every metric) and ``write_report`` (reads every verdict and the store, writes
report.md and four PNGs). Prints the median wall time of the repeats.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gauntlet.steps.client.bench import parse_result  # noqa: E402
from gauntlet.contract import Check, Verdict, now_iso  # noqa: E402
from gauntlet.steps.evidence.stats import stability  # noqa: E402
from gauntlet.steps.gates.perf import CaseResult  # noqa: E402
from gauntlet.steps.evidence.results import append_rounds  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "vllm-0.32.0-cpu/bench-serve-result.json"
NOISE = ROOT / "benchmarks" / "data" / "noise-local-cpu.json"
CASES = (("c2-128-32", 2), ("c4-128-32", 4))


def build(root: Path, n_rounds: int) -> tuple[Path, Path]:
    base = parse_result(json.loads(FIXTURE.read_text()))
    rel = [1.0]
    if NOISE.exists():
        pool = [r["output_throughput"] for r in json.loads(NOISE.read_text())["rounds"] if r["valid"]]
        med = sorted(pool)[len(pool) // 2]
        rel = [p / med for p in pool]
    rng = random.Random(0)
    rows = []
    for i in range(n_rounds):
        night, case_i, rnd = i // 6, (i // 3) % 2, i % 3 + 1
        f = rng.choice(rel)
        r = dict(base, output_throughput=base["output_throughput"] * f, request_throughput=base["request_throughput"] * f,
                 p99_ttft_ms=base["p99_ttft_ms"] / f)
        day = f"2026-{1 + night // 28 % 12:02d}-{1 + night % 28:02d}"
        rows.append(dict(r, run_id=f"night{night:04d}", profile="local-cpu", engine="vllm", date=day,
                         timestamp=f"{day}T02:{night % 60:02d}:00", client="vllm-bench-serve", args_hash="h",
                         image_digest="sha256:" + "0" * 64, experiment="baseline", phase="measure",
                         case=CASES[case_i][0], concurrency=CASES[case_i][1], round=rnd, valid=True))
    store = root / "store"
    # one append per night, as real runs do (one file per partition per run)
    by_night: dict[str, list[dict]] = {}
    for r in rows:
        by_night.setdefault(r["run_id"], []).append(r)
    for night_rows in by_night.values():
        append_rounds(night_rows, store)
    last = max(by_night)
    run_dir = root / "runs" / last
    cases = {}
    for name, conc in CASES:
        rs = [dict(r, resources={"headroom": 0.9, "gpu_source": "unavailable"}) for r in by_night[last]
              if r["case"] == name]
        cr = CaseResult(name, conc, 128, 32, 8, rs)
        cr.stability = stability(rs, 0.25, 3)
        cases[name] = cr.to_dict()
    for task, names in (("perf", ["c2-128-32"]), ("perf-c4-128-32", ["c4-128-32"])):
        d = run_dir / "vllm" / task
        Verdict.of("perf", now_iso(), [Check("rounds-valid", "pass")],
                   {"engine": "vllm", "cases": {n: cases[n] for n in names}}).write(d)
    json.dump([{"profile": "local-cpu"}], open(run_dir / "vllm" / "perf" / "rounds.json", "w"))
    return store, run_dir


TIMED = """
import sys, time
t0 = time.perf_counter()
from gauntlet.workflows.cli import main
rc = main(["step", "regress", "--profile", "local-cpu", "--out", sys.argv[2] + "/regress", "--results-uri", sys.argv[1]])
from gauntlet.steps.evidence.report import write_report
write_report(sys.argv[2], sys.argv[1])
print(f"{time.perf_counter() - t0:.3f} rc={rc}")
"""


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=1000)
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store, run_dir = build(Path(tmp), a.rounds)
        times = []
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            r = subprocess.run([sys.executable, "-c", TIMED, str(store), str(run_dir)], capture_output=True,
                               text=True, cwd=ROOT, check=True)
            wall = time.perf_counter() - t0
            inner = r.stdout.strip().splitlines()[-1]
            times.append(wall)
            print(f"regress + report, fresh process: {wall:.2f} s wall (in-process {inner})")
        labels = json.loads((run_dir / "regress" / "labels.json").read_text())["labels"]
        pngs = sorted(x.name for x in run_dir.glob("*.png"))
        print(f"{a.rounds} stored rounds, {len(labels)} labels, report.md {len((run_dir / 'report.md').read_text())} "
              f"chars, plots {pngs}")
        med = sorted(times)[len(times) // 2]
        print(f"median {med:.2f} s (budget 5 s): {'OK' if med <= 5 else 'OVER BUDGET'}")


if __name__ == "__main__":
    main()
