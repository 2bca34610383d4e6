"""Gate 5 goes on only while memory is stable: each rung's per-rank peak GPU memory, read from the engine ranks'
telemetry sampler as Gate 4 reads each round's, must not grow past ``longctx.memory_growth_max_gib``.

The sampler is the real one (steps/cluster/telemetry.py ``Sampler`` + ``serve``) found the real way (the local
back end's ``telemetry_targets``: the deploy state's sampler URL); no GPU is here, so its reader replays the
GPU samples recorded on an NVIDIA H200 (tests/fixtures/telemetry/h200_duty_cycle.json) with the memory the
test sets per rung (the stand-in). The chat API is a loopback that finds every needle.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import threading
import time
from pathlib import Path

import pytest
from loopback import ChatStandIn

from gauntlet.params import load_profile
from gauntlet.steps.cluster import telemetry as T
from gauntlet.steps.gates import longctx

KIMI = load_profile("kimi-k3-h20")
H200 = json.loads((Path(__file__).parent / "fixtures" / "telemetry" / "h200_duty_cycle.json").read_text())


def _rank(rank, used, total=139.8, where="g-sglang-0"):
    return {"rank": rank, "where": where, "reachable": True, "gpu_source": "nvml", "samples": 4,
            "gpu_mem_used_gib_max": used, "gpu_mem_total_gib": total}


def test_judge_memory_growth_against_the_last_rung_read():
    from gauntlet.steps.gates.longctx import judge_memory, rank_memory
    first = rank_memory([_rank(0, 120.0), _rank(1, 121.0, where="g-sglang-1")], "")
    st, detail = judge_memory(first, None, 4.0, 32768)
    assert st == "pass" and "peak 121.0 GiB of 140 on rank 1 (g-sglang-1)" in detail
    steady = rank_memory([_rank(0, 121.5), _rank(1, 122.0, where="g-sglang-1")], "")
    assert judge_memory(steady, (32768, first), 4.0, 65536)[0] == "pass"
    grown = rank_memory([_rank(0, 126.5), _rank(1, 122.0, where="g-sglang-1")], "")
    st, detail = judge_memory(grown, (65536, steady), 4.0, 131072)
    assert st == "fail" and "rank 0 (g-sglang-0): peak GPU memory grew 5.0 GiB from the 65536-token rung" in detail
    assert "longctx.memory_growth_max_gib 4: the climb stops here" in detail
    # a rank that answered nothing is named, never guessed; none at all is a skip saying why
    half = rank_memory([_rank(0, 121.0), {"rank": 1, "where": "g-sglang-1", "reachable": False,
                                          "error": "rank 1 (g-sglang-1) telemetry unreachable at http://x: boom"}], "")
    st, detail = judge_memory(half, (65536, steady), 4.0, 131072)
    assert st == "pass" and "not read: rank 1 (g-sglang-1) telemetry unreachable" in detail
    st, detail = judge_memory(rank_memory([], "no run id to name the engine's pods"), None, 4.0, 32768)
    assert st == "skip" and "no run id to name the engine's pods" in detail and "unguarded by memory" in detail


class _Replay(T.Reader):
    """The H200's recorded GPU samples, over and over, each GPU's memory used set to what ``gib`` holds now."""

    def __init__(self, tmp: Path):
        super().__init__(ib_root=tmp / "ib", proc_net_dev=str(tmp / "net_dev"), sys_net=tmp / "net", smi=None,
                         nvml=False)
        self.gpu_source = "nvml"
        self._it = itertools.cycle([s["gpus"] for s in H200["telemetry"]["samples"]])
        self.gib = 100.0

    def gpus(self):
        return [{**g, "mem_used_mib": self.gib * 1024} for g in next(self._it)]

    def counters(self):
        return {}, {}


class _Chat(ChatStandIn):
    """Finds every needle; while a rung's request is in flight the replayed memory is ``memory[rung]``."""

    def __init__(self, reader: _Replay, memory: dict[int, float]):
        self.reader, self.memory, self.sent = reader, memory, []

    def complete(self, body):
        text = body["messages"][0]["content"]
        # the rung whose size is nearest (no /tokenize here: the gate fills ~4.1-4.7 characters a token)
        rung = min(self.memory, key=lambda t: abs(math.log(len(text) / (4.4 * t))))
        self.sent.append(rung)
        self.reader.gib = self.memory[rung]
        time.sleep(0.3)                                                   # a few samples per request
        code = re.search(r"passcode is (\S+)\.", text).group(1)
        return {"object": "chat.completion", "choices": [{"index": 0, "finish_reason": "stop",
                "message": {"role": "assistant", "content": code}}]}


@pytest.fixture
def sampler(tmp_path):
    reader = _Replay(tmp_path)
    s = T.Sampler(reader, interval_s=0.05)
    srv = T.serve(s, "127.0.0.1", 0)
    t = threading.Thread(target=s.run, daemon=True)
    t.start()
    # where the local deploy records its sampler beside the engine (no live engine: nothing is restarted)
    state = tmp_path / ".engines" / "sglang.json"
    state.parent.mkdir(parents=True)
    state.write_text(json.dumps({"telemetry": f"http://127.0.0.1:{srv.server_address[1]}"}))
    yield reader
    s.stop()
    srv.shutdown()


