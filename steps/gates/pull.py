"""Gate 1, pull: one engine's image is on one pool node before any rank of that engine is deployed there.

The step's container *is* the engine's image (``NEEDS.image == "engine"``, its ``--engine``), pinned to
``--node`` (``NEEDS.per_node``), pulled by digest with ``imagePullPolicy: IfNotPresent`` like the engine's
own pods (steps/backends/kubernetes/manifests.py): the kubelet pulls it before the step starts, so the pull
itself is what the task is for. The graph (workflows/graph.py) runs one ``pull-<engine>-<i>`` per engine the
run deploys and per pool node, beside Gate 1's probes, and each engine sequence waits for its engine's
pulls. Without them only the node that ran Gate 0's engine-check held the image, and the other node's
rank spent the pull (tens of GB) starting while the first waited in its first collective, past the engine's
collective timeout (``engines.E.dist_timeout_s``).

An image a node cannot pull leaves the pod Pending (``ErrImagePull``/``ImagePullBackOff``: the kubelet retries
it) until the task's deadline (:data:`DEADLINE_S`, the profile's ``timeouts_s`` may set it) fails the task
at Gate 1, naming the node, before any GPU of the engine is asked for; the gate never exits 75, so its
template gets Argo's ``timeout``, which fires on a Pending pod (workflows/render.py ``_placement``).

Once running, it checks that it runs on the node it was pinned to (``NODE_NAME``, the downward API's
``spec.nodeName`` render gives every step) and records the image it was pulled as.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gauntlet.contract import Check, UsageError
from gauntlet.params import load_images
from gauntlet.steps.engines import ENGINES
from gauntlet.steps.gate import Needs
from gauntlet.steps.gates.shared_options import engine_option
from gauntlet.steps.options import GateOptions, option

__all__ = ["NAME", "HELP", "NEEDS", "Options", "run", "judge", "DEADLINE_S"]

NAME = "pull"
HELP = "Gate 1 per node and engine: the engine's image pulled onto the node before deploy (the pod runs in it)"
NEEDS = Needs(transient=False, image="engine", per_node=True)
# the task's deadline: the plan's estimate of a cold pull (workflows/plan.py, 600 s) x 1.5, up to the next half
# hour (plan.suggested_timeout); a pull still Pending then fails the task
DEADLINE_S = 1800


@dataclass(frozen=True, kw_only=True)
class Options(GateOptions):
    engine: str = option(choices=tuple(sorted(ENGINES)), help="the engine whose image this pod runs in")
    node: str = option(help="the pool node the pod is pinned to")

    def __post_init__(self) -> None:
        super().__post_init__()
        engine_option(self, self.engine)
        known = [n.name for n in self.the_profile.hardware.nodes]
        if self.node not in known:
            raise UsageError(f"--node {self.node}: not a node of profile {self.the_profile.name} "
                             f"(has {', '.join(known) or 'no nodes'})")


def judge(node: str, running_on: str | None, image: str) -> Check:
    """Pure: the pod runs on the node it was pinned to, so that node holds ``image``."""
    if running_on is None:
        return Check("node", "fail", node, None, "NODE_NAME is unset: not the pod render writes (its env sets it "
                     "from spec.nodeName), so where the image was pulled is unknown")
    if running_on != node:
        return Check("node", "fail", node, running_on, f"pinned to {node} but running on {running_on}: {node} may "
                     f"not hold {image}")
    return Check("node", "pass", node, running_on, f"{node} holds {image} (this pod runs in it)")


def run(opts: Options, out: Path) -> tuple[list[Check], dict[str, Any]]:
    image = load_images()[opts.the_profile.engine(opts.engine).image].ref
    check = judge(opts.node, os.environ.get("NODE_NAME") or None, image)
    return [check], {"engine": opts.engine, "node": opts.node, "image": image}
