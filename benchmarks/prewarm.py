"""Benchmark: prewarm of about 4 GB of dense shards against `cp -r` of the same files, side by side.

    .venv/bin/python benchmarks/prewarm.py [--gib 4] [--shards 16] [--streams 4] [--rounds 5] [--dir DIR]

1. Writes a dense synthetic Kimi-structured model (random bytes) of about ``--gib`` GiB in ``--shards`` shards.
2. Each round, in alternating order: ``cp -r SRC DST`` (timed alone, then ``sync`` timed after it, since
   prewarm fsyncs every file and cp does not) and the real ``gauntlet step prewarm --src SRC --dst DST``
   (copy, fsync, header verify, rename, marker). The source is read once before the rounds, so both read
   it from the page cache.
3. A second prewarm of the finished directory (nothing to copy) is timed too.
Throughput is source bytes / wall seconds (the whole `gauntlet step` process for prewarm: Python start,
source/destination reads, copy, verify, syncfs, marker; its copy phase alone is reported too). The ratio
is prewarm over ``cp -r`` + ``sync`` (both durable) and, for reference, over ``cp -r`` alone; medians and
best-of-rounds are both given because other work on the machine makes single rounds noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _timed(cmd: list[str] | str, **kw) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL, **kw)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", type=Path, default=None, help="scratch directory (default: a temp dir)")
    args = ap.parse_args()

    from gauntlet.params import load_profile
    from gauntlet.steps.model.synth import synth_from_profile

    kimi = load_profile("kimi-k3-h20")
    prof = kimi.model_copy(update={"model": kimi.model.model_copy(update={"shards": args.shards})})
    scratch = Path(tempfile.mkdtemp(prefix="gauntlet-bench-prewarm-", dir=args.dir))
    try:
        src = scratch / "src"
        t0 = time.perf_counter()
        synth_from_profile(prof, src, total_bytes=int(args.gib * (1 << 30)))
        total = sum(p.stat().st_size for p in src.iterdir() if p.is_file())
        print(f"wrote {total:,} bytes in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        subprocess.run(f"cat {src}/* > /dev/null", shell=True, check=True)  # both read from the page cache
        subprocess.run(["sync"], check=True)
        cp, cp_sync, pw, pw_copy = [], [], [], []
        step = [sys.executable, "-m", "gauntlet.workflows.cli", "step", "prewarm", "--profile", "kimi-k3-h20",
                "--src", str(src), "--streams", str(args.streams)]
        for r in range(args.rounds):
            order = ("cp", "prewarm") if r % 2 == 0 else ("prewarm", "cp")
            for what in order:
                dst = scratch / f"dst-{what}"
                shutil.rmtree(dst, ignore_errors=True)
                subprocess.run(["sync"], check=True)
                if what == "cp":
                    t = _timed(["cp", "-r", str(src), str(dst)])
                    s = _timed(["sync"])
                    cp.append(t)
                    cp_sync.append(t + s)
                else:
                    pw.append(_timed([*step, "--dst", str(dst), "--out", str(scratch / f"ev-{r}")]))
                    m = json.loads((scratch / f"ev-{r}" / "verdict.json").read_text())["metrics"]
                    pw_copy.append(m["copy_seconds"])
        again = [_timed([*step, "--dst", str(scratch / "dst-prewarm"), "--out", str(scratch / "ev-again")])
                 for _ in range(3)]
        v = json.loads((scratch / "ev-again" / "verdict.json").read_text())
        assert v["status"] == "pass" and v["metrics"]["files_to_copy"] == 0
        gbps = lambda secs: round(total / statistics.median(secs) / 1e9, 3)  # noqa: E731
        best = lambda secs: round(total / min(secs) / 1e9, 3)  # noqa: E731
        result = {
            "bytes": total, "files": len(list(src.iterdir())), "streams": args.streams, "rounds": args.rounds,
            "cp_r_s": [round(x, 2) for x in cp], "cp_r_plus_sync_s": [round(x, 2) for x in cp_sync],
            "prewarm_s": [round(x, 2) for x in pw], "prewarm_copy_phase_s": pw_copy,
            "throughput_gb_per_s_median": {"cp_r": gbps(cp), "cp_r_plus_sync": gbps(cp_sync), "prewarm": gbps(pw),
                                           "prewarm_copy_phase": gbps(pw_copy)},
            "throughput_gb_per_s_best": {"cp_r": best(cp), "cp_r_plus_sync": best(cp_sync), "prewarm": best(pw)},
            "ratio_prewarm_vs_cp_r_plus_sync_median": round(statistics.median(cp_sync) / statistics.median(pw), 3),
            "ratio_prewarm_vs_cp_r_plus_sync_best": round(min(cp_sync) / min(pw), 3),
            "ratio_prewarm_vs_cp_r_alone_median": round(statistics.median(cp) / statistics.median(pw), 3),
            "second_prewarm_s": [round(x, 3) for x in again],
            "load_average": os.getloadavg(), "cpus": os.cpu_count(),
        }
        print(json.dumps(result, indent=2))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
