"""The exit handler: runs whatever happened, keeps the evidence, gives every resource of the run back.

It cannot refuse. Whatever its arguments (a malformed ``--workflow-status`` or
``--failures``, a profile that does not load, an API error on one object) it
first releases every object carrying the run's label, then records what it
could not parse or do as failed checks. Its exit code says only whether
something is still held afterwards: 0 nothing held (even with failed checks),
75 still held after a transient error (Argo retries it), 1 still held.

The back end (:func:`gauntlet.steps.backends.backend_for`) releases: locally
:func:`gauntlet.steps.backends.local.deploy.cleanup` stops every engine process group of the run
(found by state file and by label) and confirms none is left; on Kubernetes
:func:`gauntlet.steps.backends.kubernetes.cleanup.cleanup` saves logs first, then scales to 0 and deletes
only what carries the run's label.

``{{workflow.failures}}`` and ``{{workflow.status}}`` are read as Argo leaves them
(:func:`gauntlet.steps.backends.argo.parse_failures`, :func:`~gauntlet.steps.backends.argo.parse_status`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gauntlet.contract import EXIT_FAIL, EXIT_PASS, EXIT_TRANSIENT, Check, Verdict
from gauntlet.steps.gate import Needs
from gauntlet.steps.backends import BACKENDS, backend_for
from gauntlet.steps.backends.argo import go_unquote, parse_failures, parse_status
from gauntlet.steps.gates.shared_options import backend_option
from gauntlet.steps.options import GateOptions, option

NAME = "cleanup"
HELP = "exit handler: keep logs, stop/delete everything this run created (always runs, never refuses)"
# The step loads the profile itself: a profile that does not load must not stop the release.
NEEDS = Needs(profile=False, results_secret=True, api="manage", windowed=False)

__all__ = ["Options", "parse_failures", "parse_status", "go_unquote", "run", "exit_code"]


@dataclass(frozen=True, kw_only=True)
class Options(GateOptions):
    """Nothing is refused here: every value is judged after the release (see :func:`run`)."""

    # the step loads --profile itself (NEEDS.profile is False): a broken one is recorded, never refused
    profile_ref: str | None = option(None, flag="--profile",
                                     help="profile name or YAML path (a broken one is recorded)")
    workflow_status: str = option("Unknown", help="{{workflow.status}}: Succeeded, Failed or Error")
    failures: str = option("null", help="{{workflow.failures}}: Argo's quoted JSON list (\"null\" when nothing "
                                        "failed) or bare JSON")
    backend: str | None = backend_option("default: the profile's hardware.kind (in a pod without a profile: kubernetes)")
    run_id: str | None = option(None, help="run id / workflow uid")
    run_dir: str | None = option(None, help="local run directory (default: the parent of --out)")


# ------------------------------------------------------------------ the step

def _profile(opts: Options) -> tuple[Any, str | None]:
    if opts.profile is not None:
        return opts.profile, None
    if not opts.profile_ref:
        return None, "--profile: not given; falling back to the environment for backend and namespace"
    from gauntlet.params import ProfileError, load_profile
    try:
        return load_profile(opts.profile_ref), None
    except ProfileError as exc:
        return None, f"profile did not load ({str(exc).splitlines()[0][:300]}); released by label anyway"
    except Exception as exc:  # noqa: BLE001 - a broken image list or YAML library must not stop the release
        return None, f"profile did not load ({type(exc).__name__}: {exc}); released by label anyway"


def run(opts: Options, out: Path) -> tuple[list[Check], dict[str, Any]]:
    problems: list[str] = []
    profile, why = _profile(opts)
    if why:
        problems.append(why)
    failures, why = parse_failures(opts.failures)
    if why:
        problems.append(why)
    status, why = parse_status(opts.workflow_status)
    if why:
        problems.append(why)
    if opts.backend is not None and opts.backend not in BACKENDS:
        problems.append(f"--backend: expected one of {', '.join(BACKENDS)}, got {opts.backend!r}; chose by the profile")
    backend = backend_for(profile, opts.backend if opts.backend in BACKENDS else None)

    # release first: nothing above may stop it
    checks, metrics = backend.cleanup(opts, profile, out)
    checks += [Check("arguments", "fail", "valid arguments and profile", p, p) for p in problems]
    metrics.update(workflow_status=status, failures=failures, problems=problems, backend=backend.name)
    return checks, metrics


def exit_code(verdict: Verdict) -> int:
    """0 unless something is still held: 75 when a transient error may be why (Argo retries), else 1."""
    m = verdict.metrics
    if not m.get("held"):
        return EXIT_PASS
    return EXIT_TRANSIENT if m.get("transient") else EXIT_FAIL

