"""Small, pure statistics for benchmark rounds: summaries, spread, round validity.

The plan reports the median of the rounds with min/max and IQR, never the best
round; a case is *stable* when every round is valid and the relative spread of
output throughput, (max - min) / median, stays within the profile's bound.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Summary", "summarize", "spread_rel", "round_validity", "client_bound", "CLIENT_BOUND_FRACTION", "cold_start", "Stability", "stability", "mad",
           "median", "STABILITY_METRIC"]

STABILITY_METRIC = "output_throughput"


def _finite(values: Iterable[Any]) -> list[float]:
    out = []
    for v in values:
        if v is None:
            continue
        f = float(v)
        if math.isfinite(f):
            out.append(f)
    return out


def _quantile(sorted_vals: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), without numpy."""
    if len(sorted_vals) == 1:
        return sorted_vals[0]
    pos = q * (len(sorted_vals) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def median(values: Iterable[Any]) -> float | None:
    vals = sorted(_finite(values))
    return _quantile(vals, 0.5) if vals else None


def mad(values: Iterable[Any]) -> float | None:
    """Median absolute deviation (unscaled)."""
    vals = _finite(values)
    m = median(vals)
    if m is None:
        return None
    return median(abs(v - m) for v in vals)


@dataclass(frozen=True)
class Summary:
    n: int
    median: float | None
    min: float | None
    max: float | None
    q1: float | None
    q3: float | None

    @property
    def iqr(self) -> float | None:
        return None if self.q1 is None or self.q3 is None else self.q3 - self.q1

    @property
    def spread_rel(self) -> float | None:
        """(max - min) / |median|; None when undefined (no values or median 0)."""
        if self.median is None or self.median == 0 or self.min is None or self.max is None:
            return None
        return (self.max - self.min) / abs(self.median)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "iqr": self.iqr, "spread_rel": self.spread_rel}


def summarize(values: Iterable[Any]) -> Summary:
    """Median, min, max and quartiles of the finite values (None and NaN are dropped)."""
    vals = sorted(_finite(values))
    if not vals:
        return Summary(0, None, None, None, None, None)
    return Summary(len(vals), _quantile(vals, 0.5), vals[0], vals[-1], _quantile(vals, 0.25), _quantile(vals, 0.75))


def spread_rel(values: Iterable[Any]) -> float | None:
    return summarize(values).spread_rel


def round_validity(result: Mapping[str, Any], num_prompts: int) -> tuple[bool, str]:
    """A round counts only if every prompt completed and none failed."""
    completed = result.get("completed")
    failed = result.get("failed", 0 if completed == num_prompts else None)
    if completed != num_prompts:
        return False, f"completed {completed} of {num_prompts} prompts"
    if failed != 0:
        return False, f"{failed} request(s) failed"
    return True, f"{completed}/{num_prompts} completed, 0 failed"


# A round whose throughput reaches this fraction of the client's own ceiling (the same client, requests
# and concurrency against a zero-cost server) is measuring the client as much as the engine.
CLIENT_BOUND_FRACTION = 0.5


def client_bound(result: Mapping[str, Any], ceiling: float | None) -> tuple[bool, str]:
    """(flagged, why) for one round against the client's ceiling in output tokens/s (pure)."""
    tput = result.get("output_throughput")
    if ceiling is None or not ceiling or tput is None:
        return False, "client ceiling unknown"
    frac = tput / ceiling
    if frac >= CLIENT_BOUND_FRACTION:
        return True, (f"client-bound: {tput:.4g} tok/s is {frac:.0%} of the client's own ceiling {ceiling:.4g} "
                      f"(>= {CLIENT_BOUND_FRACTION:.0%})")
    return False, f"{frac:.1%} of the client's ceiling {ceiling:.4g} tok/s"


def cold_start(result: Mapping[str, Any], factor: float) -> tuple[bool, str]:
    """(flagged, why): the round's first requests waited ``factor`` times its median TTFT or more (pure)."""
    first, med = result.get("first_ttft_ms"), result.get("p50_ttft_ms")
    if first is None or not med:
        return False, "first requests' TTFT unknown"
    ratio = first / med
    if ratio >= factor:
        return True, f"cold start: first requests' TTFT {first:.0f} ms is {ratio:.1f}x the median {med:.0f} ms"
    return False, f"first requests' TTFT {ratio:.1f}x the median"


@dataclass(frozen=True)
class Stability:
    stable: bool
    valid_rounds: int
    rounds: int
    spread_rel: float | None
    reason: str


def stability(rounds: Sequence[Mapping[str, Any]], spread_max_rel: float, expected_rounds: int,
              metric: str = STABILITY_METRIC) -> Stability:
    """Judge a case from its measured rounds (dicts with ``valid`` and ``metric``)."""
    valid = [r for r in rounds if r.get("valid")]
    spread = spread_rel(r.get(metric) for r in valid)
    if len(rounds) < expected_rounds:
        return Stability(False, len(valid), len(rounds), spread, f"{len(rounds)} of {expected_rounds} rounds ran")
    if len(valid) != len(rounds):
        return Stability(False, len(valid), len(rounds), spread,
                         f"{len(rounds) - len(valid)} of {len(rounds)} rounds invalid")
    if spread is None:
        return Stability(False, len(valid), len(rounds), None, f"{metric} spread undefined (no throughput)")
    if spread > spread_max_rel:
        return Stability(False, len(valid), len(rounds), spread,
                         f"{metric} spread {spread:.1%} > {spread_max_rel:.0%}")
    return Stability(True, len(valid), len(rounds), spread, f"{metric} spread {spread:.1%} <= {spread_max_rel:.0%}")