def test_memory_growth_between_rungs_stops_the_climb(sampler, tmp_path):
    """Fails before the fix (memory never read on the ladder): 131072 grows 6 GiB past the 65536 rung on a
    4 GiB tolerance, so memory-131072 fails, 262144 is not run and 1M stays locked."""
    with _Chat(sampler, {32768: 100.0, 65536: 100.5, 131072: 106.5, 262144: 106.5}) as chat:
        opts = longctx.Options(profile=KIMI, engine="sglang", endpoint=chat.url, rungs="32768,65536,131072,262144",
                               backend="local", run_dir=str(tmp_path))
        checks, metrics = longctx.run(opts, tmp_path / "longctx")
    by = {c.name: c for c in checks}
    assert [by[f"rung-{t}"].status for t in (32768, 65536, 131072)] == ["pass"] * 3
    assert by["memory-32768"].status == by["memory-65536"].status == "pass"
    assert by["memory-32768"].observed == pytest.approx(100.0)
    assert by["memory-131072"].status == "fail"
    assert "grew 6.0 GiB from the 65536-token rung (100.5 -> 106.5 GiB)" in by["memory-131072"].detail
    assert by["rung-262144"].status == "skip" and "stopped at 131072" in by["rung-262144"].detail
    assert 262144 not in chat.sent and metrics["outputs"]["unlock_all_lower"] is False
    (rank,) = metrics["ladder"][2]["memory"]["ranks"]
    assert rank["gpu_source"] == "nvml" and rank["samples"] >= 3 and rank["total_gib"] > 139


def test_stable_memory_lets_the_ladder_climb(sampler, tmp_path):
    with _Chat(sampler, {32768: 100.0, 65536: 101.0, 131072: 103.0}) as chat:
        opts = longctx.Options(profile=KIMI, engine="sglang", endpoint=chat.url, rungs="32768,65536,131072",
                               backend="local", run_dir=str(tmp_path))
        checks, metrics = longctx.run(opts, tmp_path / "longctx")
    assert {c.name: c.status for c in checks if c.name.startswith("memory-")} == {
        "memory-32768": "pass", "memory-65536": "pass", "memory-131072": "pass"}
    assert metrics["outputs"]["unlock_all_lower"] is True


def test_a_profile_without_gpus_says_memory_is_not_judged(tmp_path):
    local = load_profile("local-cpu")
    assert local.hardware.gpus_per_node == 0
    with _Chat(_Replay(tmp_path), {1024: 1.0}) as chat:
        checks, _ = longctx.run(longctx.Options(profile=local, engine="vllm", endpoint=chat.url, rungs="1024",
                                                backend="local", run_dir=str(tmp_path)), tmp_path / "longctx")
    by = {c.name: c for c in checks}
    assert by["memory"].status == "skip" and "hardware.gpus_per_node is 0" in by["memory"].detail
    assert not [n for n in by if n.startswith("memory-")]


def test_a_rank_whose_sampler_reads_no_gpu_fails_the_rungs_memory_and_stops_the_climb(tmp_path, monkeypatch):
    """What a sampler in a container without the GPU allocation serves on a CDI runtime (issue 27): NVML's library
    loads, no device is there. The real Reader, Sampler and HTTP server; round_telemetry reads it as Gate 5 does.
    Its rank's memory cannot be judged: the rung's memory fails naming the rank and the sampler's reason, never a
    skip that lets the climb go on unguarded."""
    import sys
    import types

    from gauntlet.steps.cluster.rank_telemetry import round_telemetry
    from gauntlet.steps.gates.longctx import judge_memory, rank_memory
    monkeypatch.setitem(sys.modules, "pynvml", types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: 0, nvmlDeviceGetHandleByIndex=lambda i: None))
    reader = T.Reader(ib_root=tmp_path / "ib", proc_net_dev=str(tmp_path / "net_dev"), sys_net=tmp_path / "net",
                      smi=None)
    s = T.Sampler(reader, interval_s=0.2)
    srv = T.serve(s, "127.0.0.1", 0)
    th = threading.Thread(target=s.run, daemon=True)
    th.start()
    try:
        t0 = time.time()
        time.sleep(0.9)
        ranks = round_telemetry([(0, f"http://127.0.0.1:{srv.server_address[1]}", "g-sglang-0")], t0, time.time())
    finally:
        s.stop()
        srv.shutdown()
    assert ranks[0]["reachable"] and ranks[0]["samples"] >= 2
    st, detail = judge_memory(rank_memory(ranks, ""), None, 4.0, 32768)
    assert st == "fail", detail
    assert detail.startswith("rank 0 (g-sglang-0): no GPU source (none: NVML initialised but sees 0 GPUs (this "
                             "container holds no GPU allocation)): GPU memory cannot be judged at 32768 tokens, "
                             "the climb stops here"), detail
    # one blind rank is enough, beside a rank that reads its GPUs
    both = rank_memory([_rank(1, 120.0, where="g-sglang-1"), *ranks], "")
    assert judge_memory(both, None, 4.0, 32768)[0] == "fail"
