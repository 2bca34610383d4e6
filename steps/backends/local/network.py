"""The network gate's local launcher: the NCCL probe with torchrun on this machine (gloo on CPU, NCCL on GPUs)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from gauntlet.params.models import Profile
from gauntlet.steps.backends.probe import probe_args
from gauntlet.steps.backends.protocol import Phases
from gauntlet.steps.cluster import nccl_probe as _nccl_probe

__all__ = ["launch_local"]


def launch_local(profile: Profile, env: dict[str, str], nproc: int | None, sizes: str | None, out: Path) -> Phases:
    """torchrun on this machine: ``nproc`` ranks (default: GPUs per node, at least 2), one intra-node phase."""
    nproc = nproc or max(2, profile.hardware.gpus_per_node)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           _nccl_probe.__file__, *probe_args(profile, sizes)]
    (out / "probe-command.txt").write_text(shlex.join(cmd) + "\n")
    try:
        p = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True,
                           timeout=profile.hardware.network.probe_timeout_s)
        log = p.stdout + p.stderr
    except subprocess.TimeoutExpired as exc:
        # the partial output of a timed-out run() is bytes even with text=True
        partial = "".join(x.decode(errors="replace") if isinstance(x, bytes) else x for x in (exc.stdout, exc.stderr) if x)
        log = f"{partial}\nTIMEOUT after {exc.timeout}s"
    (out / "probe-intra-local.log").write_text(log)
    return {"intra": ([_nccl_probe.parse_result_line(log)], ["local"], log)}
