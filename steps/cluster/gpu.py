"""GPU inventory and health: nvidia-smi parsers, NVML, a torch probe, and their pure judgement.

Parsers turn real ``nvidia-smi`` text into :class:`GpuInventory`; :func:`probe_gpus`
measures each card with torch (device copy bandwidth counting read + write, bf16
matmul rate, a one-rank NCCL all-reduce); :func:`judge_inventory` and
:func:`judge_probe` compare them with the profile's :class:`gauntlet.params.models.Hardware`
and return checks. Only ``collect_*`` and ``probe_*`` do I/O.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from gauntlet.params.models import GpuProbeSpec, Hardware
from gauntlet.contract import Check

__all__ = [
    "QUERY_FIELDS", "GpuInfo", "GpuInventory", "ProbeResult",
    "parse_query_csv", "parse_smi_q", "inventory_from_smi", "inventory_from_nvml", "collect_inventory",
    "version_at_least", "model_matches", "judge_inventory", "probe_gpus", "judge_probe",
]

# What `nvidia-smi --query-gpu=... --format=csv` is asked for; the parser reads the header, so any subset works.
QUERY_FIELDS = (
    "index", "name", "uuid", "pci.bus_id", "memory.total", "memory.used", "memory.free", "driver_version",
    "persistence_mode", "temperature.gpu", "power.draw", "power.limit", "clocks.current.sm", "clocks.max.sm",
    "utilization.gpu", "ecc.errors.uncorrected.volatile.total", "compute_cap",
)


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    uuid: str = ""
    bus_id: str = ""
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    driver: str | None = None
    persistence: bool | None = None
    ecc_uncorrected: int | None = None
    compute_cap: str | None = None
    sm_clock_max_mhz: int | None = None
    slowdown: tuple[str, ...] = ()          # active HW/SW slowdown reasons (throttling)
    retired_pending: bool | None = None     # row remap / page retirement pending


@dataclass(frozen=True)
class GpuInventory:
    gpus: tuple[GpuInfo, ...]
    driver: str | None = None
    cuda: str | None = None
    source: str = "nvidia-smi"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _num(text: str | None) -> float | None:
    """'143771 MiB' -> 143771.0; 'N/A', '[Not Supported]' -> None."""
    if text is None:
        return None
    m = re.match(r"^\s*(-?[0-9]+(?:\.[0-9]+)?)", text)
    return float(m.group(1)) if m else None


def _int(text: str | None) -> int | None:
    v = _num(text)
    return None if v is None else int(v)


def _onoff(text: str | None) -> bool | None:
    t = (text or "").strip().lower()
    return {"enabled": True, "on": True, "disabled": False, "off": False}.get(t)


def parse_query_csv(text: str) -> list[dict[str, str]]:
    """Rows of ``--format=csv`` output keyed by field name (units stripped from the header)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return []
    header = [re.sub(r"\s*\[.*\]$", "", h.strip()) for h in lines[0].split(",")]
    rows = []
    for ln in lines[1:]:
        cells = [c.strip() for c in ln.split(",")]
        if len(cells) != len(header):
            raise ValueError(f"nvidia-smi csv: {len(cells)} cells for {len(header)} columns in {ln!r}")
        rows.append(dict(zip(header, cells, strict=True)))
    return rows


_KV = re.compile(r"^(\s*)(\S.*?)\s+:\s?(.*)$")


def parse_smi_q(text: str) -> dict[str, Any]:
    """``nvidia-smi -q`` as a nested dict: sections by indentation, ``key : value`` leaves."""
    root: dict[str, Any] = {}
    stack: list[tuple[int, dict[str, Any]]] = [(-1, root)]
    for raw in text.splitlines():
        if not raw.strip() or raw.lstrip().startswith("====="):
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        m = _KV.match(raw)
        if m:
            parent[m.group(2).strip()] = m.group(3).strip()
        else:
            sect: dict[str, Any] = {}
            parent[raw.strip()] = sect
            stack.append((indent, sect))
    return root


def _get(d: dict[str, Any], *path: str) -> Any:
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return None
        d = d[p]
    return d


