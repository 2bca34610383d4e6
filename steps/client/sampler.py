"""What the machine and the engine did while a round ran, sampled alongside the client.

A background thread takes a sample every ``interval_s``: GPUs through
``nvidia-smi`` where it exists (utilisation, memory, power), otherwise host CPU
utilisation and the engine's resident memory; the engine's Prometheus
``/metrics`` (running/waiting requests, KV usage, cache and spec-decode
counters); ``/proc/net/dev`` byte counters are read at start and stop. Per-rank
expert load is recorded when the engine exposes a metric for it, else marked
unavailable. Parsers are pure and tested on real outputs; a source that is not
there is reported as such, never guessed.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx

from gauntlet.steps.client.http import EngineClient, normalize_endpoint
from gauntlet.steps.client.stall import longest_stall
from gauntlet.steps.engines import metric_names

__all__ = ["Sampler", "parse_nvidia_smi_csv", "parse_proc_net_dev", "parse_prometheus", "engine_gauges",
           "summarize_samples", "counter_delta", "COUNTERS", "cpu_times", "meminfo", "NVIDIA_QUERY"]

NVIDIA_QUERY = "index,utilization.gpu,memory.used,memory.total,power.draw"

# engine-neutral name -> metric names every engine's process exports (Prometheus' process collector); the
# engines' own names are each engine's ``metrics`` (gauntlet.steps.engines), read through the registry
PROCESS_GAUGES = {"engine_rss_bytes": ("process_resident_memory_bytes",)}


def gauges() -> dict[str, tuple[str, ...]]:
    """Engine-neutral name -> every registered engine's metric names for it, then the process' own."""
    return {**metric_names(), **PROCESS_GAUGES}


_LISTENERS: dict[int, int | None] = {}  # port -> pid of the process listening on it


@functools.cache
def _client(base: str) -> EngineClient:
    # one client per endpoint for every round: building one (its SSL context) costs ~50 ms, 1-2% of a short round
    return EngineClient(base, timeout_s=5.0)


def _strip_unit(v: str) -> float | None:
    v = v.strip()
    if not v or v.startswith("[") or v.lower() in ("n/a", "[n/a]", "not supported"):
        return None
    try:
        return float(v.split()[0])
    except ValueError:
        return None


def parse_nvidia_smi_csv(text: str) -> list[dict[str, float | None]]:
    """Rows of ``nvidia-smi --query-gpu=... --format=csv`` keyed by field name (units stripped)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return []
    header = [h.strip().split(" [")[0] for h in lines[0].split(",")]
    rows = []
    for ln in lines[1:]:
        cells = [c.strip() for c in ln.split(",")]
        if len(cells) != len(header):
            continue
        rows.append({h: _strip_unit(c) for h, c in zip(header, cells, strict=True)
                     if h in NVIDIA_QUERY.split(",")})
    return rows


def parse_proc_net_dev(text: str) -> dict[str, dict[str, int]]:
    """``/proc/net/dev`` -> {iface: {rx_bytes, tx_bytes}}."""
    out = {}
    for ln in text.splitlines()[2:]:
        if ":" not in ln:
            continue
        name, rest = ln.split(":", 1)
        f = rest.split()
        if len(f) >= 9:
            out[name.strip()] = {"rx_bytes": int(f[0]), "tx_bytes": int(f[8])}
    return out


def parse_prometheus(text: str) -> dict[str, float]:
    """Prometheus text -> {metric name: value summed over label sets} (no histograms' buckets)."""
    out: dict[str, float] = {}
    for ln in text.splitlines():
        if not ln or ln.startswith("#"):
            continue
        name_labels, _, rest = ln.partition(" ") if "{" not in ln else ln.partition("} ")
        name = name_labels.split("{", 1)[0].strip()
        if name.endswith("_bucket") or name.endswith("_created"):
            continue
        try:
            value = float(rest.split()[0])
        except (ValueError, IndexError):
            continue
        out[name] = out.get(name, 0.0) + value
    return out


def engine_gauges(metrics: Mapping[str, float]) -> dict[str, float | None]:
    """Engine-neutral readings from one scrape; absent ones are None."""
    res: dict[str, float | None] = {}
    for key, names in gauges().items():
        res[key] = next((metrics[n] for n in names if n in metrics), None)
    return res


