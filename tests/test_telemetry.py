"""Per-rank telemetry: the sampler's readers on real outputs, its HTTP face, the perf side, its place in the engine
container, the report."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from gauntlet.params import load_profile
from gauntlet.steps.cluster import telemetry as T
from gauntlet.steps.backends.kubernetes import manifests as M
from gauntlet.steps.cluster.rank_telemetry import aggregate, round_telemetry

FIX = Path(__file__).parent / "fixtures" / "telemetry"
H200 = json.loads((FIX / "h200_duty_cycle.json").read_text())


def _phase(i: int) -> list[dict]:
    """The samples of duty-cycle phase ``i``, its first 2 s (the load ramping) left out."""
    p = H200["phases"][i]
    return [s for s in H200["telemetry"]["samples"] if p["start"] + 2 <= s["t"] <= p["end"]]


def test_nvml_samples_follow_a_real_h200_duty_cycle():
    """0 %, 30 %, 100 % bf16 matmul duty with 0, 20, 60 GiB held: utilisation, power and memory follow."""
    assert H200["telemetry"]["gpu_source"] == "nvml"
    idle, third, full = (T.summarize_rank(_phase(i)) for i in range(3))
    assert all(s["samples"] >= 30 and s["gpus"] == 1 for s in (idle, third, full))
    assert idle["gpu_util_max"] == 0 and 20 <= third["gpu_util_mean"] <= 50 and full["gpu_util_mean"] >= 95
    assert idle["power_w_max"] < 200 < third["power_w_mean"] < 500 < full["power_w_mean"]
    assert idle["gpu_mem_used_gib_max"] < 2 and 20 < third["gpu_mem_used_gib_max"] < 23 \
        and 60 < full["gpu_mem_used_gib_max"] < 63
    assert full["gpu_mem_total_gib"] == pytest.approx(143771 / 1024)
    assert full["sm_clock_mhz_mean"] > 1000


def test_nvidia_smi_fallback_parses_the_same_card():
    idle = T.parse_smi((FIX / "smi_idle.csv").read_text())
    busy = T.parse_smi((FIX / "smi_busy.csv").read_text())
    assert idle == [{"index": 0, "util_pct": 0.0, "mem_used_mib": 0.0, "mem_total_mib": 143771.0,
                     "power_w": 80.61, "sm_clock_mhz": 345.0}]
    assert busy[0]["util_pct"] == 99.0 and busy[0]["power_w"] > 600 and busy[0]["mem_used_mib"] > 60000
    assert T.parse_smi("0, [N/A], 1, 2, [Not Supported], 3\nnot a row\n")[0]["util_pct"] is None


def _ib(root: Path, dev: str, port: str, tx_words: int, rx_words: int) -> None:
    c = root / dev / "ports" / port / "counters"
    c.mkdir(parents=True, exist_ok=True)
    (c / "port_xmit_data").write_text(f"{tx_words}\n")
    (c / "port_rcv_data").write_text(f"{rx_words}\n")


def test_rdma_counters_are_words_and_become_bytes_per_second(tmp_path):
    _ib(tmp_path, "mlx5_0", "1", 1000, 10)
    a = T.read_ib_counters(tmp_path)
    assert a == {"mlx5_0/1": {"xmit_bytes": 4000, "rcv_bytes": 40}}
    _ib(tmp_path, "mlx5_0", "1", 1000 + 250_000_000, 5)         # 1 GB sent in 1 s; rx counter reset
    r = T.rates(a, T.read_ib_counters(tmp_path), 1.0)
    assert r == {"mlx5_0/1": {"xmit_bytes": 1e9, "rcv_bytes": None}}
    assert T.read_ib_counters(tmp_path / "absent") == {}


def test_host_nics_physical_only(tmp_path):
    text = ("Inter-|   Receive |  Transmit\n face |bytes packets errs drop fifo frame compressed multicast|bytes\n"
            "    lo: 100 1 0 0 0 0 0 0 100 1 0 0 0 0 0 0\n  eth0: 5000 9 0 0 0 0 0 0 7000 9 0 0 0 0 0 0\n"
            "veth1: 1 1 0 0 0 0 0 0 2 1 0 0 0 0 0 0\n")
    net = T.parse_net_dev(text)
    assert net["eth0"] == {"rx_bytes": 5000, "tx_bytes": 7000} and set(net) == {"lo", "eth0", "veth1"}
    (tmp_path / "eth0" / "device").mkdir(parents=True)
    (tmp_path / "veth1").mkdir()
    assert T.physical_ifaces(net, tmp_path) == ["eth0"]


class _Fixed(T.Reader):
    """A node whose GPUs read as the H200 fixture's samples, one after another, and whose RDMA port sends 2 GB/s."""

    def __init__(self, tmp: Path):
        super().__init__(ib_root=tmp / "ib", proc_net_dev=str(tmp / "net_dev"), sys_net=tmp / "net", smi=None,
                         nvml=False)
        self.gpu_source = "nvml"
        self._it = iter(s["gpus"] for s in H200["telemetry"]["samples"][-20:])
        self.words = 0

    def gpus(self):
        return next(self._it)

    def counters(self):
        self.words += 500_000_000 // 4
        return {"mlx5_0/1": {"xmit_bytes": self.words * 4, "rcv_bytes": self.words * 4}}, {}