def _q_gpu_facts(sect: dict[str, Any]) -> dict[str, Any]:
    """Facts the csv lacks (or states less precisely), from one GPU's -q section."""
    vol = _get(sect, "ECC Errors", "Volatile") or {}
    unc = [v for k, v in vol.items() if isinstance(v, str) and "Uncorrectable" in k]
    ecc = sum(_int(v) or 0 for v in unc) if any(_int(v) is not None for v in unc) else None
    reasons = _get(sect, "Clocks Event Reasons") or {}
    slow = []

    def walk(d: dict[str, Any]) -> None:
        for k, v in d.items():
            if isinstance(v, dict):
                walk(v)
            elif ("Slowdown" in k or "Power Brake" in k or "Power Cap" in k) and str(v).strip() == "Active":
                slow.append(k)
    walk(reasons)
    remap = _get(sect, "Remapped Rows", "Pending")
    return {
        "name": _get(sect, "Product Name"),
        "uuid": _get(sect, "GPU UUID"),
        "persistence": _onoff(_get(sect, "Persistence Mode")),
        "memory_total_mib": _int(_get(sect, "FB Memory Usage", "Total")),
        "memory_used_mib": _int(_get(sect, "FB Memory Usage", "Used")),
        "ecc_uncorrected": ecc,
        "sm_clock_max_mhz": _int(_get(sect, "Max Clocks", "SM")),
        "slowdown": tuple(slow),
        "retired_pending": None if remap is None else str(remap).strip().lower() == "yes",
    }


def inventory_from_smi(csv_text: str, q_text: str | None = None) -> GpuInventory:
    """Merge the csv query (one row per GPU) with ``-q`` (driver, CUDA, ECC detail, persistence, throttling)."""
    gpus: list[GpuInfo] = []
    for r in parse_query_csv(csv_text):
        gpus.append(GpuInfo(
            index=int(r.get("index", len(gpus))), name=r.get("name", ""), uuid=r.get("uuid", ""),
            bus_id=r.get("pci.bus_id", ""), memory_total_mib=_int(r.get("memory.total")),
            memory_used_mib=_int(r.get("memory.used")), driver=r.get("driver_version"),
            persistence=_onoff(r.get("persistence_mode")),
            ecc_uncorrected=_int(r.get("ecc.errors.uncorrected.volatile.total")),
            compute_cap=r.get("compute_cap"), sm_clock_max_mhz=_int(r.get("clocks.max.sm"))))
    driver = next((g.driver for g in gpus if g.driver), None)
    cuda = None
    if q_text:
        q = parse_smi_q(q_text)
        driver = q.get("Driver Version") or driver
        cuda = q.get("CUDA Version")
        sections = {k.split(" ", 1)[1].lower(): v for k, v in q.items()
                    if k.startswith("GPU ") and isinstance(v, dict)}
        merged = []
        for g in gpus:
            facts = sections.get(g.bus_id.lower())
            if facts is None:
                merged.append(g)
                continue
            f = _q_gpu_facts(facts)
            merged.append(replace(
                g, persistence=g.persistence if g.persistence is not None else f["persistence"],
                ecc_uncorrected=f["ecc_uncorrected"] if f["ecc_uncorrected"] is not None else g.ecc_uncorrected,
                sm_clock_max_mhz=g.sm_clock_max_mhz or f["sm_clock_max_mhz"],
                slowdown=f["slowdown"], retired_pending=f["retired_pending"]))
        gpus = merged
    return GpuInventory(tuple(gpus), driver=driver, cuda=cuda, source="nvidia-smi")


def inventory_from_nvml() -> GpuInventory | None:
    """The same facts through NVML (nvidia-ml-py) where it is importable and initialises; else None."""
    try:
        import pynvml as nv
        nv.nvmlInit()
    except Exception:  # no library, no driver: nvidia-smi is the source then
        return None
    try:
        def _s(x: Any) -> str:
            return x.decode() if isinstance(x, bytes) else str(x)
        cuda_v = nv.nvmlSystemGetCudaDriverVersion_v2()
        gpus = []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            try:
                ecc = int(nv.nvmlDeviceGetTotalEccErrors(h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                                          nv.NVML_VOLATILE_ECC))
            except nv.NVMLError:
                ecc = None
            try:
                pers = nv.nvmlDeviceGetPersistenceMode(h) == nv.NVML_FEATURE_ENABLED
            except nv.NVMLError:
                pers = None
            gpus.append(GpuInfo(index=i, name=_s(nv.nvmlDeviceGetName(h)), uuid=_s(nv.nvmlDeviceGetUUID(h)),
                                bus_id=_s(nv.nvmlDeviceGetPciInfo(h).busId),
                                memory_total_mib=mem.total // (1 << 20), memory_used_mib=mem.used // (1 << 20),
                                driver=_s(nv.nvmlSystemGetDriverVersion()), persistence=pers, ecc_uncorrected=ecc))
        return GpuInventory(tuple(gpus), driver=_s(nv.nvmlSystemGetDriverVersion()),
                            cuda=f"{cuda_v // 1000}.{cuda_v % 1000 // 10}", source="nvml")
    except Exception:  # a query NVML refuses (an older binding, a device gone): nvidia-smi is the source then
        return None
    finally:
        nv.nvmlShutdown()