def expert_load_metrics(metrics: Mapping[str, float]) -> list[str]:
    return sorted(n for n in metrics if "expert" in n.lower() and ("load" in n.lower() or "count" in n.lower()))


def cpu_times(text: str) -> tuple[float, float]:
    """``/proc/stat`` first line -> (busy, total) jiffies."""
    f = [float(x) for x in text.splitlines()[0].split()[1:]]
    idle = f[3] + (f[4] if len(f) > 4 else 0.0)
    total = sum(f[:8])
    return total - idle, total


def meminfo(text: str) -> dict[str, int]:
    out = {}
    for ln in text.splitlines():
        k, _, v = ln.partition(":")
        if v.strip():
            out[k.strip()] = int(v.split()[0]) * 1024
    return out


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


class Sampler:
    """Context manager: sample while the block runs, then :meth:`summary`."""

    def __init__(self, endpoint: str | None, interval_s: float = 1.0, nvidia_smi: str | None = "auto",
                 engine_metrics: Mapping[str, tuple[str, ...]] | None = None, counters_from_first_count: bool = False):
        self.endpoint = normalize_endpoint(endpoint) if endpoint else None
        # the engine's own names (its adapter's ``metrics``), for the reasons a reading is missing
        self.engine_metrics = engine_metrics
        self.counters_from_first_count = counters_from_first_count
        self.interval_s = interval_s
        self.nvidia_smi = shutil.which("nvidia-smi") if nvidia_smi == "auto" else nvidia_smi
        self.samples: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.net_start: dict[str, dict[str, int]] = {}
        self.net_end: dict[str, dict[str, int]] = {}
        self.metrics_start: dict[str, float] = {}
        self.metrics_end: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._client = _client(self.endpoint) if self.endpoint else None
        self._cpu_prev: tuple[float, float] | None = None
        self._t0 = 0.0
        self._t1 = 0.0

    def __enter__(self) -> Sampler:
        self._t0 = time.monotonic()
        self.net_start = parse_proc_net_dev(_read("/proc/net/dev") or "")
        self.metrics_start = self._scrape() or {}
        self._cpu_prev = self._cpu()
        self._thread = threading.Thread(target=self._loop, name="sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)
        self._t1 = time.monotonic()
        self.net_end = parse_proc_net_dev(_read("/proc/net/dev") or "")
        self.metrics_end = self._scrape() or {}

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.samples.append(self.sample())

    def _cpu(self) -> tuple[float, float] | None:
        text = _read("/proc/stat")
        return cpu_times(text) if text else None

    def _scrape(self) -> dict[str, float] | None:
        if self._client is None:
            return None
        try:
            return parse_prometheus(self._client.metrics_text())
        except httpx.HTTPError as exc:
            if len(self.errors) < 5:
                self.errors.append(f"/metrics: {type(exc).__name__}: {exc}")
            return None

    def sample(self) -> dict[str, Any]:
        s: dict[str, Any] = {"t": round(time.monotonic() - self._t0, 3)}
        m = self._scrape()
        if m is not None:
            s.update({f"engine_{k}": v for k, v in engine_gauges(m).items()})
            s["expert_load_metrics"] = expert_load_metrics(m)
        if self.nvidia_smi:
            try:
                out = subprocess.run([self.nvidia_smi, f"--query-gpu={NVIDIA_QUERY}", "--format=csv"],
                                     capture_output=True, text=True, timeout=10, check=False).stdout
                s["gpus"] = parse_nvidia_smi_csv(out)
            except (OSError, subprocess.TimeoutExpired) as exc:
                self.errors.append(f"nvidia-smi: {exc}")
        cur = self._cpu()
        if cur and self._cpu_prev and cur[1] > self._cpu_prev[1]:
            s["cpu_util"] = (cur[0] - self._cpu_prev[0]) / (cur[1] - self._cpu_prev[1])
        self._cpu_prev = cur
        mem = meminfo(_read("/proc/meminfo") or "")
        if mem.get("MemTotal"):
            s["host_mem_free_frac"] = mem.get("MemAvailable", 0) / mem["MemTotal"]
        rss = self._local_engine_rss()
        if rss is not None:
            s["engine_tree_rss_bytes"] = rss
        return s

    def _local_engine_rss(self) -> int | None:
        """RSS of the process tree listening on the endpoint's port, when it is on this machine."""
        if not self.endpoint:
            return None
        u = urlparse(self.endpoint)
        if u.hostname not in ("127.0.0.1", "localhost", "::1") or not u.port:
            return None
        try:
            import psutil
        except ImportError:
            return None
        try:
            pid = _LISTENERS.get(u.port)
            if pid is None or not psutil.pid_exists(pid):
                # scanning every socket is slow: once per port and process, not once per sample
                pid = next((c.pid for c in psutil.net_connections("tcp")
                            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == u.port and c.pid),
                           None)
                _LISTENERS[u.port] = pid
            if pid is None:
                return None
            root = psutil.Process(pid)
            return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
        except (psutil.Error, OSError):
            return None

    def summary(self) -> dict[str, Any]:
        return summarize_samples(self.samples, self.net_start, self.net_end, self.metrics_start, self.metrics_end,
                                 self._t1 - self._t0, self.errors, engine_metrics=self.engine_metrics,
                                 counters_from_first_count=self.counters_from_first_count)


def _vals(samples: list[dict[str, Any]], key: str) -> list[float]:
    return [s[key] for s in samples if s.get(key) is not None]


# the engine's counters differenced over a round (``engine_<key>_delta``): its scrape at the round's start and end
COUNTERS = ("prefix_queries", "prefix_hits", "spec_drafts", "spec_draft_tokens", "spec_accepted_tokens",
            "generation_tokens", "prompt_tokens", "preemptions")
# the engine's gauges sampled during a round (``engine_<key>_max``)
SAMPLED = ("running", "waiting", "kv_usage")


def counter_delta(key: str, start: Mapping[str, float], end: Mapping[str, float],
                  from_first_count: bool = False) -> float | None:
    """One engine counter's growth between two scrapes (pure). A counter absent from the first scrape and present
    in the last was created during the round (it starts at 0); absent from both, it is unknown, unless the engine's
    counters appear at their first count (``from_first_count``, SGLang's) and both scrapes read its other metrics:
    then it counted nothing."""
    g_start, g_end = engine_gauges(start).get(key), engine_gauges(end).get(key)
    if g_end is None and from_first_count and start and end:
        g_end = 0.0
    if g_end is None:
        return None
    return g_end - (g_start if g_start is not None else 0.0)


def _missing(key: str, engine_metrics: Mapping[str, tuple[str, ...]] | None, how: str) -> str:
    names = (engine_metrics or {}).get(key) if engine_metrics is not None else gauges().get(key)
    if engine_metrics is not None and not names:
        return "the engine's adapter names no metric for it (it does not report it)"
    return f"{' or '.join(names or ())} {how}"


def summarize_samples(samples: list[dict[str, Any]], net_start: Mapping[str, Mapping[str, int]],
                      net_end: Mapping[str, Mapping[str, int]], metrics_start: Mapping[str, float],
                      metrics_end: Mapping[str, float], elapsed_s: float, errors: list[str] | None = None, *,
                      engine_metrics: Mapping[str, tuple[str, ...]] | None = None,
                      counters_from_first_count: bool = False) -> dict[str, Any]:
    """Pure: the per-round resource record, including the memory headroom the C32 rule reads. ``engine_notes``
    says why each of the engine's readings is None (``engine_metrics``: its adapter's names, for the reason)."""
    out: dict[str, Any] = {"samples": len(samples), "elapsed_s": round(elapsed_s, 3)}
    notes: dict[str, str] = {}
    for key in ("engine_running", "engine_waiting", "engine_kv_usage", "cpu_util", "engine_tree_rss_bytes",
                "engine_engine_rss_bytes", "host_mem_free_frac"):
        v = _vals(samples, key)
        out[f"{key}_max"] = max(v) if v else None
        if key in ("cpu_util", "engine_kv_usage", "engine_running"):
            out[f"{key}_mean"] = sum(v) / len(v) if v else None
    out["host_mem_free_frac_min"] = min(_vals(samples, "host_mem_free_frac"), default=None)
    gpus = [g for s in samples for g in s.get("gpus", [])]
    if gpus:
        util = [g["utilization.gpu"] for g in gpus if g.get("utilization.gpu") is not None]
        used = [g["memory.used"] / g["memory.total"] for g in gpus if g.get("memory.used") is not None
                and g.get("memory.total")]
        power = [g["power.draw"] for g in gpus if g.get("power.draw") is not None]
        out.update(gpu_util_mean=sum(util) / len(util) if util else None, gpu_mem_used_frac_max=max(used, default=None),
                   gpu_power_w_max=max(power, default=None), gpu_source="nvidia-smi")
    else:
        out.update(gpu_util_mean=None, gpu_mem_used_frac_max=None, gpu_power_w_max=None,
                   gpu_source="unavailable: no nvidia-smi (CPU engine: cpu_util and RSS instead)")
    rx = tx = 0
    for iface, end in net_end.items():
        start = net_start.get(iface)
        if start and iface != "lo":
            rx += end["rx_bytes"] - start["rx_bytes"]
            tx += end["tx_bytes"] - start["tx_bytes"]
    lo_end, lo_start = net_end.get("lo"), net_start.get("lo")
    out["net_rx_bytes"], out["net_tx_bytes"] = rx, tx
    out["net_lo_bytes"] = (lo_end["rx_bytes"] - lo_start["rx_bytes"]) if lo_end and lo_start else None
    ge = engine_gauges(metrics_end)
    scraped = bool(metrics_start) and bool(metrics_end)
    for k in COUNTERS:
        out[f"engine_{k}_delta"] = d = counter_delta(k, metrics_start, metrics_end, counters_from_first_count)
        if d is None:
            notes[k] = ("/metrics did not answer at the round's start and end" + (f" ({errors[0]})" if errors else "")
                        if not scraped else _missing(k, engine_metrics, "not in the engine's /metrics at the round's end"))
    for k in SAMPLED:
        if out.get(f"engine_{k}_max") is None:
            notes[k] = (_missing(k, engine_metrics, f"not in any of the round's {len(samples)} /metrics samples")
                        if samples else "no sample during the round (it ended before the first)")
    # a gauge read at the round's end: the speculative verify window in use (SGLang's; Gate 6's draft tokens)
    out["engine_spec_verify_window"] = ge.get("spec_verify_window")
    q, h = out["engine_prefix_queries_delta"], out["engine_prefix_hits_delta"]
    out["prefix_cache_hit_rate"] = (h / q) if q and h is not None else None
    if out["prefix_cache_hit_rate"] is None:
        notes["prefix_cache_hit_rate"] = (f"prefix hits unknown: {notes['prefix_hits']}" if "prefix_hits" in notes
                                          else f"prefix queries unknown: {notes['prefix_queries']}"
                                          if "prefix_queries" in notes else
                                          "the engine looked up no prompt token in its prefix cache during the round")
    out["engine_notes"] = notes
    names = sorted({n for s in samples for n in s.get("expert_load_metrics", [])})
    out["expert_load"] = {"available": bool(names), "metrics": names} if names else \
        {"available": False, "reason": "the engine's /metrics exposes no per-rank expert load"}
    out["headroom"] = headroom(out)
    # the longest the engine's token counter stood still with requests in it (steps/client/stall.py)
    out["engine_stall_max_s"] = longest_stall(samples)
    out["errors"] = list(errors or [])[:5]
    return out


def headroom(rec: Mapping[str, Any]) -> float | None:
    """The KV cache left free at the round's peak (1 - the engine's KV usage gauge at its highest), what a
    doubled concurrency needs; None without a reading of that gauge (then a case gated on headroom stays
    locked, steps/gates/perf.py ``unlocks``).

    Only the engine's own KV usage says it: the engines allocate their KV pool at start-up (SGLang's
    ``--mem-fraction-static``, vLLM's ``--gpu-memory-utilization``), so the GPU memory nvidia-smi reports is
    that static pool whatever the load, and host memory says nothing about the GPUs (the cluster's bench pod
    has none). Both are still recorded per round (``gpu_mem_used_frac_max``, ``host_mem_free_frac_min``)."""
    kv = rec.get("engine_kv_usage_max")
    return None if kv is None else 1.0 - float(kv)
