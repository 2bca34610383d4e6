"""Per-rank telemetry: a sampler that runs beside each engine rank, on the rank's own node, and serves its samples.

What it reads, every ``--interval`` seconds (0.5 s by default):

- each GPU's utilisation (%), memory used and total (MiB), power draw (W) and SM clock (MHz), through NVML
  (``pynvml``, the ``nvidia-ml-py`` distribution); where NVML is not importable or does not initialise,
  ``nvidia-smi --query-gpu`` (the NVIDIA container runtime mounts it with the ``utility`` capability);
  otherwise the source says why there is none, and no number is guessed;
- the RDMA ports' ``/sys/class/infiniband/<dev>/ports/<port>/counters/port_{xmit,rcv}_data``, which count
  4-byte words (the IB spec's PortXmitData/PortRcvData), as bytes per second between two samples;
- the host's NICs from ``/proc/net/dev`` (the engine pods use hostNetwork, so this is the node's network
  namespace), as bytes per second; the physical ones (``/sys/class/net/<if>/device`` exists) are summed;
- with ``--container-memory``, its container's memory working set (the cgroup's usage less its inactive file
  pages, as the kubelet and cAdvisor count it for eviction): on the cluster the engine container's, which the
  sampler runs in, measured against what that container requests (steps/backends/kubernetes/manifests.py).

Why a process serving HTTP, not a file and not the perf step's own process: the perf step runs in a pod
with no GPU on another node, so what it reads of its own machine is the bench client's, never the
engine's. In the engine's container, started beside the engine by its launch script, the sampler sees the GPUs
the device plugin gave that container (a container without them sees none on a CDI runtime) and the host
network. It
keeps the last hours of samples in memory and answers ``GET /samples?since=<epoch>&until=<epoch>``
with that window, so the perf step asks each rank (``<sts>-<ordinal>.<headless>``) for each round's
window after the round: nothing is written on the node, no volume has to be shared across nodes (the
model cache is a read-only hostPath, the runs volume is not mounted into engine pods), and an
unreachable rank is an answer the report names. This is the shape of every node exporter a GPU cluster
already runs (node-exporter, NVIDIA's dcgm-exporter on :9400): an engineer can curl it. The window is
taken in each node's wall clock; NTP keeps nodes within milliseconds of each other, far below a round.
A profile that names the cluster's DCGM exporter through Prometheus instead is future work
(docs/performance.md).

On SGLang's rank 0 the sampler also serves ``GET /expert-load?since=<epoch>``: the newest expert distribution
dump SGLang wrote into ``--expert-dir`` (an emptyDir it shares with the engine container), summed over its
forward passes per (layer, logical expert); steps/cluster/expert_load.py turns it into per-rank load. Reading the
dump imports torch, which the engine image has.

This file imports nothing of gauntlet's: the engine pod runs it from its source with the engine image's
own Python (``python3 /tmp/gauntlet_telemetry.py serve ...``), as the NCCL probe runs. Locally the deploy
runs it as ``python -m gauntlet.steps.cluster.telemetry serve ... --exit-with <engine pid>``. The parsers and the
per-rank summary are pure and tested on real outputs (tests/fixtures/telemetry/).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

__all__ = ["SMI_QUERY", "CGROUP_ROOT", "container_memory", "parse_smi", "read_ib_counters", "parse_net_dev", "physical_ifaces", "rates", "Reader",
           "Sampler", "serve", "summarize_rank", "series", "cpu_times", "newest_dump", "dump_counts", "expert_load", "main"]

SMI_QUERY = "index,utilization.gpu,memory.used,memory.total,power.draw,clocks.sm"
IB_ROOT = "/sys/class/infiniband"
WORD_BYTES = 4              # port_xmit_data / port_rcv_data count 4-byte words


# ---------------------------------------------------------------- parsers (pure)

def _num(text: str) -> float | None:
    t = text.strip().split(" ")[0]
    try:
        return float(t)
    except ValueError:
        return None            # "[N/A]", "[Not Supported]", ""


def parse_smi(text: str) -> list[dict[str, Any]]:
    """``nvidia-smi --query-gpu=<SMI_QUERY> --format=csv,noheader,nounits`` -> one dict per GPU."""
    out = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 6 or not cells[0].isdigit():
            continue
        idx, util, used, total, power, sm = cells
        out.append({"index": int(idx), "util_pct": _num(util), "mem_used_mib": _num(used),
                    "mem_total_mib": _num(total), "power_w": _num(power), "sm_clock_mhz": _num(sm)})
    return out


def read_ib_counters(root: str | Path = IB_ROOT) -> dict[str, dict[str, int]]:
    """``{"<dev>/<port>": {"xmit_bytes", "rcv_bytes"}}`` from the RDMA ports' data counters (words x 4)."""
    out: dict[str, dict[str, int]] = {}
    base = Path(root)
    if not base.is_dir():
        return out
    for port in sorted(base.glob("*/ports/*")):
        c = port / "counters"
        try:
            tx = int((c / "port_xmit_data").read_text().split()[0])
            rx = int((c / "port_rcv_data").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        out[f"{port.parent.parent.name}/{port.name}"] = {"xmit_bytes": tx * WORD_BYTES, "rcv_bytes": rx * WORD_BYTES}
    return out


def parse_net_dev(text: str) -> dict[str, dict[str, int]]:
    """``/proc/net/dev`` -> ``{iface: {"rx_bytes", "tx_bytes"}}``."""
    out = {}
    for line in text.splitlines()[2:]:
        name, sep, rest = line.partition(":")
        f = rest.split()
        if sep and len(f) >= 9:
            out[name.strip()] = {"rx_bytes": int(f[0]), "tx_bytes": int(f[8])}
    return out


def physical_ifaces(names: Iterable[str], sys_net: str | Path = "/sys/class/net") -> list[str]:
    """The interfaces backed by a device (a NIC), not lo, bridges, veths or tunnels."""
    return sorted(n for n in names if n != "lo" and (Path(sys_net) / n / "device").exists())


def rates(prev: Mapping[str, Mapping[str, int]], cur: Mapping[str, Mapping[str, int]], dt: float
          ) -> dict[str, dict[str, float | None]]:
    """Per key, each counter's increase per second; None where it went backwards (a reset or a wrap)."""
    out: dict[str, dict[str, float | None]] = {}
    if dt <= 0:
        return out
    for key, c in cur.items():
        p = prev.get(key)
        if p is None:
            continue
        out[key] = {k: ((v - p[k]) / dt if v >= p[k] else None) for k, v in c.items() if k in p}
    return out


# ---------------------------------------------------------------- reading this node

class Reader:
    """One reading of this node: GPUs (NVML, else nvidia-smi, else none and why), RDMA and NIC counters."""

    def __init__(self, ib_root: str | Path = IB_ROOT, proc_net_dev: str = "/proc/net/dev",
                 sys_net: str | Path = "/sys/class/net", smi: str | None = "auto", nvml: bool = True):
        self.ib_root, self.proc_net_dev, self.sys_net = ib_root, proc_net_dev, sys_net
        self._nvml: Any = None
        self._handles: list[Any] = []
        why = []
        if nvml:
            try:
                import pynvml
                pynvml.nvmlInit()
                self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
                self._nvml = pynvml
            except ImportError:
                why.append("pynvml not importable")
            except Exception as exc:  # noqa: BLE001 - pynvml.NVMLError_*: no driver, no device
                why.append(f"NVML: {type(exc).__name__}: {exc}")
        self._smi = shutil.which("nvidia-smi") if smi == "auto" else smi
        if self._nvml is not None and not self._handles:
            # NVML loads (its library is mounted) but the container was given no device: what a container
            # without a GPU allocation sees on a CDI runtime
            why.append("NVML initialised but sees 0 GPUs (this container holds no GPU allocation)")
            self._nvml = None
            self._smi = None
            self.gpu_source = "none: " + "; ".join(why)
        elif self._nvml is not None:
            self.gpu_source = "nvml"
        elif self._smi:
            self.gpu_source = "nvidia-smi"
        else:
            self.gpu_source = "none: " + "; ".join([*why, "no nvidia-smi on PATH"])

    def gpus(self) -> list[dict[str, Any]]:
        if self._nvml is not None:
            return [self._nvml_gpu(i, h) for i, h in enumerate(self._handles)]
        if self._smi:
            try:
                out = subprocess.run([self._smi, f"--query-gpu={SMI_QUERY}", "--format=csv,noheader,nounits"],
                                     capture_output=True, text=True, timeout=10, check=False).stdout
            except (OSError, subprocess.TimeoutExpired):
                return []
            return parse_smi(out)
        return []

    def _nvml_gpu(self, i: int, h: Any) -> dict[str, Any]:
        n = self._nvml

        def get(fn: Any, *a: Any) -> Any:
            try:
                return fn(h, *a)
            except n.NVMLError:
                return None
        util, mem = get(n.nvmlDeviceGetUtilizationRates), get(n.nvmlDeviceGetMemoryInfo)
        power_mw = get(n.nvmlDeviceGetPowerUsage)
        return {"index": i, "util_pct": None if util is None else float(util.gpu),
                "mem_used_mib": None if mem is None else mem.used / 2**20,
                "mem_total_mib": None if mem is None else mem.total / 2**20,
                "power_w": None if power_mw is None else power_mw / 1000.0,
                "sm_clock_mhz": _float(get(n.nvmlDeviceGetClockInfo, n.NVML_CLOCK_SM))}

    def counters(self) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]]]:
        try:
            net = parse_net_dev(Path(self.proc_net_dev).read_text())
        except OSError:
            net = {}
        return read_ib_counters(self.ib_root), net


