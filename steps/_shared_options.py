"""Option pieces several gates share: the engine flag's check, the endpoint flag's check, the results store.

A gate's ``Options.__post_init__`` calls :func:`check_engine` / :func:`check_endpoint` so a bad flag is a
one-line UsageError naming it before anything runs; :class:`ResultsOptions` is the ``--results-uri`` flag
and the one fallback (``Profile.results_store``) every gate that reads or writes the store uses.
"""

from __future__ import annotations

from dataclasses import dataclass

from gauntlet.contract import UsageError
from gauntlet.params import Profile
from gauntlet.steps.engine_client import normalize_endpoint
from gauntlet.steps.options import GateOptions, option

__all__ = ["check_engine", "check_endpoint", "ResultsOptions"]


def check_engine(profile: Profile, name: str | None, flag: str = "--engine") -> str:
    """The engine ``name`` names in the profile (the baseline when None); UsageError naming the flag."""
    try:
        return profile.engine_name(name)
    except UsageError as exc:
        raise UsageError(f"{flag} {name}: {exc}") from None


def check_endpoint(url: str | None, flag: str = "--endpoint") -> None:
    """UsageError naming the flag unless ``url`` is an http(s) URL (None: not given, nothing to check)."""
    if url is not None:
        normalize_endpoint(url, flag)


@dataclass(frozen=True, kw_only=True)
class ResultsOptions(GateOptions):
    """``--results-uri`` and where the rounds really go: the flag, else $GAUNTLET_RESULTS_URI, else the profile's."""

    results_uri: str | None = option(None, help="results store (default: $GAUNTLET_RESULTS_URI or the profile's)")

    @property
    def results_store(self) -> str:
        return self.the_profile.results_store(self.results_uri)