def collect_inventory(raw: dict[str, str] | None = None) -> GpuInventory:
    """Run nvidia-smi (csv + -q); fill `raw` with its outputs for the evidence directory."""
    raw = {} if raw is None else raw
    if shutil.which("nvidia-smi") is None:
        return GpuInventory((), source="none: nvidia-smi not on PATH")
    def smi(*a: str) -> str:
        p = subprocess.run(["nvidia-smi", *a], capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            raise RuntimeError(f"nvidia-smi {' '.join(a)}: exit {p.returncode}: {p.stderr.strip()[:200]}")
        return p.stdout
    raw["nvidia-smi-query.csv"] = smi(f"--query-gpu={','.join(QUERY_FIELDS)}", "--format=csv")
    raw["nvidia-smi-q.txt"] = smi("-q")
    try:
        raw["nvidia-smi-topo.txt"] = smi("topo", "-m")
    except RuntimeError as exc:  # topology is evidence, not judged
        raw["nvidia-smi-topo.txt"] = str(exc)
    return inventory_from_smi(raw["nvidia-smi-query.csv"], raw["nvidia-smi-q.txt"])


def version_at_least(have: str | None, want: str) -> bool:
    """'580.159.04' >= '580' compares numerically, component by component (missing parts are 0)."""
    if not have:
        return False
    h, w = ([int(x) for x in re.findall(r"\d+", v)] for v in (have, want))
    n = max(len(h), len(w))
    return h + [0] * (n - len(h)) >= w + [0] * (n - len(w))


def model_matches(name: str, model: str) -> bool:
    """'H20' matches 'NVIDIA H20' and 'NVIDIA H20-3e' but not 'NVIDIA H200': a token, not a substring."""
    return re.search(rf"(?<![A-Za-z0-9]){re.escape(model)}(?![A-Za-z0-9])", name, re.IGNORECASE) is not None


def _unknown(name: str, observed: Any, what: str) -> Check:
    return Check(name, "skip", None, observed, f"no {what} in the profile: recorded, not judged")


def judge_inventory(inv: GpuInventory, hw: Hardware, nvml: GpuInventory | None = None) -> list[Check]:
    """Count, model, memory, driver, CUDA, ECC, persistence, idle and throttling against the profile."""
    g = inv.gpus
    checks = [Check("gpu_count", "pass" if len(g) == hw.gpus_per_node else "fail", hw.gpus_per_node, len(g),
                    f"{len(g)} GPU(s) seen ({inv.source}), profile wants {hw.gpus_per_node} per node"
                    if len(g) != hw.gpus_per_node else f"{len(g)} GPU(s) as expected")]
    if nvml is not None:
        ok = len(nvml.gpus) == len(g) and {x.uuid for x in nvml.gpus} == {x.uuid for x in g}
        checks.append(Check("gpu_nvml_agrees", "pass" if ok else "fail", len(g), len(nvml.gpus),
                            "NVML and nvidia-smi list the same GPUs" if ok
                            else "NVML and nvidia-smi disagree on the GPUs present: driver or container problem"))
    names = sorted({x.name for x in g})
    if hw.gpu_model is None:
        checks.append(_unknown("gpu_model", names, "gpu_model"))
    else:
        bad = [x.name for x in g if not model_matches(x.name, hw.gpu_model)]
        checks.append(Check("gpu_model", "fail" if bad or not g else "pass", hw.gpu_model, names,
                            f"GPU model {names} is not {hw.gpu_model!r}" if bad or not g else f"all {hw.gpu_model}"))
    mems = [x.memory_total_mib for x in g]
    if hw.gpu_memory_mib_min is None:
        checks.append(_unknown("gpu_memory", mems, "gpu_memory_mib_min"))
    else:
        low = [x.index for x in g if (x.memory_total_mib or 0) < hw.gpu_memory_mib_min]
        checks.append(Check("gpu_memory", "fail" if low or not g else "pass", f">= {hw.gpu_memory_mib_min} MiB",
                            mems, f"GPU(s) {low} have less than {hw.gpu_memory_mib_min} MiB" if low
                            else ("no GPUs" if not g else "memory per GPU as expected")))
    for name, have, want in (("driver", inv.driver, hw.driver_min), ("cuda", inv.cuda, hw.cuda_min)):
        if want is None:
            checks.append(_unknown(name, have, f"{name}_min"))
        else:
            ok = version_at_least(have, want)
            checks.append(Check(name, "pass" if ok else "fail", f">= {want}", have,
                                f"{name} {have} >= {want}" if ok else f"no {name} version reported" if not have
                                else f"{name} {have} is older than {want}: upgrade"))
    if not g:
        return checks          # nothing to judge per GPU: the count check already failed
    ecc = {x.index: x.ecc_uncorrected for x in g}
    bad_ecc = [i for i, e in ecc.items() if e is None or e > hw.ecc_uncorrected_max]
    checks.append(Check("ecc", "fail" if bad_ecc else "pass", f"<= {hw.ecc_uncorrected_max} uncorrectable", ecc,
                        f"GPU(s) {bad_ecc} report uncorrectable ECC errors (or none reported): drain and reset"
                        if bad_ecc else "no uncorrectable ECC errors"))
    pend = [x.index for x in g if x.retired_pending]
    if pend:
        checks.append(Check("row_remap", "fail", "no pending remap", pend,
                            f"GPU(s) {pend} have a row remap pending: reset them before use"))
    if hw.persistence_required:
        off = [x.index for x in g if x.persistence is not True]
        checks.append(Check("persistence", "fail" if off else "pass", True, {x.index: x.persistence for x in g},
                            f"persistence mode not enabled on GPU(s) {off}: nvidia-smi -pm 1" if off
                            else "persistence mode on"))
    busy = {x.index: x.memory_used_mib for x in g if (x.memory_used_mib or 0) > hw.gpu_idle_memory_mib_max}
    checks.append(Check("gpu_idle", "fail" if busy else "pass", f"<= {hw.gpu_idle_memory_mib_max} MiB used",
                        {x.index: x.memory_used_mib for x in g},
                        f"GPU(s) {sorted(busy)} already hold memory {busy} MiB: another process uses them"
                        if busy else "no memory in use"))
    thr = {x.index: list(x.slowdown) for x in g if x.slowdown}
    checks.append(Check("throttle", "fail" if thr else "pass", "no slowdown reason active", thr,
                        f"clock slowdown active: {thr}" if thr else "no slowdown reason active"))
    return checks


@dataclass(frozen=True)
class ProbeResult:
    index: int
    name: str
    copy_tbps: float | None = None          # read + write bytes per second / 1e12
    bf16_tflops: float | None = None
    allreduce_ok: bool | None = None        # one-rank NCCL all-reduce returned the input
    allreduce_algbw_gbps: float | None = None
    error: str | None = None
    samples: dict[str, list[float]] = field(default_factory=dict)


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def _time_cuda(torch: Any, fn: Any, iters: int, warmup: int = 3) -> list[float]:
    """Seconds per call, one CUDA-event pair per call (each call is long enough to dwarf the launch)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / 1e3)
    return out


def _allreduce_one_rank(torch: Any, device: int) -> tuple[bool, float]:
    """A one-rank NCCL process group on this GPU: proves NCCL loads and runs a collective here."""
    import os
    import tempfile

    import torch.distributed as dist
    fd, store = tempfile.mkstemp(prefix="gauntlet-nccl-")
    os.close(fd)
    os.unlink(store)
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=0, world_size=1,
                            device_id=torch.device("cuda", device))
    try:
        x = torch.arange(1 << 26, device=f"cuda:{device}", dtype=torch.float32)   # 256 MiB
        ref = x.clone()
        ts = _time_cuda(torch, lambda: dist.all_reduce(x), 10)
        ok = bool(torch.equal(x, ref))
        return ok, x.numel() * 4 / _median(ts) / 1e9
    finally:
        dist.destroy_process_group()


def _copy_times(torch: Any, device: int, nbytes: int, iters: int) -> list[float]:
    """Device-to-device copy of `nbytes` (random bf16: no compressible pattern)."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).uniform_()
    dst = torch.empty_like(src)
    return _time_cuda(torch, lambda: dst.copy_(src), iters)


def _matmul_times(torch: Any, device: int, n: int, iters: int) -> list[float]:
    """bf16 n x n x n matmul on random data (zeros run faster and would flatter the card)."""
    a = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    return _time_cuda(torch, lambda: a @ b, iters)


def probe_gpus(spec: GpuProbeSpec, nccl: bool = True) -> list[ProbeResult]:
    """Measure every visible GPU with torch; a GPU that errors is recorded with its error, not raised."""
    try:
        import torch
    except ImportError:
        return [ProbeResult(-1, "", error="torch is not importable in this image: the GPU probe cannot run")]
    if not torch.cuda.is_available():
        return [ProbeResult(-1, "", error="torch sees no CUDA device (torch.cuda.is_available() is False)")]
    results = []
    for i in range(torch.cuda.device_count()):
        name = torch.cuda.get_device_name(i)
        try:
            with torch.cuda.device(i):
                copy_t = _copy_times(torch, i, spec.copy_bytes, spec.iters)
                mm_t = _matmul_times(torch, i, spec.matmul_n, spec.iters)
                torch.cuda.empty_cache()
            n = spec.matmul_n
            copy = 2 * spec.copy_bytes / _median(copy_t) / 1e12
            tflops = 2 * n ** 3 / _median(mm_t) / 1e12
            ar_ok, ar_bw = _allreduce_one_rank(torch, i) if nccl and i == 0 else (None, None)
            results.append(ProbeResult(i, name, copy, tflops, ar_ok, ar_bw,
                                       samples={"copy_s": copy_t, "matmul_s": mm_t}))
        except Exception as exc:  # a broken card is a finding, the probe goes on to the next one
            results.append(ProbeResult(i, name, error=f"{type(exc).__name__}: {exc}".splitlines()[0]))
    return results


def judge_probe(results: list[ProbeResult], spec: GpuProbeSpec) -> list[Check]:
    """Per-GPU copy bandwidth and bf16 rate against the profile's minimums; errors fail."""
    errs = [(r.index, r.error) for r in results if r.error]
    checks = []
    if errs:
        checks.append(Check("gpu_probe_runs", "fail", "every GPU probed", errs,
                            "; ".join(f"GPU {i}: {e}" for i, e in errs)))
    ok = [r for r in results if not r.error]
    for name, attr, minimum, unit in (("gpu_copy_bandwidth", "copy_tbps", spec.copy_tbps_min, "TB/s"),
                                      ("gpu_bf16_matmul", "bf16_tflops", spec.bf16_tflops_min, "TFLOP/s")):
        seen = {r.index: round(getattr(r, attr), 3) for r in ok}
        if not ok:
            continue
        if minimum is None:
            checks.append(_unknown(name, seen, f"{attr}_min"))
            continue
        low = {i: v for i, v in seen.items() if v < minimum}
        checks.append(Check(name, "fail" if low else "pass", f">= {minimum} {unit} per GPU", seen,
                            f"GPU(s) {sorted(low)} below {minimum} {unit}: {low} (throttled or degraded card)"
                            if low else f"min {min(seen.values()):.3f} {unit} >= {minimum}"))
    ar = [r for r in ok if r.allreduce_ok is not None]
    if ar:
        good = all(r.allreduce_ok for r in ar)
        checks.append(Check("nccl_one_rank", "pass" if good else "fail", "all-reduce returns its input",
                            {r.index: r.allreduce_algbw_gbps and round(r.allreduce_algbw_gbps, 1) for r in ar},
                            "one-rank NCCL all-reduce ran and returned the right values" if good
                            else "one-rank NCCL all-reduce returned wrong values"))
    return checks