CGROUP_ROOT = "/sys/fs/cgroup"


def container_memory(root: str | Path = CGROUP_ROOT) -> int | None:
    """This container's memory working set in bytes: the cgroup's usage less its inactive file pages (cgroup v2
    ``memory.current`` and ``memory.stat`` ``inactive_file``; v1 ``memory/memory.usage_in_bytes`` and
    ``total_inactive_file``), as cAdvisor's working set, which the kubelet's eviction reads. None without one."""
    base = Path(root)
    for usage, stat, key in ((base / "memory.current", base / "memory.stat", "inactive_file"),
                             (base / "memory" / "memory.usage_in_bytes", base / "memory" / "memory.stat",
                              "total_inactive_file")):
        try:
            used = int(usage.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        inactive = 0
        for line in _read(str(stat)).splitlines():
            k, _, v = line.partition(" ")
            if k == key and v.strip().isdigit():
                inactive = int(v)
        return max(0, used - inactive)
    return None


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def cpu_times(text: str) -> tuple[float, float] | None:
    """``/proc/stat``'s first line -> (busy, total) jiffies (the host's CPUs: the engine's, locally)."""
    f = text.split("\n", 1)[0].split()[1:]
    try:
        v = [float(x) for x in f[:8]]
    except ValueError:
        return None
    if len(v) < 5:
        return None
    return sum(v) - v[3] - v[4], sum(v)


def _float(x: Any) -> float | None:
    return None if x is None else float(x)


class Sampler:
    """A thread taking one sample every ``interval_s`` into a ring of the last ``keep_s`` seconds."""

    def __init__(self, reader: Reader, interval_s: float = 0.5, keep_s: float = 6 * 3600,
                 cgroup: str | Path | None = None):
        self.reader, self.interval_s, self.cgroup = reader, interval_s, cgroup
        self.samples: collections.deque[dict[str, Any]] = collections.deque(maxlen=max(10, int(keep_s / interval_s)))
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._prev: tuple[float, dict[str, Any], dict[str, Any]] | None = None
        self._cpu: tuple[float, float] | None = None
        self.physical: list[str] = []

    def sample(self) -> dict[str, Any]:
        t = time.time()
        gpus = self.reader.gpus()
        ib, net = self.reader.counters()
        if not self.physical:
            self.physical = physical_ifaces(net, self.reader.sys_net) or sorted(n for n in net if n != "lo")
        s: dict[str, Any] = {"t": round(t, 3), "gpus": gpus}
        cpu = cpu_times(_read("/proc/stat"))
        if cpu and self._cpu and cpu[1] > self._cpu[1]:
            s["cpu_pct"] = round(100.0 * (cpu[0] - self._cpu[0]) / (cpu[1] - self._cpu[1]), 1)
        self._cpu = cpu
        if self.cgroup is not None and (mem := container_memory(self.cgroup)) is not None:
            s["container_mem_bytes"] = mem
        if self._prev is not None:
            dt = t - self._prev[0]
            s["rdma"] = {k: {"tx_Bps": v.get("xmit_bytes"), "rx_Bps": v.get("rcv_bytes")}
                         for k, v in rates(self._prev[1], ib, dt).items()}
            s["nic"] = {k: {"rx_Bps": v.get("rx_bytes"), "tx_Bps": v.get("tx_bytes")}
                        for k, v in rates(self._prev[2], net, dt).items() if k in self.physical}
        self._prev = (t, ib, net)
        with self._lock:
            self.samples.append(s)
        return s

    def window(self, since: float, until: float) -> list[dict[str, Any]]:
        with self._lock:
            return [s for s in self.samples if since <= s["t"] <= until]

    def run(self, exit_with: int | None = None) -> None:
        while not self._stop.is_set():
            self.sample()
            if exit_with is not None and not _alive(exit_with):
                self._stop.set()
                break
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:   # a zombie (exited, not yet reaped) is gone for us
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return True


# ---------------------------------------------------------------- SGLang's expert distribution dumps

def newest_dump(directory: str | Path, since: float = 0.0) -> Path | None:
    """The newest ``expert_distribution_recorder_<epoch>.pt`` SGLang's rank 0 wrote in ``directory`` at or
    after ``since`` (epoch seconds, from the name SGLang gives it: ``time.time()`` when it dumped)."""
    best: tuple[float, Path] | None = None
    for f in Path(directory).glob("expert_distribution_recorder_*.pt"):
        try:
            t = float(f.name[len("expert_distribution_recorder_"):-len(".pt")])
        except ValueError:
            continue
        if t >= since and (best is None or t > best[0]):
            best = (t, f)
    return None if best is None else best[1]


def dump_counts(path: str | Path) -> dict[str, Any]:
    """A ``stat``-mode dump (``{"rank", "logical_count": (steps, layers, logical experts), ...}``, already summed
    across ranks by SGLang) -> the tokens routed to each (layer, logical expert) over its steps. Needs torch: the
    engine image has it (this runs beside the engine, in its image)."""
    import torch
    d = torch.load(str(path), map_location="cpu", weights_only=True)
    c = d.get("logical_count") if isinstance(d, dict) else None
    if not isinstance(c, torch.Tensor) or c.dim() != 3:
        raise ValueError(f"{Path(path).name}: no logical_count of shape (steps, layers, experts): not a stat-mode dump")
    return {"file": Path(path).name, "steps": int(c.shape[0]), "layers": int(c.shape[1]),
            "experts": int(c.shape[2]), "counts": c.to(torch.int64).sum(dim=0).tolist()}


def expert_load(directory: str | Path | None, since: float, wait_s: float = 10.0) -> tuple[int, dict[str, Any]]:
    """(HTTP status, body) for the newest dump since ``since``, waiting up to ``wait_s`` for rank 0 to write it."""
    if not directory:
        return 404, {"error": "this sampler has no --expert-dir (the engine records no expert distribution)"}
    deadline = time.monotonic() + wait_s
    while (f := newest_dump(directory, since)) is None and time.monotonic() < deadline:
        time.sleep(0.5)
    if f is None:
        return 404, {"error": f"no expert distribution dump in {directory} since {since:.3f}"}
    try:
        return 200, dump_counts(f)
    except ImportError:
        return 500, {"error": "torch is not importable beside the engine: cannot read the dump"}
    except Exception as exc:  # noqa: BLE001 - torch.load's errors on a truncated or foreign file are many
        return 500, {"error": f"{f.name}: {type(exc).__name__}: {exc}".splitlines()[0][:300]}


# ---------------------------------------------------------------- the HTTP face

def serve(sampler: Sampler, host: str, port: int, expert_dir: str | None = None) -> ThreadingHTTPServer:
    """``GET /health``, ``GET /samples?since=&until=`` (epoch seconds) and ``GET /expert-load?since=`` (the
    newest SGLang expert distribution dump in ``expert_dir``, summed over its steps) as JSON; returns the
    started server."""
    info = {"host": socket.gethostname(), "node": os.environ.get("NODE_NAME"), "pod": os.environ.get("POD_NAME"),
            "gpu_source": sampler.reader.gpu_source, "interval_s": sampler.interval_s}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            u = urlparse(self.path)
            q = parse_qs(u.query)
            try:
                since = float(q.get("since", ["0"])[0])
                until = float(q.get("until", ["inf"])[0])
            except ValueError:
                return self._reply(400, {"error": "since/until: epoch seconds"})
            if u.path == "/health":
                return self._reply(200, {**info, "ok": True, "samples": len(sampler.samples)})
            if u.path == "/samples":
                return self._reply(200, {**info, "physical_nics": sampler.physical,
                                         "samples": sampler.window(since, until)})
            if u.path == "/expert-load":
                return self._reply(*expert_load(expert_dir, since))
            return self._reply(404, {"error": f"no {u.path}: /health, /samples, /expert-load"})

        def _reply(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    srv = ThreadingHTTPServer((host, port), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, name="telemetry-http", daemon=True).start()
    return srv


# ---------------------------------------------------------------- one rank's round (pure)

def _mean(v: list[float]) -> float | None:
    return sum(v) / len(v) if v else None


def _sums(samples: list[dict[str, Any]], key: str, field: str) -> list[float]:
    """Per sample, ``field`` summed over the sample's ``key`` entries (ports or NICs); samples without any skipped."""
    out = []
    for s in samples:
        vals = [e.get(field) for e in (s.get(key) or {}).values()]
        vals = [v for v in vals if v is not None]
        if vals:
            out.append(sum(vals))
    return out


def summarize_rank(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """A rank's round: GPU utilisation mean/max (over GPUs and samples), memory used max and total, power per
    GPU mean/max and the node's total mean, SM clock mean, RDMA and NIC GB/s (the ports', the NICs' sum) mean/max."""
    g = [x for s in samples for x in s.get("gpus") or []]

    def col(k: str) -> list[float]:
        return [x[k] for x in g if x.get(k) is not None]
    util, mem, power, sm = col("util_pct"), col("mem_used_mib"), col("power_w"), col("sm_clock_mhz")
    node_power = [sum(p) for s in samples if (p := [x["power_w"] for x in s.get("gpus") or []
                                                    if x.get("power_w") is not None])]
    out: dict[str, Any] = {
        "samples": len(samples), "gpus": max((len(s.get("gpus") or []) for s in samples), default=0),
        "gpu_util_mean": _mean(util), "gpu_util_max": max(util, default=None),
        "gpu_mem_used_gib_max": max(mem, default=None) and max(mem) / 1024,
        "gpu_mem_total_gib": max(col("mem_total_mib"), default=None) and max(col("mem_total_mib")) / 1024,
        "power_w_mean": _mean(power), "power_w_max": max(power, default=None),
        "node_power_w_mean": _mean(node_power), "sm_clock_mhz_mean": _mean(sm),
        "cpu_util_mean": _mean([s["cpu_pct"] for s in samples if s.get("cpu_pct") is not None]),
        "container_mem_gib_max": max((s["container_mem_bytes"] / 2**30 for s in samples
                                      if s.get("container_mem_bytes") is not None), default=None),
    }
    for name, key, field in (("rdma_tx", "rdma", "tx_Bps"), ("rdma_rx", "rdma", "rx_Bps"),
                             ("nic_tx", "nic", "tx_Bps"), ("nic_rx", "nic", "rx_Bps")):
        v = _sums(samples, key, field)
        mean = _mean(v)
        out[f"{name}_gbps_mean"] = None if mean is None else mean / 1e9
        out[f"{name}_gbps_max"] = None if not v else max(v) / 1e9
    out["rdma_ports"] = sorted({k for s in samples for k in (s.get("rdma") or {})})
    return out


def series(samples: list[dict[str, Any]], t0: float, points: int = 200) -> list[list[float | None]]:
    """``[seconds since t0, GPU util mean, node power W, memory used GiB max, RDMA+NIC GB/s]`` per sample,
    thinned to at most ``points`` (what the report plots over the round's time)."""
    step = max(1, -(-len(samples) // points))
    out = []
    for s in samples[::step]:
        gp = s.get("gpus") or []
        u = [x["util_pct"] for x in gp if x.get("util_pct") is not None]
        p = [x["power_w"] for x in gp if x.get("power_w") is not None]
        m = [x["mem_used_mib"] for x in gp if x.get("mem_used_mib") is not None]
        net = sum(_sums([s], "rdma", "tx_Bps") + _sums([s], "rdma", "rx_Bps") + _sums([s], "nic", "tx_Bps")
                  + _sums([s], "nic", "rx_Bps"))
        out.append([round(s["t"] - t0, 2), _mean(u), sum(p) if p else None, max(m) / 1024 if m else None,
                    net / 1e9])
    return out


# ---------------------------------------------------------------- command line

def _stop(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt       # the serve loop's way out: the HTTP server shut down, exit 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gauntlet-telemetry", description="sample this node's GPUs, RDMA ports and "
                                 "NICs and serve the samples over HTTP")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--host", default="0.0.0.0")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--interval", type=float, default=0.5)
    s.add_argument("--keep-s", type=float, default=6 * 3600)
    s.add_argument("--exit-with", type=int, default=None, help="exit when this pid is gone (the local engine)")
    s.add_argument("--ready-file", default=None, help="write the port here once serving")
    s.add_argument("--container-memory", action="store_true", help="sample this container's memory working set "
                   f"(its cgroup under {CGROUP_ROOT}): set where the sampler runs in the engine's container")
    s.add_argument("--expert-dir", default=None, help="where SGLang's rank 0 writes its expert distribution dumps "
                   "(SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR), served at /expert-load")
    a = ap.parse_args(argv)
    # Where it runs as PID 1 of a container (as the sidecar it was), a signal with no handler is ignored: without
    # this, deleting the engine's pod would wait the whole termination grace period for the sampler while
    # the engine's GPUs stay held.
    signal.signal(signal.SIGTERM, _stop)
    if not 0 < a.interval <= 600 or not 0 < a.port < 65536:
        ap.error("--interval in (0, 600], --port in 1..65535")
    sampler = Sampler(Reader(), a.interval, a.keep_s, CGROUP_ROOT if a.container_memory else None)
    try:
        srv = serve(sampler, a.host, a.port, a.expert_dir)
    except OSError as exc:
        print(f"gauntlet-telemetry: cannot listen on {a.host}:{a.port}: {exc}", flush=True)
        return 1
    print(f"gauntlet-telemetry: serving on {a.host}:{a.port}, GPUs from {sampler.reader.gpu_source}, "
          f"every {a.interval}s", flush=True)
    if a.ready_file:
        Path(a.ready_file).write_text(str(srv.server_address[1]))
    try:
        sampler.run(a.exit_with)
    except KeyboardInterrupt:
        pass
    srv.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
