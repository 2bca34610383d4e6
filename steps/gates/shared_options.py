"""Option pieces several gates share: the endpoint flag's check, the back-end override and the results store.

A gate's ``Options.__post_init__`` calls :func:`check_endpoint` so a bad URL is a one-line UsageError naming
its flag before anything runs, and :func:`engine_option` the engine flag's (the profile's rule, naming the flag);
:func:`backend_option` is the one ``--backend`` flag every gate that acts on the run's resources declares;
:class:`ResultsOptions` is the ``--results-uri`` flag and the one fallback (``Profile.results_store``) every
gate that reads or writes the store uses. :func:`upstream_option` is ``--upstream``, the phase each task
before a gate ended in, for the gates that run whatever happened before them (the engine sequence's teardown,
regress, report); :func:`upstream_phases` reads it, :func:`upstream_check` fails such a gate when a task
before it did not pass and :func:`carry_upstream` adds that check and the phases to a gate's result.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gauntlet.contract import Check, UsageError
from gauntlet.params.models import BACKEND_KINDS
from gauntlet.steps.client.http import normalize_endpoint
from gauntlet.steps.options import GateOptions, option

__all__ = ["check_endpoint", "engine_option", "backend_option", "ResultsOptions", "upstream_option", "upstream_phases",
           "upstream_check", "carry_upstream", "UPSTREAM", "PASSED_PHASES"]

UPSTREAM = "upstream"                       # the check a gate adds when a task before it did not pass
# The node phases of a task that did not stop the run (Argo's: Succeeded, Failed, Error, Skipped, Omitted; the
# local runner writes the same names): anything else, an unknown word included, did not pass.
PASSED_PHASES = ("Succeeded", "Skipped")


def check_endpoint(url: str | None, flag: str = "--endpoint") -> None:
    """UsageError naming the flag unless ``url`` is an http(s) URL (None: not given, nothing to check)."""
    if url is not None:
        normalize_endpoint(url, flag)


def engine_option(opts: GateOptions, name: str | None, flag: str = "--engine") -> str:
    """The profile's rule for an engine name (:meth:`Profile.engine_name`), its error naming the flag."""
    try:
        return opts.the_profile.engine_name(name)
    except UsageError as exc:
        raise UsageError(f"{flag} {name}: {exc}") from None


def backend_option(help: str = "default: the profile's hardware.kind") -> Any:
    """The ``--backend`` field (name it ``backend``): a registered back end's name, its choices the registry's,
    sorted; None leaves the choice to :func:`gauntlet.steps.backends.backend_for`. The names are the profile's
    hardware kinds (the registry has one back end per kind), so declaring the flag imports no back end."""
    return option(None, choices=tuple(sorted(BACKEND_KINDS)), help=help)


@dataclass(frozen=True, kw_only=True)
class ResultsOptions(GateOptions):
    """``--results-uri`` and where the rounds really go: the flag, else $GAUNTLET_RESULTS_URI, else the profile's."""

    results_uri: str | None = option(None, help="results store (default: $GAUNTLET_RESULTS_URI or the profile's)")

    @property
    def results_store(self) -> str:
        return self.the_profile.results_store(self.results_uri)


def upstream_option() -> Any:
    """The ``--upstream`` field (name it ``upstream``): ``TASK=PHASE`` per task before the gate, in the graph's
    order; the graph writes each PHASE as ``{{tasks.TASK.status}}`` (workflows/graph.py ``_statuses``), which Argo
    and the local runner fill with the phase the task ended in. Empty: the gate was run by hand."""
    return option((), help="TASK=PHASE of each task before this one ({{tasks.TASK.status}}): "
                           "the gate fails when one did not pass (Failed, Error, Omitted)")


def upstream_phases(items: tuple[str, ...], flag: str = "--upstream") -> dict[str, str]:
    """``--upstream``'s items as {task: phase}, in order; UsageError naming the item when one is not TASK=PHASE
    (an unfilled ``{{...}}`` reference included: the orchestrator did not substitute it)."""
    phases: dict[str, str] = {}
    for item in items:
        task, sep, phase = item.partition("=")
        if not sep or not task.strip() or not phase.strip() or "{{" in item:
            raise UsageError(f"{flag} {item!r}: expected TASK=PHASE (a task's {{{{tasks.TASK.status}}}})")
        phases[task.strip()] = phase.strip()
    return phases


def upstream_check(phases: Mapping[str, str], what: str) -> Check | None:
    """A failing ``upstream`` check naming every task of ``phases`` that did not pass (its phase not in
    PASSED_PHASES), the failed ones first; None when each passed. ``what``: why this gate ran anyway and what
    it did, for the detail (``the engine is released``).

    A gate that runs whatever happened before it fails so the run does: Argo judges a DAG by its leaf tasks
    (workflow/controller/dag.go assessDAGPhase: a completed leaf sets its branch's phase), and its RETRY resets a
    failed node only when no descendant Succeeded (workflow/util/util.go isDescendantNodeSucceeded)."""
    bad = {t: p for t, p in phases.items() if p not in PASSED_PHASES}
    if not bad:
        return None
    failed = [f"{t} {p}" for t, p in bad.items() if p != "Omitted"]
    omitted = [t for t, p in bad.items() if p == "Omitted"]
    said = "; ".join([*(failed and [", ".join(failed)]), *(omitted and [f"not run (Omitted): {', '.join(omitted)}"])])
    return Check(UPSTREAM, "fail", f"every task before this one {' or '.join(PASSED_PHASES)}", bad,
                 f"before this task: {said}. {what[:1].upper()}{what[1:]}; this task fails because they did not pass")


def carry_upstream(result: tuple[list[Check], dict[str, Any]], upstream: tuple[str, ...],
                   what: str) -> tuple[list[Check], dict[str, Any]]:
    """A gate's (checks, metrics) with :func:`upstream_check`'s check when a task before it did not pass, and
    every phase in ``metrics["upstream"]`` (the report reads a sequence's from its teardown); unchanged without
    ``--upstream`` (a gate run by hand, a teardown inside Gate 6)."""
    checks, metrics = result
    if not upstream:
        return checks, metrics
    phases = upstream_phases(upstream)
    carried = upstream_check(phases, what)
    return [*checks, *([carried] if carried else [])], {**metrics, UPSTREAM: phases}
