"""Per-rank expert load of a perf case, from SGLang's expert distribution recorder.

SGLang 0.5.23 (``--expert-distribution-recorder-mode stat``) answers ``/start_expert_distribution_record``
(clear and record), ``/stop_expert_distribution_record`` and ``/dump_expert_distribution_record`` with text
only: on the dump its rank 0 writes ``expert_distribution_recorder_<epoch>.pt`` to
``SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR`` holding ``logical_count`` of shape (forward passes, layers, logical
experts), already summed across ranks; the recorder keeps the last ``expert_distribution_recorder_buffer_size``
passes (1000 unless set). The perf step starts the recorder before a case's measured rounds, stops and dumps
after them, and reads the dump where it was written: on a cluster rank 0's telemetry sidecar shares the dump
directory with the engine (an emptyDir, steps/backends/kubernetes/manifests.py) and serves it at ``/expert-load``; locally the
directory is on this machine. :func:`gauntlet.steps.cluster.telemetry.dump_counts` sums the passes.

Which rank holds which expert: without redundant experts SGLang's trivial placement
(``ExpertLocationMetadata.init_trivial``) makes physical expert ``i`` logical expert ``i`` in every layer, and
EP rank ``r`` holds the physical experts ``[r*E/ep, (r+1)*E/ep)``. With redundant experts or EPLB a logical
expert has several physical copies whose share is not in the dump: only the logical totals are reported.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import httpx

from gauntlet.params.models import EngineArgs, EngineSpec, Profile
from gauntlet.steps.engines import find

__all__ = ["MODES", "RECORDER_DIR_ENV", "placement", "summarize", "Recorder", "recorder_for"]

MODES = ("stat", "stat_approx")       # the modes whose dump is a logical_count (SGLang's _StatAccumulator)
TOP = 5
RECORDER_DIR_ENV = "SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR"
_NON_TRIVIAL = ("ep_num_redundant_experts", "enable_eplb", "init_expert_location")


def placement(args: EngineArgs) -> tuple[int | None, str]:
    """The EP size that maps experts to ranks, or None and why only logical totals can be reported."""
    extra = {k.lstrip("-").replace("-", "_"): v for k, v in args.extra.items()}      # flag or field spelling
    moved = [k for k in _NON_TRIVIAL if extra.get(k) not in (None, False, 0, "", "trivial")]
    if moved:
        return None, (f"{', '.join(moved)} set: redundant experts / EPLB move experts between ranks, which the "
                      "dump does not record; per-rank load not supported, logical totals only")
    if not args.ep_size or args.ep_size < 2:
        return None, "no expert parallelism (ep_size 1): every rank holds every expert; logical totals only"
    return args.ep_size, ""


def _imb(v: list[int]) -> float | None:
    m = sum(v) / len(v) if v else 0
    return max(v) / m if m else None


def summarize(counts: list[list[int]], ep_size: int | None, note: str = "", steps: int | None = None,
              top: int = TOP) -> dict[str, Any]:
    """Tokens routed per (layer, logical expert) -> per EP rank's tokens, the imbalance across ranks
    (max / mean of the per-rank totals, over the case and per layer) and the hottest (layer, expert) cells."""
    layers, experts = len(counts), len(counts[0]) if counts else 0
    total = sum(map(sum, counts))
    hot = sorted(((c, li, e) for li, row in enumerate(counts) for e, c in enumerate(row)), reverse=True)[:top]
    out: dict[str, Any] = {"steps": steps, "layers": layers, "experts": experts, "tokens": total,
                           "ep_size": None, "per_rank_tokens": None, "imbalance": None,
                           "imbalance_layer_mean": None, "imbalance_layer_max": None, "note": note}
    if ep_size and experts % ep_size:
        ep_size, out["note"] = None, (f"{experts} experts do not split over ep_size {ep_size}: SGLang's placement "
                                      "is not the trivial one; logical totals only")
    per = experts // ep_size if ep_size else 0
    out["hottest"] = [{"layer": li, "expert": e, "tokens": c, "rank": e // per if per else None,
                       "x_layer_mean": c * experts / sum(counts[li]) if sum(counts[li]) else None}
                      for c, li, e in hot if c]
    if not ep_size:
        return out
    by_layer = [[sum(row[r * per:(r + 1) * per]) for r in range(ep_size)] for row in counts]
    ranks = [sum(col) for col in zip(*by_layer)] if by_layer else [0] * ep_size
    li = [x for x in map(_imb, by_layer) if x is not None]
    out.update(ep_size=ep_size, per_rank_tokens=ranks, imbalance=_imb(ranks),
               imbalance_layer_mean=sum(li) / len(li) if li else None, imbalance_layer_max=max(li, default=None))
    return out


class Recorder:
    """Start SGLang's recorder before a case's measured rounds; stop, dump and summarise after them."""

    def __init__(self, base_url: str, args: EngineArgs, source: str, timeout_s: float = 60.0):
        self.base = base_url.rstrip("/").removesuffix("/v1")
        self.args, self.source, self.timeout_s = args, source, timeout_s   # source: a sidecar URL or a directory
        self.started: float | None = None

    def _post(self, what: str) -> None:
        httpx.post(f"{self.base}/{what}_expert_distribution_record", timeout=self.timeout_s).raise_for_status()

    def start(self) -> str | None:
        """Clear and start recording; the error (one line) when the engine refused."""
        try:
            self._post("start")
        except httpx.HTTPError as exc:
            self.started = None
            return _line(f"start_expert_distribution_record at {self.base}: {type(exc).__name__}: {exc}")
        self.started = time.time()
        return None

    def finish(self) -> dict[str, Any]:
        """Stop, dump, fetch the dump written since the stop and summarise it (or say why there is none)."""
        if self.started is None:
            return {"error": "the recorder was not started"}
        rec: dict[str, Any] = {"mode": self.args.expert_distribution_recorder_mode, "window": [round(self.started, 3)]}
        try:
            self._post("stop")
            since = time.time() - 1.0          # SGLang names the file by time.time() at its dump
            self._post("dump")
        except httpx.HTTPError as exc:
            return {**rec, "error": _line(f"stop/dump_expert_distribution_record at {self.base}: "
                                          f"{type(exc).__name__}: {exc}")}
        rec["window"].append(round(time.time(), 3))
        try:
            body = self._fetch(since)
        except (httpx.HTTPError, ValueError, OSError, ImportError) as exc:
            return {**rec, "error": _line(f"reading the dump from {self.source}: {type(exc).__name__}: {exc}")}
        if "counts" not in body:
            return {**rec, "error": _line(f"reading the dump from {self.source}: {body.get('error') or body}")}
        ep, note = placement(self.args)
        return {**rec, "file": body.get("file"), **summarize(body["counts"], ep, note, body.get("steps"))}

    def _fetch(self, since: float) -> dict[str, Any]:
        if self.source.startswith(("http://", "https://")):
            r = httpx.get(f"{self.source}/expert-load", params={"since": f"{since:.3f}"}, timeout=self.timeout_s)
            return r.json()
        from gauntlet.steps.cluster.telemetry import expert_load
        return expert_load(self.source, since)[1]


def _line(text: str) -> str:
    return text.splitlines()[0][:300] if text else text


def recorder_for(profile: Profile, engine: str, endpoint: str, rank0: str | None,
                 spec: EngineSpec | None = None) -> tuple[Recorder | None, str]:
    """The case hook for this engine, or None and why (naming the engine) when there is none.
    ``rank0``: rank 0's telemetry sidecar URL on a cluster (it shares the dump directory); ``spec``: the
    engine as deployed (a Gate 6 variant's), else the profile's."""
    spec = spec or (profile.engine(engine) if engine in profile.engines else None)
    eng = find(engine)
    if eng is None or not eng.expert_recorder or spec is None:
        return None, f"{engine} has no expert distribution interface (SGLang's recorder is the one read)"
    mode = spec.args.expert_distribution_recorder_mode
    if mode not in MODES:
        return None, (f"sglang: engines.sglang.args.expert_distribution_recorder_mode is {mode or 'unset'}; "
                      f"{' or '.join(MODES)} records the per-case load")
    if profile.hardware.kind == "kubernetes":
        if not rank0:
            return None, "sglang: no telemetry sidecar on rank 0 to read the dump from"
        return Recorder(endpoint, spec.args, rank0), ""
    where = spec.clear_env.get(RECORDER_DIR_ENV) or os.environ.get(RECORDER_DIR_ENV) or "/tmp"
    return Recorder(endpoint, spec.args, str(Path(where))), ""

