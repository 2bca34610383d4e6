"""A round whose engine stopped making progress: no token processed for N s while it holds requests.

A hung collective (one rank stuck in an NCCL all-reduce or all-to-all) stops every rank of the group: the
engine's HTTP server still answers, its requests stay "running", its token counters stop. Left alone, the
engine's own watchdog ends it after about 300 s (SGLang's ``--watchdog-timeout``, 300 by default,
sglang/srt/arg_groups/fields/device.py; vLLM's ``VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS``, 300, in
vllm/v1/executor/multiproc_executor.py), the client's requests then fail, and that looked like a transient
bench error: retried three times, each retry hanging again. So while a round runs, the sampler's readings
of the engine's token counter (``ENGINE.metrics["tokens_processed"]``, a counter each engine moves on every
prefill and decode step) are watched: when it has not moved for ``bench.hang_timeout_s`` while the engine
reports requests running or waiting, the round stops and fails naming the hang, and the ranks are read at
that moment to say whether they are all up (a hang) or one is gone (a rank failure). Never exit 75.

Pure judgement (:func:`stall_of`, :func:`longest_stall`, :func:`hang_reason`) over the sampler's samples
(steps/client/sampler.py) and the back end's ranks (steps/cluster/rank_watch.py ``Rank``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gauntlet.contract import GauntletError

if TYPE_CHECKING:
    from gauntlet.steps.cluster.rank_watch import Rank


__all__ = ["Stall", "EngineHang", "stall_of", "longest_stall", "hang_reason", "watch"]

TOKENS = "engine_tokens_processed"     # the sampler's key for ENGINE.metrics["tokens_processed"]


class EngineHang(GauntletError):
    """The engine made no progress for the profile's ``bench.hang_timeout_s`` during a round: a failed round
    (exit 1, never retried), its message naming what was seen."""


@dataclass(frozen=True)
class Stall:
    """The engine's token counter standing still at the latest readings."""

    seconds: float        # from the first reading of the current value to the latest reading
    busy: float           # requests running + waiting in the engine at the latest reading
    tokens: float         # the counter's value


def _readings(samples: Sequence[Mapping[str, Any]]) -> list[tuple[float, float, float]]:
    return [(float(s["t"]), float(s[TOKENS]), float(s.get("engine_running") or 0) + float(s.get("engine_waiting") or 0))
            for s in samples if s.get(TOKENS) is not None and s.get("t") is not None]


def stall_of(samples: Sequence[Mapping[str, Any]]) -> Stall | None:
    """How long the counter has stood still, measured between readings (a scrape that fails adds nothing);
    None without a reading of it."""
    r = _readings(samples)
    if not r:
        return None
    t_last, v_last, busy = r[-1]
    since = t_last
    for t, v, _ in reversed(r):
        if v != v_last:
            break
        since = t
    return Stall(t_last - since, busy, v_last)


def longest_stall(samples: Sequence[Mapping[str, Any]]) -> float | None:
    """The longest time the counter stood still while the engine held requests, in seconds (the round's
    evidence for choosing ``bench.hang_timeout_s``); None without a reading of it."""
    r = _readings(samples)
    if not r:
        return None
    longest, since = 0.0, None
    for (t0, v0, _), (t1, v1, busy) in zip(r, r[1:], strict=False):
        if v1 == v0 and busy > 0:
            since = t0 if since is None else since
            longest = max(longest, t1 - since)
        else:
            since = None
    return round(longest, 3)


def hang_reason(stall: Stall | None, limit_s: float, ranks: Sequence[Rank] | str | None) -> str | None:
    """Why the round is a hang, or None while it is not one. ``ranks``: the back end's ranks read now
    (``Rank`` records), or why they could not be read."""
    if stall is None or stall.busy <= 0 or stall.seconds < limit_s:
        return None
    seen = (f"the engine processed no token for {stall.seconds:.0f} s (bench.hang_timeout_s {limit_s:g}) with "
            f"{stall.busy:g} request(s) running or waiting, its token counter at {stall.tokens:.0f}")
    if isinstance(ranks, str) or ranks is None:
        return f"{seen}; its ranks could not be read ({ranks or 'none deployed'})"
    down = [r for r in ranks if not r.alive]
    if down:
        return f"{seen}; rank(s) {', '.join(f'{r.rank} ({r.where})' for r in down)} not running: a rank failure"
    return (f"{seen} while all {len(ranks)} rank(s) are up: a hung collective or forward step (the ranks' logs "
            "and py-spy dumps say where)")


def watch(samples: Callable[[], Sequence[Mapping[str, Any]]], limit_s: float,
          ranks: Callable[[], Sequence[Rank] | str | None]) -> Callable[[], str | None]:
    """The check the client runner polls during a round: a reason once the counter stood still for
    ``limit_s`` with requests in the engine; the ranks are read only then."""
    def check() -> str | None:
        st = stall_of(list(samples()))
        if st is None or st.busy <= 0 or st.seconds < limit_s:
            return None
        return hang_reason(st, limit_s, ranks())
    return check
