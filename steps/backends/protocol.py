"""What a caller may ask of a back end, as small Protocols, and the plain values it passes.

Every back end is an :class:`EngineHost` (run one engine of the run), a :class:`Releaser` (give the run's
resources back) and a :class:`ProbeLauncher` (run the NCCL probe): :class:`Backend`. What only one back end
does is a Protocol of its own, listed in the back end's ``claims`` and asked for by
:func:`gauntlet.steps.backends.capability`: :class:`RunnerGuard` (local: the runner's mark and its last
stop), :class:`Access` and :class:`ClusterInspector` (kubernetes: accounts, RBAC, the API's view of nodes).
A back end never claims what it does not do, so none of these methods is a stand-in that does nothing.

The requests are Protocols too: a gate's ``Options`` satisfies them by its fields, so this module (and the
implementations) import no gate.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from gauntlet.contract import Check

if TYPE_CHECKING:
    from gauntlet.params import Profile
    from gauntlet.params.models import EngineSpec
    from gauntlet.steps.cluster.rank_watch import Rank

__all__ = ["Outcome", "Phases", "EngineRequest", "StopRequest", "ReleaseRequest", "ProbeRequest", "EngineHost",
           "Releaser", "ProbeLauncher", "RunnerGuard", "Access", "ClusterInspector", "Backend", "PROTOCOLS"]

Outcome = tuple[list[Check], dict[str, Any]]
# network: phase -> (one probe result or None per run, where each ran, the logs)
Phases = dict[str, tuple[list[dict[str, Any] | None], list[str], str]]


# ------------------------------------------------------------------ what the callers pass

class StopRequest(Protocol):
    """Which engine of the run to stop (teardown)."""

    @property
    def the_profile(self) -> Profile: ...
    @property
    def engine(self) -> str: ...
    @property
    def variant(self) -> str | None: ...
    @property
    def run_id(self) -> str | None: ...


class EngineRequest(StopRequest, Protocol):
    """Which engine to start and how (deploy, restart): its spec with the variant and context applied."""

    @property
    def run_dir(self) -> str | None: ...
    def engine_spec(self) -> EngineSpec: ...
    def node_envs(self) -> dict[str, dict[str, str]]: ...


class ReleaseRequest(Protocol):
    """What the exit handler was given (cleanup): every value raw, judged after the release."""

    @property
    def run_dir(self) -> str | None: ...
    @property
    def run_id(self) -> str | None: ...
    @property
    def workflow_status(self) -> str: ...
    @property
    def failures(self) -> str: ...


class ProbeRequest(Protocol):
    """How to run the NCCL probe (network)."""

    @property
    def run_id(self) -> str | None: ...
    @property
    def nproc(self) -> int | None: ...
    @property
    def sizes(self) -> str | None: ...
    def node_envs(self) -> dict[str, dict[str, str]]: ...


# ------------------------------------------------------------------ what every back end does

class EngineHost(Protocol):
    """Run one engine of the run: start it, stop it, read what runs."""

    def deploy(self, opts: EngineRequest, out: Path) -> Outcome:
        """Start the engine ``opts`` names and wait until it answers; ``outputs.endpoint`` in the metrics."""
        ...

    def teardown(self, opts: StopRequest, out: Path) -> Outcome:
        """Stop that engine of the run and wait until what it held is free."""
        ...

    def restart(self, opts: EngineRequest, out: Path) -> Outcome:
        """Stop the run's ``opts.engine`` completely, then deploy ``opts`` under the same names and endpoint."""
        ...

    def deployed(self, profile: Profile, engine: str, *, run_dir: Path, run_id: str | None) -> dict[str, Any] | None:
        """The run's running baseline ``engine`` as its deployment record says (``argv``, ``context_length``,
        ``record``: where it was read), or None when none runs."""
        ...

    def ranks(self, profile: Profile, engine: str, out: Path, variant: str | None = None) -> list[Rank] | None:
        """The deployed engine's ranks now (None: none deployed), for the rank watch: the baseline's, or with
        ``variant`` that Gate 6 variant's (deployed with ``out`` as its deploy's)."""
        ...

    def telemetry_targets(self, profile: Profile, engine: str, out: Path,
                          variant: str | None) -> tuple[list[tuple[int, str, str]], str]:
        """Each rank's telemetry sampler of the run's ``engine`` (``variant``: an experiment's, None: the
        baseline) as (rank, base URL, where it runs), and why there is none when the list is empty."""
        ...


class Releaser(Protocol):
    """Give back what a run holds: this run's (the exit handler), or what finished runs left (the janitor)."""

    def cleanup(self, opts: ReleaseRequest, profile: Profile | None, out: Path) -> Outcome:
        """Release everything the run holds; never raises for what it could not do."""
        ...

    def janitor(self, out: Path, *, runs_dir: Path | None = None, namespace: str | None = None,
                grace_s: float = 0.0, exclude: Path | None = None) -> Outcome:
        """Release what runs that are over left behind (their runner dead, their workflow gone or finished)."""
        ...


class ProbeLauncher(Protocol):
    """Run the network gate's NCCL probe where the engines run."""

    def network(self, profile: Profile, engine: str, env: dict[str, str], opts: ProbeRequest, out: Path) -> Phases:
        """Run the NCCL probe with ``env`` (intra-node, then across nodes); the phases' results and logs."""
        ...


class Backend(EngineHost, Releaser, ProbeLauncher, Protocol):
    """A registered back end: the three Protocols every one does, its name, and what else it claims."""

    name: str
    claims: ClassVar[tuple[type, ...]]


# ------------------------------------------------------------------ what only some back ends do

class RunnerGuard(Protocol):
    """A runner on this machine: its mark (the janitor spares a live runner's run) and its last word."""

    def mark_runner(self, run_dir: Path) -> None:
        """Mark ``run_dir`` as driven by a live runner (the janitor leaves it alone)."""
        ...

    def clear_runner(self, run_dir: Path) -> None:
        """Remove the mark: the runner is done."""
        ...

    def stop_all(self, run_dir: Path) -> list[dict[str, Any]]:
        """After the exit handler: stop every engine of the run still running (what was stopped)."""
        ...


class Access(Protocol):
    """Who the steps run as, and the grants that let them make exactly this back end's calls."""

    @property
    def janitor_account(self) -> str:
        """The service account the janitor runs as."""
        ...

    def access_manifests(self, profile: Profile) -> list[dict[str, Any]]:
        """The documents that grant the steps (and the janitor) exactly the calls this back end makes."""
        ...

    def account(self, profile: Profile, role: str | None) -> str:
        """The service account a step of API role ``role`` (its ``NEEDS.api``) runs as."""
        ...


class ClusterInspector(Protocol):
    """What the cluster's API and manifests say about nodes and pods (Gate 1), and about admitting the run's pods
    (the ``params`` step, before any GPU is requested)."""

    def node_gpu_pods(self, node: str) -> list[dict[str, Any]]:
        """The pods on ``node`` that request GPUs."""
        ...

    def rdma_access_problems(self, profile: Profile) -> list[str]:
        """One line naming every pod this back end would run NCCL in that gets no RDMA device, or none."""
        ...

    def admission_checks(self, profile: Profile) -> list[Check]:
        """Whether the API server will admit the run's pods (the namespace's Pod Security level) and holds the
        rendered label policy (its binding)."""
        ...


# every Protocol a caller may ask for, with the methods (and properties) it names
PROTOCOLS: tuple[type, ...] = (EngineHost, Releaser, ProbeLauncher, RunnerGuard, Access, ClusterInspector)
