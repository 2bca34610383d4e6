"""The local back end: engines as process groups on this machine, labelled with the run directory.

It claims :class:`~gauntlet.steps.backends.protocol.RunnerGuard` (the runner's mark, the last stop of
every engine); it has no accounts to grant nor a cluster API to read.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from gauntlet.steps.backends.protocol import (EngineHost, EngineRequest, Outcome, Phases, ProbeLauncher, ProbeRequest,
                                              ReleaseRequest, Releaser, RunnerGuard, StopRequest)

if TYPE_CHECKING:
    from gauntlet.params import Profile
    from gauntlet.steps.cluster.rank_watch import Rank

__all__ = ["LocalBackend", "BACKEND"]


class LocalBackend:
    """This machine: engines are process groups labelled with the run directory."""

    name = "local"
    claims: ClassVar[tuple[type, ...]] = (EngineHost, Releaser, ProbeLauncher, RunnerGuard)

    # ------------------------------------------------------------------ EngineHost
    def deploy(self, opts: EngineRequest, out: Path) -> Outcome:
        from gauntlet.steps.backends.local import deploy
        return deploy.deploy(opts, out)

    def teardown(self, opts: StopRequest, out: Path) -> Outcome:
        from gauntlet.steps.backends.local import deploy
        return deploy.teardown(opts, out)

    def restart(self, opts: EngineRequest, out: Path) -> Outcome:
        from gauntlet.steps.backends.local import deploy
        return deploy.restart(opts, out)

    def deployed(self, profile: Profile, engine: str, *, run_dir: Path, run_id: str | None) -> dict[str, Any] | None:
        from gauntlet.steps.backends.local import deploy
        return deploy.deployed(run_dir, engine)

    def ranks(self, profile: Profile, engine: str, out: Path, variant: str | None = None) -> list[Rank] | None:
        from gauntlet.steps.backends import ranks
        from gauntlet.steps.backends.local import deploy
        return ranks.local_ranks(deploy.run_dir_of(out), engine, variant)

    def telemetry_targets(self, profile: Profile, engine: str, out: Path,
                          variant: str | None) -> tuple[list[tuple[int, str, str]], str]:
        """The sampler the local deploy started beside ``engine`` (its URL in the deploy state)."""
        import json

        from gauntlet.steps.backends.local.deploy import run_dir_of, state_path
        for d in (run_dir_of(out), Path(out).resolve()):
            try:
                rec = json.loads(state_path(d, engine).read_text())
            except (OSError, ValueError):
                continue
            if (rec.get("variant") or None) == variant and rec.get("telemetry"):
                return [(0, str(rec["telemetry"]), "local")], ""
        return [], f"no sampler recorded beside the local {engine} (its deploy state has no telemetry URL)"

    # ------------------------------------------------------------------ Releaser
    def cleanup(self, opts: ReleaseRequest, profile: Profile | None, out: Path) -> Outcome:
        from gauntlet.contract.layout import RunLayout
        from gauntlet.steps.backends.local import deploy
        return deploy.cleanup(Path(opts.run_dir) if opts.run_dir else Path(RunLayout.of_task(out, in_sequence=False).root))

    def janitor(self, out: Path, *, runs_dir: Path | None = None, namespace: str | None = None,
                grace_s: float = 0.0, exclude: Path | None = None) -> Outcome:
        from gauntlet.steps.backends.local import janitor
        return janitor.sweep(Path(runs_dir or "runs"), out, exclude=exclude)

    # ------------------------------------------------------------------ ProbeLauncher
    def network(self, profile: Profile, engine: str, env: dict[str, str], opts: ProbeRequest, out: Path) -> Phases:
        from gauntlet.steps.backends.local import network
        return network.launch_local(profile, env, opts.nproc, opts.sizes, out)

    # ------------------------------------------------------------------ RunnerGuard
    def mark_runner(self, run_dir: Path) -> None:
        from gauntlet.steps.backends.local import janitor
        janitor.mark_runner(run_dir)

    def clear_runner(self, run_dir: Path) -> None:
        from gauntlet.steps.backends.local import janitor
        janitor.clear_runner(run_dir)

    def stop_all(self, run_dir: Path) -> list[dict[str, Any]]:
        from gauntlet.steps.backends.local import deploy
        return deploy.stop_all(run_dir)


BACKEND = LocalBackend()