@pytest.fixture
def sampler_url(tmp_path):
    s = T.Sampler(_Fixed(tmp_path), interval_s=0.25)
    srv = T.serve(s, "127.0.0.1", 0)
    t = threading.Thread(target=s.run, daemon=True)
    t.start()
    yield s, f"http://127.0.0.1:{srv.server_address[1]}"
    s.stop()
    srv.shutdown()


def test_perf_fetches_each_ranks_window_and_names_the_unreachable_one(sampler_url):
    import time
    s, url = sampler_url
    t0 = time.time()
    time.sleep(1.6)
    ranks = round_telemetry([(0, url, "g-sglang-0"), (1, "http://127.0.0.1:9", "g-sglang-1")], t0, time.time(),
                            timeout_s=2)
    r0, r1 = ranks
    assert r0["reachable"] and r0["gpu_source"] == "nvml" and 4 <= r0["samples"] <= 8
    assert r0["gpu_util_mean"] > 95 and r0["power_w_max"] > 600
    assert r0["rdma_tx_gbps_mean"] == pytest.approx(2.0, rel=0.2)      # 0.5 GB per 0.25 s
    assert r0["series"] and r0["series"][0][0] >= 0
    assert not r1["reachable"] and r1["error"].startswith("rank 1 (g-sglang-1) telemetry unreachable at")
    agg = aggregate(ranks)
    assert agg["gpu_source"] == "nvml" and agg["gpu_util_mean"] > 95 and len(agg["unreachable"]) == 1


def test_sampler_http_refuses_bad_windows(sampler_url):
    import httpx
    _, url = sampler_url
    assert httpx.get(f"{url}/samples", params={"since": "yesterday"}).status_code == 400
    assert httpx.get(f"{url}/nothing").status_code == 404
    assert httpx.get(f"{url}/health").json()["ok"] is True


def test_the_sampler_runs_in_the_container_that_holds_the_gpus():
    """No container of the engine's pod leans on ``NVIDIA_VISIBLE_DEVICES`` without a GPU allocation (on a CDI
    runtime, GPU Operator v25.10 and later, such a container sees no GPU): the pod has one container, the engine,
    which holds the node's GPUs, and its launch script starts the sampler beside the engine."""
    kimi = load_profile("kimi-k3-h20")
    sts = M.engine_statefulset(kimi, "sglang", "0123456789ab-uid", "img")
    pod = sts["spec"]["template"]["spec"]
    for c in pod["containers"] + pod["initContainers"]:
        names = {e["name"] for e in c.get("env") or []}
        assert "NVIDIA_VISIBLE_DEVICES" not in names and "NVIDIA_DRIVER_CAPABILITIES" not in names, c["name"]
    (engine,) = pod["containers"]
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == "8" and "runtimeClassName" not in pod
    env = {e["name"]: e.get("value") for e in engine["env"]}
    # the pod runs this very module from its source (every $ doubled: the kubelet reads $$ as $)
    assert env[M.SAMPLER_SRC_ENV] == Path(T.__file__).read_text().replace("$", "$$")
    assert {"name": "telemetry", "containerPort": kimi.hardware.telemetry.port} in engine["ports"]
    script = engine["command"][2].replace("$$", "$")
    sampler = next(ln for ln in script.splitlines() if "gauntlet_telemetry.py serve" in ln)
    assert sampler.endswith('--exit-with "$$" ) &') and script.index(sampler) < script.index("0) exec ")


