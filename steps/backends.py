"""The two back ends a run can use, behind one small Protocol: a registry and one rule to choose.

``local`` runs the engine as a labelled process group on this machine; ``kubernetes``
server-side-applies labelled objects in the profile's namespace. Every gate that acts on
the run's resources (deploy, teardown, cleanup, network, janitor) and both runners
(``gauntlet run`` and the Argo render) reach them only through :data:`BACKENDS` and
:func:`backend_for`; the ``--backend``/``--launcher`` choices come from the registry.

The implementations import their plumbing (``_deploy_local``, ``_k8s``, ...) when called,
so choosing a back end, or rendering, imports no Kubernetes client and starts nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gauntlet.contract import Check, UsageError

if TYPE_CHECKING:
    from gauntlet.params import Profile
    from gauntlet.steps import cleanup, deploy, network, teardown

__all__ = ["Backend", "BACKENDS", "backend_for", "Outcome", "Phases"]

Outcome = tuple[list[Check], dict[str, Any]]
# network: phase -> (one probe result or None per run, where each ran, the logs)
Phases = dict[str, tuple[list[dict[str, Any] | None], list[str], str]]


class Backend(Protocol):
    """What a back end does for a run: the gates' operations, the runner's bookkeeping, its access rules."""

    name: str
    janitor_account: str | None         # the service account the janitor runs as (None: no account needed)

    def deploy(self, opts: deploy.Options, out: Path) -> Outcome:
        """Start the engine ``opts`` names and wait until it answers; ``outputs.endpoint`` in the metrics."""

    def teardown(self, opts: teardown.Options, out: Path) -> Outcome:
        """Stop that engine of the run and wait until what it held is free."""

    def cleanup(self, opts: cleanup.Options, profile: Profile | None, out: Path) -> Outcome:
        """Release everything the run holds (the exit handler); never raises for what it could not do."""

    def network(self, profile: Profile, engine: str, env: dict[str, str], opts: network.Options,
                out: Path) -> Phases:
        """Run the NCCL probe with ``env`` (intra-node, then across nodes); the phases' results and logs."""

    def janitor(self, out: Path, *, runs_dir: Path | None = None, namespace: str | None = None,
                grace_s: float = 0.0, exclude: Path | None = None) -> Outcome:
        """Release what runs that are over left behind (their runner dead, their workflow gone or finished)."""

    def stop_all(self, run_dir: Path) -> list[dict[str, Any]]:
        """The local runner's guarantee after the exit handler: stop every engine of the run (what was stopped)."""

    def mark_runner(self, run_dir: Path) -> None:
        """Mark ``run_dir`` as driven by a live runner (the janitor leaves it alone)."""

    def clear_runner(self, run_dir: Path) -> None:
        """Remove the mark: the runner is done."""

    def access_manifests(self, profile: Profile) -> list[dict[str, Any]]:
        """The documents that grant the steps (and the janitor) exactly the calls this back end makes."""


class LocalBackend:
    """This machine: engines are process groups labelled with the run directory."""

    name = "local"
    janitor_account = None

    def deploy(self, opts: deploy.Options, out: Path) -> Outcome:
        from gauntlet.steps import _deploy_local
        return _deploy_local.deploy(opts, out)

    def teardown(self, opts: teardown.Options, out: Path) -> Outcome:
        from gauntlet.steps import _deploy_local
        return _deploy_local.teardown(opts, out)

    def cleanup(self, opts: cleanup.Options, profile: Profile | None, out: Path) -> Outcome:
        from gauntlet.steps import _deploy_local
        return _deploy_local.cleanup(Path(opts.run_dir) if opts.run_dir else Path(out).parent)

    def network(self, profile: Profile, engine: str, env: dict[str, str], opts: network.Options,
                out: Path) -> Phases:
        from gauntlet.steps import _network_launch
        return _network_launch.launch_local(profile, env, opts.nproc, opts.sizes, out)

    def janitor(self, out: Path, *, runs_dir: Path | None = None, namespace: str | None = None,
                grace_s: float = 0.0, exclude: Path | None = None) -> Outcome:
        from gauntlet.steps import _janitor_local
        return _janitor_local.sweep(Path(runs_dir or "runs"), out, exclude=exclude)

    def stop_all(self, run_dir: Path) -> list[dict[str, Any]]:
        from gauntlet.steps import _deploy_local
        return _deploy_local.stop_all(run_dir)

    def mark_runner(self, run_dir: Path) -> None:
        from gauntlet.steps import _janitor_local
        _janitor_local.mark_runner(run_dir)

    def clear_runner(self, run_dir: Path) -> None:
        from gauntlet.steps import _janitor_local
        _janitor_local.clear_runner(run_dir)

    def access_manifests(self, profile: Profile) -> list[dict[str, Any]]:
        return []


class KubernetesBackend:
    """The cluster: labelled objects in the profile's namespace, released by label."""

    name = "kubernetes"

    @property
    def janitor_account(self) -> str:
        from gauntlet.steps._k8s.rbac import JANITOR_ACCOUNT
        return JANITOR_ACCOUNT

    def deploy(self, opts: deploy.Options, out: Path) -> Outcome:
        from gauntlet.steps import _deploy_k8s
        return _deploy_k8s.deploy(opts, out)

    def teardown(self, opts: teardown.Options, out: Path) -> Outcome:
        from gauntlet.steps import _deploy_k8s
        return _deploy_k8s.teardown(opts, out)

    def cleanup(self, opts: cleanup.Options, profile: Profile | None, out: Path) -> Outcome:
        from gauntlet.steps import _cleanup_k8s
        return _cleanup_k8s.cleanup(opts, profile, out)

    def network(self, profile: Profile, engine: str, env: dict[str, str], opts: network.Options,
                out: Path) -> Phases:
        from gauntlet.steps import _network_launch
        return _network_launch.launch_kubernetes(profile, engine, env, opts.run_id, opts.sizes, out)

    def janitor(self, out: Path, *, runs_dir: Path | None = None, namespace: str | None = None,
                grace_s: float = 0.0, exclude: Path | None = None) -> Outcome:
        from gauntlet.steps import _janitor_k8s
        return _janitor_k8s.sweep(namespace, out, grace_s)

    def stop_all(self, run_dir: Path) -> list[dict[str, Any]]:
        return []           # the exit handler and the janitor CronWorkflow release by label

    def mark_runner(self, run_dir: Path) -> None:
        pass                # Argo knows whether a workflow runs

    def clear_runner(self, run_dir: Path) -> None:
        pass

    def access_manifests(self, profile: Profile) -> list[dict[str, Any]]:
        from gauntlet.steps._k8s.rbac import janitor_manifests, role_manifests
        return role_manifests(profile.namespace, profile.service_account) + janitor_manifests(profile.namespace)


BACKENDS: dict[str, Backend] = {"local": LocalBackend(), "kubernetes": KubernetesBackend()}


def backend_for(profile: Profile | None, override: str | None = None) -> Backend:
    """``override`` (``--backend``/``--launcher``), else the profile's ``hardware.kind``; without a profile
    (cleanup when it does not load) kubernetes inside a cluster, else local."""
    if override:
        name = override
    elif profile is not None:
        name = profile.hardware.kind
    else:
        in_cluster = os.environ.get("KUBERNETES_SERVICE_HOST") or os.environ.get("GAUNTLET_KUBE_API")
        name = "kubernetes" if in_cluster else "local"
    try:
        return BACKENDS[name]
    except KeyError:
        raise UsageError(f"back end {name!r}: expected one of {', '.join(BACKENDS)}") from None
