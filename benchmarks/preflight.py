"""Benchmark: Gate 0 preflight on the 96-shard, 1.56 TB sparse Kimi K3 layout, and the ratio to sha256sum.

    .venv/bin/python benchmarks/preflight.py [--dir DIR] [--runs 5] [--slice-gib 2] [--per-expert]

1. Writes the sparse layout with ``gauntlet.steps.model.synth`` (unless ``--dir`` holds one).
2. Runs the real ``gauntlet step preflight --profile kimi-k3-h20`` as a subprocess ``--runs`` times and
   reports wall time (median, max) and the child's peak RSS (``os.wait4``), plus the in-process time of
   gather + judge alone.
3. sha256sum of the whole tree is estimated from a measured slice: ``sha256sum`` over ``--slice-gib`` GiB
   of real random bytes (page cache warm, so CPU bound: the best case for sha256sum) and over the same
   amount read from a sparse shard; the full-tree time is the slice time scaled by total bytes / slice
   bytes (sha256 is linear in bytes and single-threaded).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _run_child(cmd: list[str]) -> tuple[int, float, int]:
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, wall, ru.ru_maxrss * 1024


def _sha256sum_seconds(path: Path, nbytes: int) -> float:
    """sha256sum over the first nbytes of path (the whole file when it is that long)."""
    t0 = time.perf_counter()
    if path.stat().st_size == nbytes:
        subprocess.run(["sha256sum", str(path)], check=True, stdout=subprocess.DEVNULL)
    else:
        subprocess.run(f"head -c {nbytes} {path} | sha256sum > /dev/null", shell=True, check=True)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=None, help="where to write (or find) the sparse layout")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--slice-gib", type=float, default=2.0)
    ap.add_argument("--per-expert", action="store_true",
                    help="one tensor pair per expert (about 150k tensors, Kimi K2 style) instead of fused blocks")
    args = ap.parse_args()

    from gauntlet.params import load_profile
    from gauntlet.steps.gates.preflight import gather, judge
    from gauntlet.steps.model.synth import synth_from_profile

    profile = load_profile("kimi-k3-h20")
    tmp = tempfile.TemporaryDirectory(prefix="gauntlet-bench-preflight-")
    root = args.dir or Path(tmp.name) / "kimi-k3-sparse"
    if not (root / ".aik8s-complete").is_file():
        t0 = time.perf_counter()
        synth_from_profile(profile, root, sparse=True, per_expert=args.per_expert)
        print(f"wrote sparse layout in {time.perf_counter() - t0:.2f} s: {root}", file=sys.stderr)
    shards = sorted(root.glob("*.safetensors"))
    total = sum(p.stat().st_size for p in shards)
    on_disk = sum(p.stat().st_blocks * 512 for p in root.iterdir() if p.is_file())

    cmd = [sys.executable, "-m", "gauntlet.workflows.cli", "step", "preflight", "--profile", "kimi-k3-h20",
           "--model-path", str(root), "--out", str(Path(tmp.name) / "evidence")]
    walls, rss = [], []
    for _ in range(args.runs):
        rc, wall, peak = _run_child(cmd)
        if rc != 0:
            print(f"preflight exited {rc}", file=sys.stderr)
            return 1
        walls.append(wall)
        rss.append(peak)
    verdict = json.loads((Path(tmp.name) / "evidence" / "verdict.json").read_text())

    gc.disable()   # as `preflight.run` does around gather + judge
    t0 = time.perf_counter()
    checks, _ = judge(gather(root, profile.model), profile.model)
    in_process = time.perf_counter() - t0
    gc.enable()
    assert all(c.status in ("pass", "skip") for c in checks)

    n = int(args.slice_gib * (1 << 30))
    dense = Path(tmp.name) / "dense-slice.bin"
    with open(dense, "wb") as fh:
        for _ in range(n // (64 << 20)):
            fh.write(os.urandom(64 << 20))
    _sha256sum_seconds(dense, n)  # warm the page cache
    sha_dense = min(_sha256sum_seconds(dense, n) for _ in range(2))
    sha_sparse = _sha256sum_seconds(shards[0], n)
    med = statistics.median(walls)
    est_dense = sha_dense * total / n
    est_sparse = sha_sparse * total / n
    result = {
        "layout": {"shards": len(shards), "declared_bytes": total, "on_disk_bytes": on_disk,
                   "tensors": verdict["metrics"]["tensor_count"]},
        "preflight": {"runs": args.runs, "wall_s_median": round(med, 3), "wall_s_max": round(max(walls), 3),
                      "peak_rss_mb_max": round(max(rss) / 1e6, 1), "gather_judge_in_process_s": round(in_process, 3),
                      "status": verdict["status"]},
        "sha256sum": {"slice_bytes": n, "dense_slice_s": round(sha_dense, 3),
                      "dense_gb_per_s": round(n / sha_dense / 1e9, 3), "sparse_slice_s": round(sha_sparse, 3),
                      "full_tree_estimate_s_dense": round(est_dense, 1),
                      "full_tree_estimate_s_sparse": round(est_sparse, 1),
                      "ratio_vs_preflight_dense": round(est_dense / med), "ratio_vs_preflight_sparse": round(est_sparse / med)},
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0], "load_average": os.getloadavg()},
    }
    print(json.dumps(result, indent=2))
    tmp.cleanup() if args.dir is None else None
    return 0


if __name__ == "__main__":
    sys.exit(main())
