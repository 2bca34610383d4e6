"""The collective probe: nccl-tests' bandwidth formulas, the correctness judgement, and a real run
(gloo, 2 processes on CPU) through the network step's local launcher."""

from __future__ import annotations

import argparse
import importlib.util
import json

import pytest

from gauntlet.params import load_profile
from gauntlet.steps.cluster import nccl_probe as P
from gauntlet.steps.gates import network
from gauntlet.steps.runner import run_step

KIMI = load_profile("kimi-k3-h20")
HAVE_TORCH = importlib.util.find_spec("torch") is not None


@pytest.mark.parametrize("op,n,factor", [("all_reduce", 8, 1.75), ("all_reduce", 16, 1.875), ("all_reduce", 2, 1.0),
                                         ("all_to_all", 8, 0.875), ("all_to_all", 2, 0.5), ("all_gather", 4, 0.75),
                                         ("broadcast", 8, 1.0)])
def test_bus_factor_is_nccl_tests(op, n, factor):
    assert P.bus_factor(op, n) == pytest.approx(factor)


def test_busbw_from_bytes_and_time():
    alg, bus = P.busbw("all_reduce", 1 << 30, 0.01, 8)         # 1 GiB in 10 ms on 8 ranks
    assert alg == pytest.approx(107.374, rel=1e-4) and bus == pytest.approx(alg * 1.75)
    with pytest.raises(ValueError):
        P.bus_factor("gather_scatter", 2)


def test_expected_values():
    assert P.expected_all_reduce([1, 2, 3, 4], 6) == 10 + 4 * 6
    assert P.expected_all_to_all(3, 1, 8) == 25.0


def row(op, nbytes, bus, correct=True):
    return {"op": op, "bytes": nbytes, "time_us": 1.0, "algbw_gbps": bus, "busbw_gbps": bus, "correct": correct,
            "error": None if correct else "3 of 262144 elements wrong"}


def result(rows, n=8):
    return {"world_size": n, "results": rows}


def test_judge_phase_thresholds_and_correctness():
    net = KIMI.hardware.network                                      # intra: all-reduce >= 300, all-to-all >= 150
    good = result([row("all_reduce", 1 << 20, 20.0), row("all_reduce", 1 << 30, 360.0),
                   row("all_to_all", 1 << 30, 170.0)])
    checks = {c.name: c for c in network.judge_phase("intra", [good, good], net, ["n1", "n2"])}
    assert checks["intra_correct"].status == "pass"
    assert checks["intra_all_reduce_busbw"].status == "pass"     # judged at the largest size, not the 1 MiB one
    assert checks["intra_all_to_all_busbw"].status == "pass"
    slow = result([row("all_reduce", 1 << 30, 120.0), row("all_to_all", 1 << 30, 170.0)])
    c = {c.name: c for c in network.judge_phase("intra", [good, slow], net, ["n1", "n2"])}
    assert c["intra_all_reduce_busbw"].status == "fail" and c["intra_all_reduce_busbw"].observed["n2"] == 120.0
    wrong = result([row("all_reduce", 1 << 30, 400.0, correct=False), row("all_to_all", 1 << 30, 170.0)], 16)
    c = {c.name: c for c in network.judge_phase("inter", [wrong], net)}
    assert c["inter_correct"].status == "fail"                   # a wrong value fails however fast it was
    c = {c.name: c for c in network.judge_phase("inter", [None], net)}
    assert c["inter_ran"].status == "fail"


NCCL_TESTS_OUT = """\
# nThread 1 nGpus 8 minBytes 1048576 maxBytes 1073741824 step: 4(factor) warmup iters: 5 iters: 20
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
     1048576        262144     float     sum      -1    36.12   29.03   50.80      0    35.77   29.31   51.30      0
  1073741824     268435456     float     sum      -1   4507.3  238.22  416.89      0   4502.1  238.50  417.37      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 234.09
"""


def test_parse_nccl_tests():
    r = P.parse_nccl_tests(NCCL_TESTS_OUT)
    assert [x["bytes"] for x in r["rows"]] == [1048576, 1073741824]
    assert r["rows"][1]["out_busbw_gbps"] == 416.89 and r["rows"][1]["in_wrong"] == 0
    assert r["avg_busbw_gbps"] == 234.09 and r["out_of_bounds"] == 0
    # nccl-tests' own numbers obey the same formula the probe uses
    x = r["rows"][1]
    assert x["out_busbw_gbps"] == pytest.approx(x["out_algbw_gbps"] * P.bus_factor("all_reduce", 8), rel=1e-3)


def test_transports_from_nccl_debug():
    log = "\n".join([
        "h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
        "h:1:1 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
        "h:1:1 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] [send] via NET/IB/0/GDRDMA",
        "h:1:1 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/direct/direct",
        "h:1:1 [0] NCCL INFO Using network IB",
    ])
    assert P.nccl_transports(log) == {"NET/IB": 1, "P2P/CUMEM": 2, "SHM/direct": 1, "network:IB": 1}


def test_result_line_roundtrip():
    log = "noise\n" + P.RESULT_PREFIX + json.dumps(result([row("all_reduce", 4, 1.0)], 2)) + "\nmore noise\n"
    assert P.parse_result_line(log)["world_size"] == 2
    assert P.parse_result_line("Traceback ...\nRuntimeError: NCCL error") is None


@pytest.mark.skipif(not HAVE_TORCH, reason="torch not importable")
def test_correctness_check_catches_a_missing_contribution():
    """A collective that silently drops the other rank's data must be reported wrong."""
    import torch

    class NoOpDist:                       # claims 2 ranks, reduces nothing
        def all_reduce(self, x, op=None):
            return None

        def all_to_all_single(self, out, inp):
            out.copy_(inp)

    ok, why = P._check_all_reduce(torch, NoOpDist(), 1024, torch.device("cpu"), 0, 2)
    assert not ok and "1024 of 1024" in why
    ok, why = P._check_all_to_all(torch, NoOpDist(), 1024, torch.device("cpu"), 0, 2)
    assert not ok and "512 of 1024" in why   # its own chunk is right, the peer's is not


@pytest.mark.skipif(not HAVE_TORCH, reason="torch not importable")
@pytest.mark.slow
def test_real_probe_two_gloo_ranks(tmp_path):
    """The network step's local launcher: torchrun, 2 CPU processes, gloo, real collectives."""
    out = tmp_path / "network"
    args = argparse.Namespace(profile="local-cpu", out=str(out), engine=None, run_id=None, inputs=[],
                              backend="local", nproc=2, sizes="4096,262144")
    rc = run_step(network, args)
    log = (out / "probe-intra-local.log").read_text()
    assert rc == 0, log[-2000:]
    verdict = json.loads((out / "verdict.json").read_text())
    checks = {c["name"]: c for c in verdict["checks"]}
    assert checks["intra_correct"]["status"] == "pass"
    (rows,) = verdict["metrics"]["phases"]["intra"]["results"]
    assert {(r["op"], r["bytes"]) for r in rows} == {(op, b) for op in P.OPS for b in (4096, 262144)}
    for r in rows:
        assert r["correct"] and r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * P.bus_factor(r["op"], 2))
        assert r["algbw_gbps"] == pytest.approx(r["bytes"] / (r["time_us"] / 1e6) / 1e9, rel=1e-6)
    assert verdict["metrics"]["phases"]["intra"]["world_size"] == [2]
    env = json.loads((out / "probe-env.json").read_text())
    assert env["VLLM_ENFORCE_STRICT_TOOL_CALLING"] == "0"          # the engine's own env, passed through
