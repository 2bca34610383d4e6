"""Option pieces several gates share: the endpoint flag's check, the back-end override and the results store.

A gate's ``Options.__post_init__`` calls :func:`check_endpoint` so a bad URL is a one-line UsageError naming
its flag before anything runs, and :func:`engine_option` the engine flag's (the profile's rule, naming the flag);
:func:`backend_option` is the one ``--backend`` flag every gate that acts on the run's resources declares;
:class:`ResultsOptions` is the ``--results-uri`` flag and the one fallback (``Profile.results_store``) every
gate that reads or writes the store uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gauntlet.contract import UsageError
from gauntlet.params.models import BACKEND_KINDS
from gauntlet.steps.client.http import normalize_endpoint
from gauntlet.steps.options import GateOptions, option

__all__ = ["check_endpoint", "engine_option", "backend_option", "ResultsOptions"]


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
