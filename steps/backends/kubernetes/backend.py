"""The Kubernetes back end: labelled objects in the profile's namespace, released by label.

It claims :class:`~gauntlet.steps.backends.protocol.Access` (one service account per API role, and the
Roles that grant exactly its calls) and :class:`~gauntlet.steps.backends.protocol.ClusterInspector`
(the API's view of a node's GPU pods, the manifests' RDMA devices). It has no runner to mark: Argo knows
whether a workflow runs, and the exit handler and the janitor release by label.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from gauntlet.contract import Check
from gauntlet.steps.backends.protocol import (Access, ClusterInspector, EngineHost, EngineRequest, Outcome, Phases,
                                              ProbeLauncher, ProbeRequest, ReleaseRequest, Releaser, StopRequest)

if TYPE_CHECKING:
    from gauntlet.params import Profile
    from gauntlet.steps.cluster.rank_watch import Rank

__all__ = ["KubernetesBackend", "BACKEND"]


class KubernetesBackend:
    """The cluster: labelled objects in the profile's namespace, released by label."""

    name = "kubernetes"
    claims: ClassVar[tuple[type, ...]] = (EngineHost, Releaser, ProbeLauncher, Access, ClusterInspector)

    # ------------------------------------------------------------------ EngineHost
    def deploy(self, opts: EngineRequest, out: Path) -> Outcome:
        from gauntlet.steps.backends.kubernetes import deploy
        return deploy.deploy(opts, out)

    def teardown(self, opts: StopRequest, out: Path) -> Outcome:
        from gauntlet.steps.backends.kubernetes import deploy
        return deploy.teardown(opts, out)

    def restart(self, opts: EngineRequest, out: Path) -> Outcome:
        from gauntlet.steps.backends.kubernetes import deploy
        return deploy.restart(opts, out)

    def deployed(self, profile: Profile, engine: str, *, run_dir: Path, run_id: str | None) -> dict[str, Any] | None:
        from gauntlet.steps.backends.kubernetes import deploy
        return deploy.deployed(profile, engine, run_id)

    def ranks(self, profile: Profile, engine: str, out: Path, variant: str | None = None) -> list[Rank] | None:
        from gauntlet.steps.backends import ranks
        return ranks.kubernetes_ranks(profile, engine, variant)

    def telemetry_targets(self, profile: Profile, engine: str, out: Path,
                          variant: str | None) -> tuple[list[tuple[int, str, str]], str]:
        """The ``telemetry`` container of each engine pod, by its per-rank DNS name under the headless Service."""
        import os

        from gauntlet.contract import UsageError
        from gauntlet.steps.backends.kubernetes import run_id_from
        from gauntlet.steps.backends.kubernetes.manifests import engine_names
        try:
            run_id = run_id_from(None)
        except UsageError as exc:
            return [], f"no run id to name the engine's pods: {exc}"
        names = engine_names(engine, run_id, variant)
        ns = os.environ.get("GAUNTLET_NAMESPACE") or profile.namespace
        port = profile.hardware.telemetry.port
        return [(r, f"http://{names['statefulset']}-{r}.{names['headless']}.{ns}.svc.cluster.local:{port}",
                 f"{names['statefulset']}-{r}") for r in range(max(1, len(profile.hardware.nodes)))], ""

    # ------------------------------------------------------------------ Releaser
    def cleanup(self, opts: ReleaseRequest, profile: Profile | None, out: Path) -> Outcome:
        from gauntlet.steps.backends.kubernetes import cleanup
        return cleanup.cleanup(opts, profile, out)

    def janitor(self, out: Path, *, runs_dir: Path | None = None, namespace: str | None = None,
                grace_s: float = 0.0, exclude: Path | None = None) -> Outcome:
        from gauntlet.steps.backends.kubernetes import janitor
        return janitor.sweep(namespace, out, grace_s)

    # ------------------------------------------------------------------ ProbeLauncher
    def network(self, profile: Profile, engine: str, env: dict[str, str], opts: ProbeRequest, out: Path) -> Phases:
        from gauntlet.steps.backends.kubernetes import network
        return network.launch_kubernetes(profile, engine, env, opts.run_id, opts.sizes, out,
                                         node_env=opts.node_envs())

    # ------------------------------------------------------------------ Access
    @property
    def janitor_account(self) -> str:
        from gauntlet.steps.backends.kubernetes.rbac import JANITOR_ACCOUNT
        return JANITOR_ACCOUNT

    def access_manifests(self, profile: Profile) -> list[dict[str, Any]]:
        from gauntlet.steps.backends.kubernetes.rbac import access_manifests
        return access_manifests(profile.namespace, profile.service_account)

    def account(self, profile: Profile, role: str | None) -> str:
        from gauntlet.steps.backends.kubernetes.rbac import account
        return account(profile.service_account, role)

    # ------------------------------------------------------------------ ClusterInspector
    def node_gpu_pods(self, node: str) -> list[dict[str, Any]]:
        from gauntlet.steps.backends.kubernetes.api import connect
        from gauntlet.steps.backends.kubernetes.manager import node_gpu_pods
        return node_gpu_pods(connect(), node)

    def rdma_access_problems(self, profile: Profile) -> list[str]:
        from gauntlet.steps.backends.kubernetes.manifests import rdma_access_problems
        return rdma_access_problems(profile)

    def admission_checks(self, profile: Profile) -> list[Check]:
        from gauntlet.steps.backends.kubernetes.admission import admission_checks
        return admission_checks(profile)


BACKEND = KubernetesBackend()
