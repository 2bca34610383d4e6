"""What a gate declares about itself: its :class:`Needs` and the face of its module (:class:`Step`).

Gates import this module, never the registry (:mod:`gauntlet.steps`), which imports the gates."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from gauntlet.contract import Check

if TYPE_CHECKING:
    from gauntlet.steps.options import GateOptions

__all__ = ["Needs", "Step"]


@dataclass(frozen=True)
class Needs:
    """What a gate needs from where it runs; render reads it to build the gate's container (mounts,
    secret, resources) and the runner to load the profile. Declared once, as the gate's ``NEEDS``."""

    profile: bool = True                                    # the runner loads --profile for it
    model_cache: Literal["read", "write"] | None = None     # the node's model cache: read-only, or to fill
    results_secret: bool = False                            # the results store's credentials (env)
    size: Literal["small", "large"] = "small"               # large: 2 CPUs, up to 16Gi (reads whole models)
    node_gpus: bool = False                                 # every GPU of its node (Gate 1's probe)
    transient: bool = True                                  # may exit 75 (retried); False: it never does, so
                                                            # Argo gets no retryStrategy for it (render.py)
    engine_ranks: bool = False                              # judges the deployed engine: its ranks are watched
                                                            # from the gate's start to its end (steps/cluster/rank_watch.py)
    image: Literal["steps", "engine", "bench"] = "steps"
    # the image its container runs in (workflows/graph.py image_key): the project's step image; the image of the
    # engine its --engine names, the project's code copied in (it judges that image's own engine); or the bench
    # client's, the step image built on the pinned vLLM image (its `vllm bench serve`, CUDA torch for the GPU probe)
    host_network: bool = False                              # in its node's own network namespace: the NICs (Gate 1)
    per_node: bool = False                                  # on the cluster once per pool node, pinned to that node
    windowed: bool = True                                   # stops when the run's window ends (steps/window.py);
                                                            # False: it releases or records (teardown, regress,
                                                            # report, cleanup, janitor) and runs whatever is left
    api: Literal["manage", "nodes", "janitor", "admission"] | None = None
    # its role on the Kubernetes API, so its pod's service account (steps/backends/kubernetes/rbac.py ROLES): manage creates,
    # scales and deletes the run's objects (and lists their pods: the rank watch); nodes lists the pods
    # of every namespace (Gate 1); janitor releases finished runs; admission reads the namespace's Pod Security
    # labels and the label policy's binding (params); None calls nothing (Argo's executor only)


class Step(Protocol):
    """The face of a gate module (docs/architecture.md)."""

    NAME: str
    HELP: str
    NEEDS: Needs
    Options: type[GateOptions]      # typed options: the command line and the test's constructor

    def run(self, opts: Any, out: Path) -> tuple[list[Check], dict[str, Any]]: ...

    # optional: ``exit_code(verdict) -> int`` when the exit code means something other than the verdict
    # (cleanup and janitor: 0 unless something is still held)