def test_the_rendered_launch_script_starts_the_sampler_beside_the_engine_and_it_leaves_with_it(tmp_path):
    """The engine pod's own launch script, run as the container runs it (``/bin/sh -c``, the env the pod spec gives,
    every ``$$`` read as ``$`` as the kubelet does), with a stand-in for the ``vllm`` program on PATH (no GPU and
    no vLLM GPU build here): the real sampler answers on the profile's telemetry port, reporting why it has no GPU
    source on this machine, and exits when the engine does."""
    import os
    import signal
    import subprocess
    import time

    import httpx

    from gauntlet.steps.engines.local_vllm import free_port
    port = free_port()
    kimi = load_profile("kimi-k3-h20")
    kimi = kimi.model_copy(update={"hardware": kimi.hardware.model_copy(update={
        "telemetry": kimi.hardware.telemetry.model_copy(update={"port": port})})})
    (engine,) = M.engine_statefulset(kimi, "vllm", "0123456789ab-uid", "img")["spec"]["template"]["spec"]["containers"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "vllm").write_text("#!/bin/sh\nexec sleep 60\n")          # the engine: it holds the pid
    (bin_dir / "vllm").chmod(0o755)
    env = {e["name"]: e["value"].replace("$$", "$") for e in engine["env"] if "value" in e}
    env.update(POD_NAME="g-vllm-01234567-1", NODE_NAME="h20-node-02", HOST_IP="127.0.0.1",
               PATH=f"{bin_dir}:{os.environ['PATH']}", TMPDIR=str(tmp_path))
    script = engine["command"][2].replace("$$", "$").replace("/tmp/gauntlet_telemetry.py",
                                                             str(tmp_path / "gauntlet_telemetry.py"))
    p = subprocess.Popen(["/bin/sh", "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True)
    try:
        health, deadline = None, time.monotonic() + 30
        while health is None and time.monotonic() < deadline:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).json()
            except httpx.HTTPError:
                time.sleep(0.2)
        assert health and health["ok"] and health["pod"] == "g-vllm-01234567-1", health
        assert health["gpu_source"].startswith("none: ")          # this machine has no GPU: it says why
        os.kill(p.pid, signal.SIGKILL)                            # the engine (the shell exec'd into it) dies
        p.wait()
        gone = time.monotonic() + 10
        while time.monotonic() < gone:
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=0.5)
                time.sleep(0.2)
            except httpx.HTTPError:
                break
        else:
            raise AssertionError("the sampler outlived its engine")
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _rank(rank: int, source: str, gpus: int, reachable: bool = True) -> dict:
    return {"rank": rank, "where": f"g-sglang-{rank}", "reachable": reachable, "gpu_source": source,
            "samples": 4 if reachable else 0, "gpus": gpus,
            **({} if reachable else {"error": f"rank {rank} (g-sglang-{rank}) telemetry unreachable at http://x"})}


