"""What the NCCL probe (:mod:`gauntlet.steps.cluster.nccl_probe`) is run with, whichever back end launches it."""

from __future__ import annotations

from gauntlet.params.models import Profile

__all__ = ["probe_args"]


def probe_args(profile: Profile, sizes: str | None) -> list[str]:
    """The probe's command-line arguments: ``sizes`` (comma-separated bytes), else the profile's; its iterations."""
    net = profile.hardware.network
    return ["--sizes", sizes or ",".join(str(s) for s in net.probe_sizes_bytes),
            "--iters", str(net.probe_iters), "--warmup", str(net.probe_warmup)]
