"""The rank watch's I/O: the engine's ranks read through the resource back end, and the two reads judged.

The step runner watches the deployed baseline for every gate that declares ``Needs.engine_ranks``
(steps/runner.py); Gate 6 watches each variant it deploys itself, from the variant's ready to the end of its
measurement (steps/gates/experiment.py). Both read and judge here, so both say the same thing in the same
words; the judgement is :func:`gauntlet.steps.cluster.rank_watch.judge`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from gauntlet.contract import Check, GauntletError

if TYPE_CHECKING:
    from gauntlet.params.models import Profile
    from gauntlet.steps.cluster.rank_watch import Rank

__all__ = ["snapshot", "check"]


def snapshot(profile: Profile, engine: str, out: Path, variant: str | None = None) -> list[Rank] | str | None:
    """The deployed engine's ranks (the baseline's, or ``variant``'s) through the profile's back end; None when
    none is deployed; a one-line reason when they cannot be read."""
    from gauntlet.steps.backends import backend_for
    try:
        return backend_for(profile).ranks(profile, engine, out, variant)
    except GauntletError as exc:
        return f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # the API unreachable, say: the gate's own result still stands
        return f"{type(exc).__name__}: {exc}".splitlines()[0]


def check(gate: str, before: list[Rank] | str | None, after: list[Rank] | str | None,
          redeployed: bool = False) -> Check:
    """The ``engine_ranks`` check: did every rank stay up, unrestarted, from the first read to the second?"""
    from gauntlet.steps.cluster.rank_watch import CHECK, judge
    for snap in (before, after):
        if isinstance(snap, str):
            return Check(CHECK, "skip", "every rank up from start to end", None,
                         f"the engine's ranks could not be read ({snap[:300]}): not watched")
    assert not isinstance(before, str) and not isinstance(after, str)
    return judge(gate, before, after, redeployed=redeployed)