def test_no_gpu_source_on_a_gpu_profile_fails_perf_naming_the_rank_and_why():
    from gauntlet.steps.cluster.rank_telemetry import GPU_SOURCE_CHECK, gpu_source_check
    none = "none: NVML initialised but sees 0 GPUs (this container holds no GPU allocation)"
    c = gpu_source_check([_rank(0, "nvml", 8), _rank(1, none, 0)], 8)
    assert c.name == GPU_SOURCE_CHECK and c.status == "fail" and c.observed == [1]
    assert c.detail.startswith(f"rank 1 (g-sglang-1): no GPU source ({none}): the rounds' GPU figures")
    assert "rank 0" not in c.detail
    few = gpu_source_check([_rank(0, "nvidia-smi", 3)], 8)
    assert few.status == "fail" and "nvidia-smi reads 3 of 8 GPUs" in few.detail
    ok = gpu_source_check([_rank(0, "nvml", 8), _rank(1, "nvml", 8), _rank(1, "", 0, reachable=False)], 8)
    assert ok.status == "pass" and "2 rank(s) read 8 GPU(s) each through nvml" in ok.detail
    silent = gpu_source_check([_rank(0, "", 0, reachable=False)], 8)
    assert silent.status == "skip" and "no rank's sampler answered: rank 0 (g-sglang-0) telemetry unreachable" in \
        silent.detail
    assert gpu_source_check([_rank(0, "none: no nvidia-smi", 0)], 0) is None          # a CPU profile


def test_a_reader_whose_nvml_sees_no_device_has_no_gpu_source(monkeypatch):
    """What a container without a GPU allocation sees on a CDI runtime: NVML's library is there, no device is."""
    import sys
    import types
    fake = types.SimpleNamespace(nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: 0,
                                 nvmlDeviceGetHandleByIndex=lambda i: None)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    r = T.Reader(smi=None)
    assert r.gpu_source == "none: NVML initialised but sees 0 GPUs (this container holds no GPU allocation)"
    assert r.gpus() == []


def test_the_containers_memory_is_its_cgroups_working_set(tmp_path):
    """cgroup v2 (memory.current less inactive_file) and v1 (usage_in_bytes less total_inactive_file), as cAdvisor
    counts the working set the kubelet evicts by; none where there is no such cgroup."""
    (tmp_path / "memory.current").write_text("1073741824\n")
    (tmp_path / "memory.stat").write_text("anon 805306368\ninactive_file 268435456\nactive_file 0\n")
    assert T.container_memory(tmp_path) == 805306368
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.usage_in_bytes").write_text("2147483648\n")
    (v1 / "memory" / "memory.stat").write_text("total_inactive_file 1073741824\n")
    assert T.container_memory(v1) == 1073741824
    assert T.container_memory(tmp_path / "none") is None
    s = T.Sampler(T.Reader(smi=None, nvml=False), cgroup=tmp_path)
    s.sample()
    assert T.summarize_rank(list(s.samples))["container_mem_gib_max"] == pytest.approx(0.75)


def test_cluster_targets_are_the_per_rank_dns_names(monkeypatch, tmp_path):
    from gauntlet.steps.cluster.rank_telemetry import targets
    kimi = load_profile("kimi-k3-h20")
    monkeypatch.setenv("GAUNTLET_RUN_ID", "0123456789ab-uid")
    monkeypatch.delenv("GAUNTLET_NAMESPACE", raising=False)
    got, why = targets(kimi, "sglang", tmp_path)
    names = M.engine_names("sglang", "0123456789ab-uid")
    assert why == "" and [t[0] for t in got] == [0, 1]
    assert got[1][1] == (f"http://{names['statefulset']}-1.{names['headless']}.{kimi.namespace}.svc.cluster.local:"
                         f"{kimi.hardware.telemetry.port}")


def _perf_verdict(tmp_path: Path, engine: str, ranks: list[dict]) -> Path:
    from gauntlet.contract import Check, Verdict
    run = tmp_path / "run"
    out = run / engine / "perf"
    out.mkdir(parents=True)
    rnd = {"round": 1, "valid": True, "output_throughput": 10.0, "resources": {"gpu_source": "engine ranks (nvml)"},
           "telemetry": {"ranks": ranks, "note": ""}}
    case = {"concurrency": 1, "input_len": 8, "output_len": 8, "rounds": [rnd], "table": {}}
    Verdict.of("perf", "2026-12-04T00:00:00Z", [Check("c", "pass", None, None, "")],
               {"engine": engine, "cases": {"c1": case}}).write(out)
    return run


