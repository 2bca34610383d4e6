"""Run metadata stamped on every stored round: what makes two numbers comparable.

The run directory follows the run's layout (gauntlet.contract.layout: ``<run>/<engine>/<task>`` in an
engine sequence, ``<run>/<task>`` in the main DAG); ``GAUNTLET_RUN_DIR`` and ``GAUNTLET_RUN_ID`` override
that (Argo sets neither: the layout holds).
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
from datetime import datetime, UTC
from pathlib import Path
from typing import Any

from gauntlet.contract import CorruptVerdict, Verdict
from gauntlet.contract.layout import RunLayout
from gauntlet.params.models import EngineSpec, Profile
from gauntlet.steps.client.bench import client_version

__all__ = ["run_dir_of", "run_meta", "topology", "topology_parts", "model_fingerprint", "git_rev", "client_version", "driver",
           "NO_DRIVER"]

REPO = Path(__file__).resolve().parents[2]


def run_dir_of(out: Path, in_sequence: bool = True) -> Path:
    """The run directory of the task writing to ``out`` (a task of an engine sequence unless ``in_sequence``
    is False); ``$GAUNTLET_RUN_DIR`` when set."""
    env = os.environ.get("GAUNTLET_RUN_DIR")
    return Path(env) if env else Path(RunLayout.of_task(out, in_sequence=in_sequence).root)


def topology(profile: Profile, spec: EngineSpec) -> str:
    a = spec.args
    nodes = max(1, len(profile.hardware.nodes))
    return f"tp{a.tp_size}-ep{a.ep_size or 1}-dp{a.dp_size or 1}-nodes{nodes}"


def topology_parts(text: str) -> dict[str, int]:
    """:func:`topology`'s string read back (pure): ``tp8-ep16-dp1-nodes2`` -> {tp: 8, ep: 16, dp: 1, nodes: 2};
    a part that is not of that form is left out."""
    out = {}
    for part in text.split("-"):
        name = part.rstrip("0123456789")
        if name in ("tp", "ep", "dp", "nodes") and part[len(name):].isdigit():
            out[name] = int(part[len(name):])
    return out


def nodes(profile: Profile) -> str:
    """The machines the engine ran on: the profile's pool nodes on a cluster, this host locally."""
    if profile.hardware.nodes:
        return ",".join(sorted(n.name for n in profile.hardware.nodes))
    return socket.gethostname()


NO_DRIVER = "none"       # a profile without GPUs (the local CPU run): no NVIDIA driver in the measurement


def driver(run_dir: Path, profile: Profile) -> str:
    """The NVIDIA driver the engines ran on: Gate 1's per-node inventory in this run (the ``nodes-<i>`` tasks'
    verdicts, their ``driver``), the distinct versions joined by ``,``; ``none`` on a profile without GPUs;
    else NVML on this host (a one-machine GPU run without Gate 1); else ``unknown``."""
    seen = set()
    for d in RunLayout(Path(run_dir)).node_check_dirs():
        try:
            got = Verdict.read(d).metrics.get("driver")
        except CorruptVerdict:
            continue
        if isinstance(got, str) and got:
            seen.add(got)
    if seen:
        return ",".join(sorted(seen))
    if profile.hardware.gpus_per_node == 0:
        return NO_DRIVER
    from gauntlet.steps.cluster.gpu import inventory_from_nvml

    inv = inventory_from_nvml()
    return inv.driver if inv is not None and inv.driver else "unknown"


def git_rev() -> str:
    env = os.environ.get("GAUNTLET_GIT_REV")
    if env:
        return env
    try:
        r = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                           text=True, timeout=5, check=False)
        return r.stdout.strip() or "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def model_fingerprint(run_dir: Path, profile: Profile) -> str:
    """Gate 0's fingerprint from this run's preflight evidence, else a hash of config.json, else unknown."""
    from gauntlet.steps.model.fingerprint import extract_fingerprint

    for d in RunLayout(Path(run_dir)).preflight_dirs():
        try:
            fp = extract_fingerprint(Verdict.read(d).metrics)
        except CorruptVerdict:
            continue
        if fp:
            return fp["sha256"][:16]
    for base in (profile.model.mount_path, profile.model.host_cache_path):
        cfg = Path(base) / "config.json"
        if cfg.is_file():
            return "config:" + hashlib.sha256(cfg.read_bytes()).hexdigest()[:16]
    return "unknown"


def run_meta(out: Path, profile: Profile, engine: str, *, spec: EngineSpec | None = None,
             experiment: str = "baseline") -> dict[str, Any]:
    """The metadata columns of the results store for rounds measured in this task."""
    from gauntlet.params import load_images
    from gauntlet.steps.engines.commands import args_hash

    spec = spec or profile.engine(engine)
    run_dir = run_dir_of(out)
    images = load_images()
    image = images.get(spec.image)
    now = datetime.now(UTC)
    return {
        "run_id": os.environ.get("GAUNTLET_RUN_ID") or run_dir.name,
        "profile": profile.name,
        "engine": engine,
        "date": now.strftime("%Y-%m-%d"),
        "timestamp": now.isoformat(timespec="seconds"),
        "client": profile.bench.client,
        "client_version": client_version(),
        "image": image.ref if image else spec.image,
        "image_digest": image.digest if image else "unknown",
        "args_hash": args_hash(engine, spec),
        "model_fingerprint": model_fingerprint(run_dir, profile),
        "git_rev": git_rev(),
        "topology": topology(profile, spec),
        "nodes": nodes(profile),
        "driver": driver(run_dir, profile),
        "context_length": spec.args.context_length,
        "experiment": experiment,
    }
