"""Option pieces several gates share: the endpoint flag's check and the results store.

A gate's ``Options.__post_init__`` calls :func:`check_endpoint` so a bad URL is a one-line UsageError naming
its flag before anything runs, and :func:`engine_option` the engine flag's (the profile's rule, naming the flag);
:class:`ResultsOptions` is the ``--results-uri`` flag and the one fallback (``Profile.results_store``) every
gate that reads or writes the store uses.
"""

from __future__ import annotations

from dataclasses import dataclass

from gauntlet.contract import UsageError
from gauntlet.steps.engine_client import normalize_endpoint
from gauntlet.steps.options import GateOptions, option

__all__ = ["check_endpoint", "engine_option", "ResultsOptions"]


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


@dataclass(frozen=True, kw_only=True)
class ResultsOptions(GateOptions):
    """``--results-uri`` and where the rounds really go: the flag, else $GAUNTLET_RESULTS_URI, else the profile's."""

    results_uri: str | None = option(None, help="results store (default: $GAUNTLET_RESULTS_URI or the profile's)")

    @property
    def results_store(self) -> str:
        return self.the_profile.results_store(self.results_uri)
