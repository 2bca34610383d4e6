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
           "median", "STABILITY_METRIC", "speculation", "token_counts", "engine_figures", "ENGINE_COLUMNS"]

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


def _first(*values: Any) -> float | None:
    return next((float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)), None)


def speculation(rec: dict[str, Any]) -> dict[str, float | None]:
    """One round's speculative-decoding figures (pure): the bench client's where it reported them (vLLM's client
    differences vLLM's own counters over the round), else the engine's own counters as the round's sampler
    differenced them (each engine's Prometheus names are its adapter's ``metrics``), by the engine's own
    definitions:

    - acceptance length: 1 + accepted / drafts where the engine counts accepted draft tokens (vLLM,
      vllm/benchmarks/serve.py), else output tokens / drafts, a draft being one verify step of one request
      (SGLang: completion_tokens / spec_verify_ct, sglang/srt/managers/tokenizer_manager.py
      ``_calculate_spec_decoding_metrics``; it counts each request's first, prefill token too, under 0.1% at
      1024 output tokens);
    - draft tokens: the engine's counter, else drafts x (verify window - 1) (SGLang's num_proposed_drafts, the
      window being its ``spec_num_draft_tokens`` gauge: the drafts and the bonus slot);
    - acceptance rate (%): accepted / draft tokens where both are counted (SGLang counts no accepted drafts).
    """
    res = rec.get("resources") or {}
    drafts = _first(rec.get("spec_decode_num_drafts"), res.get("engine_spec_drafts_delta"))
    accepted = _first(rec.get("spec_decode_accepted_tokens"), res.get("engine_spec_accepted_tokens_delta"))
    draft_tokens = _first(rec.get("spec_decode_draft_tokens"), res.get("engine_spec_draft_tokens_delta"))
    generated, window = _first(res.get("engine_generation_tokens_delta")), _first(res.get("engine_spec_verify_window"))
    if draft_tokens is None and drafts and window and window > 1:
        draft_tokens = drafts * (window - 1)
    length = _first(rec.get("spec_decode_acceptance_length"))
    if length is None and drafts:
        length = 1 + accepted / drafts if accepted is not None else generated / drafts if generated is not None else None
    rate = _first(rec.get("spec_decode_acceptance_rate"))
    if rate is None and accepted is not None and draft_tokens:
        rate = 100 * accepted / draft_tokens
    return {"acceptance_length": length, "acceptance_rate_pct": rate, "draft_tokens": draft_tokens,
            "accepted_tokens": accepted, "drafts": drafts}


# the engine's own figures beside every round (its /metrics over the round's window, steps/client/sampler.py), one
# set of columns for every engine: None where the engine reports none, the reason in the round's ``engine_notes``
ENGINE_COLUMNS = ("engine_running_max", "engine_waiting_max", "engine_kv_usage_max", "engine_kv_usage_mean",
                  "prefix_cache_hit_rate", "engine_preemptions", "engine_spec_acceptance_rate_pct",
                  "engine_spec_acceptance_length", "engine_prompt_tokens", "engine_generation_tokens")
_NOTE_OF = {"engine_running_max": "running", "engine_waiting_max": "waiting", "engine_kv_usage_max": "kv_usage",
            "engine_kv_usage_mean": "kv_usage", "prefix_cache_hit_rate": "prefix_cache_hit_rate",
            "engine_preemptions": "preemptions", "engine_prompt_tokens": "prompt_tokens",
            "engine_generation_tokens": "generation_tokens"}


def engine_figures(rec: Mapping[str, Any]) -> tuple[dict[str, float | None], dict[str, str]]:
    """(the round's :data:`ENGINE_COLUMNS`, why each None one is None) from its record (pure): the sampler's
    readings (``resources``) and the speculative figures of :func:`speculation`."""
    res = rec.get("resources") or {}
    notes = res.get("engine_notes") or {}
    spec = speculation(dict(rec))
    cols: dict[str, float | None] = {
        "engine_running_max": res.get("engine_running_max"), "engine_waiting_max": res.get("engine_waiting_max"),
        "engine_kv_usage_max": res.get("engine_kv_usage_max"), "engine_kv_usage_mean": res.get("engine_kv_usage_mean"),
        "prefix_cache_hit_rate": res.get("prefix_cache_hit_rate"),
        "engine_preemptions": res.get("engine_preemptions_delta"),
        "engine_spec_acceptance_rate_pct": spec["acceptance_rate_pct"],
        "engine_spec_acceptance_length": spec["acceptance_length"],
        "engine_prompt_tokens": res.get("engine_prompt_tokens_delta"),
        "engine_generation_tokens": res.get("engine_generation_tokens_delta")}
    why: dict[str, str] = {}
    for col, v in cols.items():
        if v is not None:
            continue
        if col in _NOTE_OF:
            why[col] = notes.get(_NOTE_OF[col]) or "not read"
        elif spec["drafts"] is None:
            why[col] = f"no speculative decoding counter: {notes.get('spec_drafts') or 'not read'}"
        elif not spec["drafts"]:
            why[col] = "the engine drafted nothing during the round (no speculative decoding)"
        else:
            why[col] = ("the engine counts no accepted draft tokens (its acceptance length is output tokens / "
                        "verify steps)" if col == "engine_spec_acceptance_rate_pct" else "not derivable")
    return cols, why


def token_counts(rec: Mapping[str, Any], tolerance: float) -> tuple[bool | None, str]:
    """The client's token counts against the engine's own counters over the round (pure): (agree, why). False when
    one pair is more than ``tolerance`` apart (relative to the client's count), naming both numbers; None when no
    pair could be compared (the engine reports no such counter), naming why. The sampler's window is the round's:
    its first scrape before the client's first request, its last after the client's last reply."""
    res = rec.get("resources") or {}
    notes = res.get("engine_notes") or {}
    ok, bad, unchecked = [], [], []
    for what, client, engine, key in (
            ("output", rec.get("total_output_tokens"), res.get("engine_generation_tokens_delta"), "generation_tokens"),
            ("prompt", rec.get("total_input_tokens"), res.get("engine_prompt_tokens_delta"), "prompt_tokens")):
        if client is None or engine is None:
            unchecked.append(f"{what} tokens not compared ({notes.get(key) or 'the client counted none'})")
            continue
        rel = abs(float(engine) - float(client)) / max(float(client), 1.0)
        line = f"{what} tokens: client {int(client)}, engine {float(engine):.0f} ({rel:.1%} apart"
        if rel > tolerance:
            bad.append(f"{line} > tolerance {tolerance:.1%})")
        else:
            ok.append(f"{line})")
    if bad:
        return False, "; ".join(bad + ok)
    if ok:
        return True, "; ".join(ok + unchecked)
    return None, "; ".join(unchecked)