def test_report_has_a_row_per_rank_and_names_the_unreachable_rank(tmp_path):
    from gauntlet.steps.evidence.report import write_report
    good = {"rank": 0, "where": "g-sglang-0", "node": "h20-node-01", "reachable": True, "gpu_source": "nvml",
            **T.summarize_rank(_phase(2)), "series": T.series(_phase(2), _phase(2)[0]["t"])}
    bad = {"rank": 1, "where": "g-sglang-1", "reachable": False,
           "error": "rank 1 (g-sglang-1) telemetry unreachable at http://x:9401: ConnectError: refused"}
    run = _perf_verdict(tmp_path, "sglang", [good, bad])
    md = write_report(run, results=[]).read_text()
    assert "#### Per-rank telemetry: sglang" in md
    row = next(ln for ln in md.splitlines() if ln.startswith("| c1 | 0 | h20-node-01 |"))
    assert "| 99 / 100 |" in row and "nvml" in row
    assert "| c1 | 1 | g-sglang-1 | 0/1 | **unreachable**" in md
    assert "rank 1 (g-sglang-1) telemetry unreachable" in md
    assert "GPU utilisation: unavailable" not in md and "unavailable: no nvidia-smi" not in md
    assert (run / "telemetry-sglang.png").is_file() and "telemetry-sglang.png" in md


def test_report_says_which_engine_has_no_expert_load_interface(tmp_path):
    from gauntlet.steps.evidence.report import write_report
    run = _perf_verdict(tmp_path, "vllm", [])
    md = write_report(run, results=[]).read_text()
    assert "per-rank expert load: not recorded: vLLM has no expert distribution interface" in md


def test_telemetry_rows_go_to_their_own_table(tmp_path):
    from gauntlet.steps.evidence.results import append_telemetry, read_rounds
    row = {"run_id": "r1", "profile": "p", "engine": "sglang", "date": "2026-12-04", "case": "c1", "round": 1,
           "rank": 1, "reachable": False, "error": "rank 1 unreachable"}
    ok = {**row, "rank": 0, "reachable": True, "error": None, **T.summarize_rank(_phase(1))}
    assert append_telemetry([ok, row], tmp_path) == {"telemetry": 2}
    t = read_rounds(tmp_path, table="telemetry").to_pylist()
    got = {r["rank"]: r for r in t}
    assert got[1]["reachable"] is False and got[0]["gpu_util_mean"] > 20 and got[0]["power_w_max"] > 300
    assert read_rounds(tmp_path).num_rows == 0           # never in the main table


def test_local_sampler_leaves_with_its_engine(tmp_path):
    """Locally the deploy starts the sampler with --exit-with <engine pid>: it never outlives the engine."""
    import subprocess
    import sys
    import time

    import httpx

    from gauntlet.steps.engines.local_vllm import free_port
    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    port = free_port()
    s = subprocess.Popen([sys.executable, "-m", "gauntlet.steps.cluster.telemetry", "serve", "--host", "127.0.0.1", "--port",
                          str(port), "--interval", "0.2", "--exit-with", str(engine.pid)])
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).json()["ok"]:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        assert httpx.get(f"http://127.0.0.1:{port}/samples").json()["samples"]
        engine.kill()
        engine.wait()
        assert s.wait(timeout=10) == 0
    finally:
        engine.kill()
        s.kill()


