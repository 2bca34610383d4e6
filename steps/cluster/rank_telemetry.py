"""The perf step's side of per-rank telemetry: where each rank's sampler is, and what it saw in a round.

The sampler (:mod:`gauntlet.steps.cluster.telemetry`) runs beside every engine rank: on Kubernetes a
``telemetry`` container in the engine's pod (steps/backends/kubernetes/manifests.py), reached through the headless
Service's per-rank name ``<sts>-<ordinal>.<headless>.<ns>.svc.cluster.local:<hardware.telemetry.port>``;
locally a process the deploy started beside the engine, recorded in the engine's state file. After each
round the perf step asks every rank for the round's window (:func:`round_telemetry`); a rank that does
not answer is recorded as unreachable, with its name and why, never left out or filled from the
client's own machine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from gauntlet.contract import Check
from gauntlet.params.models import Profile
from gauntlet.steps.cluster.telemetry import series, summarize_rank

__all__ = ["Target", "targets", "round_telemetry", "aggregate", "gpu_source_check", "GPU_SOURCE_CHECK",
           "no_gpu_source"]

GPU_SOURCE_CHECK = "telemetry/gpu-source"

Target = tuple[int, str, str]        # (rank, base URL, where: pod / node or "local")


def _variant_of(experiment: str) -> str | None:
    return None if experiment == "baseline" or experiment.endswith(":baseline") else experiment


def targets(profile: Profile, engine: str, out: Path, experiment: str = "baseline") -> tuple[list[Target], str]:
    """Every rank's sampler, and a note when there is none to ask (why): the back end knows where they run."""
    from gauntlet.steps.backends import backend_for
    return backend_for(profile).telemetry_targets(profile, engine, out, _variant_of(experiment))


def _one(target: Target, since: float, until: float, timeout_s: float) -> dict[str, Any]:
    rank, url, where = target
    rec: dict[str, Any] = {"rank": rank, "where": where, "url": url}
    try:
        r = httpx.get(f"{url}/samples", params={"since": f"{since:.3f}", "until": f"{until:.3f}"},
                      timeout=timeout_s)
        r.raise_for_status()
        body = r.json()
        samples = list(body["samples"])
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        why = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        return {**rec, "reachable": False, "error": f"rank {rank} ({where}) telemetry unreachable at {url}: {why}"}
    rec.update(reachable=True, gpu_source=str(body.get("gpu_source")), node=body.get("node") or body.get("host"),
               **summarize_rank(samples), series=series(samples, since))
    if not samples:
        rec["error"] = f"rank {rank} ({where}): the sampler answered with no sample in the round's window"
    return rec


def round_telemetry(tgts: list[Target], since: float, until: float, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """Each rank's summary of the window [since, until] (epoch seconds), in rank order."""
    return [_one(t, since, until, timeout_s) for t in tgts]


def aggregate(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """The round's columns of the main table: over the reachable ranks (util mean of means, maxima of maxima),
    and which ranks did not answer."""
    ok = [r for r in ranks if r.get("reachable") and r.get("samples")]

    def vals(k: str) -> list[float]:
        return [r[k] for r in ok if r.get(k) is not None]
    util, total = vals("gpu_util_mean"), vals("gpu_mem_total_gib")
    used = [r["gpu_mem_used_gib_max"] / r["gpu_mem_total_gib"] for r in ok
            if r.get("gpu_mem_used_gib_max") is not None and r.get("gpu_mem_total_gib")]
    return {"gpu_util_mean": sum(util) / len(util) if util else None,
            "gpu_mem_used_frac_max": max(used, default=None), "gpu_power_w_max": max(vals("power_w_max"), default=None),
            "gpu_source": ", ".join(sorted({str(r.get("gpu_source")) for r in ok})) or None,
            "unreachable": [r.get("error") for r in ranks if not r.get("reachable") or not r.get("samples")],
            "gpu_mem_total_gib": max(total, default=None)}


def no_gpu_source(record: dict[str, Any]) -> str | None:
    """The sampler's own reason when a rank's record (:func:`round_telemetry`) says it answered but reads no GPU
    (``gpu_source`` ``none: ...``, or none given: steps/cluster/telemetry.py ``Reader``); None otherwise, a rank that
    never answered included (that is named as unreachable)."""
    if not (record.get("reachable") and record.get("samples")):
        return None
    source = str(record.get("gpu_source"))
    return source if source.startswith("none") or source in ("", "None") else None


def gpu_source_check(records: list[dict[str, Any]], gpus_per_node: int) -> Check | None:
    """On a GPU profile, did every rank's sampler read its node's GPUs? ``records``: every rank record of every
    round (:func:`round_telemetry`). A sampler that answers but reads no GPU (its source ``none: ...``, or fewer
    GPUs than the node has) fails: the round's GPU figures (utilisation, memory headroom, power) would be empty
    while the run goes on. No sampler answering at all is a skip naming why (the report names each rank too);
    None on a profile without GPUs."""
    if gpus_per_node < 1:
        return None
    want = f"every rank's sampler reads its node's {gpus_per_node} GPU(s)"
    seen = [r for r in records if r.get("reachable") and r.get("samples")]
    if not seen:
        why = next((r.get("error") for r in records if r.get("error")), None) or "no round was sampled"
        return Check(GPU_SOURCE_CHECK, "skip", want, None, f"no rank's sampler answered: {why}")
    bad: dict[int, str] = {}
    for r in seen:
        source = str(r.get("gpu_source"))
        if no_gpu_source(r) is not None:
            bad.setdefault(int(r["rank"]), f"rank {r['rank']} ({r.get('where')}): no GPU source ({source})")
        elif int(r.get("gpus") or 0) < gpus_per_node:
            bad.setdefault(int(r["rank"]), f"rank {r['rank']} ({r.get('where')}): {source} reads {r.get('gpus') or 0} "
                                           f"of {gpus_per_node} GPUs")
    if bad:
        return Check(GPU_SOURCE_CHECK, "fail", want, sorted(bad),
                     "; ".join(bad[k] for k in sorted(bad)) + ": the rounds' GPU figures (utilisation, memory "
                     "headroom, power) are empty or partial; the sampler runs in the engine container, which holds "
                     "the GPUs (steps/backends/kubernetes/manifests.py sampler_lines): read its line in the rank's log")
    sources = sorted({str(r.get("gpu_source")) for r in seen})
    silent = sorted({int(r["rank"]) for r in records} - {int(r["rank"]) for r in seen})
    return Check(GPU_SOURCE_CHECK, "pass", want, sources,
                 f"{len({r['rank'] for r in seen})} rank(s) read {gpus_per_node} GPU(s) each through "
                 f"{', '.join(sources)}" + (f"; rank(s) {', '.join(map(str, silent))} never answered (named in the "
                                            "report)" if silent else ""))