def test_sampler_exits_at_once_on_sigterm(tmp_path):
    """Run as PID 1 of a container (as the sidecar it was), a signal without a handler is ignored: it handles
    SIGTERM, or deleting the engine's pod would wait the whole grace period (60 s) while the engine's GPUs stay
    held. Run in a PID namespace of its own as the kubelet does (unshare, as root)."""
    import os
    import shutil
    import signal
    import subprocess
    import sys
    import time

    from gauntlet.steps.engines.local_vllm import free_port
    port = free_port()
    ready = tmp_path / "ready"
    cmd = [sys.executable, T.__file__, "serve", "--host", "127.0.0.1", "--port", str(port), "--interval", "0.2",
           "--ready-file", str(ready)]
    unshare = shutil.which("unshare")
    # PID 1 of a new PID namespace, as in a container; without unshare (or root) the handler is still the point
    argv = [unshare, "--pid", "--fork", "--kill-child", *cmd] if unshare and os.geteuid() == 0 else cmd
    p = subprocess.Popen(argv)
    try:
        deadline = time.monotonic() + 20
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ready.exists(), "the sampler never served"
        t0 = time.monotonic()
        if argv[0] == unshare:        # signal the namespace's PID 1, as the kubelet's SIGTERM reaches it
            child = int(subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()[0])
            os.kill(child, signal.SIGTERM)
        else:
            p.send_signal(signal.SIGTERM)
        p.wait(timeout=10)
        assert time.monotonic() - t0 < 5
    finally:
        p.kill()


def test_perf_on_a_gpu_profile_fails_when_the_ranks_sampler_reads_no_gpu(tmp_path, monkeypatch):
    """Gate 4 itself, on h200-1gpu (kubernetes, 1 GPU a node): the real Reader in a container without the GPU
    allocation (NVML loads, no device: a CDI runtime), the real Sampler and HTTP server as the rank's sampler,
    the perf step's own run. No engine serves here: the bench client is a stand-in that returns vLLM 0.32's recorded
    result. The step fails ``telemetry/gpu-source`` naming the rank and the sampler's reason."""
    import sys
    import time
    import types

    from gauntlet.steps.client.bench import ClientRun
    from gauntlet.steps.cluster import rank_telemetry
    from gauntlet.steps.gates import perf

    monkeypatch.setitem(sys.modules, "pynvml", types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: 0, nvmlDeviceGetHandleByIndex=lambda i: None,
        nvmlShutdown=lambda: None))
    reader = T.Reader(ib_root=tmp_path / "ib", proc_net_dev=str(tmp_path / "net_dev"), sys_net=tmp_path / "net",
                      smi=None)
    s = T.Sampler(reader, interval_s=0.1)
    srv = T.serve(s, "127.0.0.1", 0)
    threading.Thread(target=s.run, daemon=True).start()
    fixture = json.loads((Path(__file__).parent / "fixtures" / "vllm-0.32.0-cpu" / "bench-serve-result.json")
                         .read_text())

    def client(req, **_):
        time.sleep(0.4)                 # a round the sampler has samples of
        return ClientRun(dict(fixture, num_prompts=req.num_prompts, completed=req.num_prompts), 0.4, 0.4, "x")

    monkeypatch.setattr(perf, "run_client", client)
    monkeypatch.setattr(rank_telemetry, "targets", lambda *a, **k: (
        [(0, f"http://127.0.0.1:{srv.server_address[1]}", "g-vllm-0")], ""))
    profile = load_profile("h200-1gpu")
    try:
        opts = perf.Options(profile=profile, engine="vllm", endpoint="http://127.0.0.1:9",
                            cases=(profile.bench.cases[0].name,), rounds=1, tokenizer=str(tmp_path),
                            bench_python=sys.executable, no_store=True, no_ceiling=True,
                            diagnostic_clients=("none",), sample_interval=0.1)
        checks, _ = perf.run(opts, tmp_path / "run" / "vllm" / "perf")
    finally:
        s.stop()
        srv.shutdown()
    gpu = {c.name: c for c in checks}["telemetry/gpu-source"]
    assert gpu.status == "fail" and gpu.observed == [0], gpu
    assert gpu.detail.startswith("rank 0 (g-vllm-0): no GPU source (none: NVML initialised but sees 0 GPUs (this "
                                 "container holds no GPU allocation)): the rounds' GPU figures"), gpu.detail
