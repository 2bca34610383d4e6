"""Gate 4's climb to the highest concurrency that meets the SLO: its decision (pure), the profile's SLO, and the
climb stopping where its decision says, so no load past saturation or a miss is measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gauntlet.params import load_profile, profile_path
from gauntlet.params.loader import ProfileError
from gauntlet.params.models import SloSpec
from gauntlet.steps.client.bench import ClientRun, client_argv, goodput_args, parse_result
from gauntlet.steps.gates.perf import ClimbStep, climb_cases, climb_decision, slo_met
from gauntlet.workflows.cli import main as gauntlet

SLO = SloSpec(ttft_p99_ms=4500, tpot_p99_ms=80, climb=[1, 2, 4, 8, 16], climb_case="c16-1k-1k",
              saturation_gain_min=0.1)


def step(c: int, tput: float, ttft: float = 500.0, tpot: float = 40.0, invalid: str | None = None) -> ClimbStep:
    return ClimbStep(c, tput, ttft, tpot, invalid)


def test_the_climb_goes_on_while_each_step_meets_the_slo_and_gains():
    d = climb_decision([step(1, 25), step(2, 48)], SLO)
    assert d.go_on and d.highest == 2 and d.reason == "C2 meets the SLO; next C4"
    assert climb_decision([], SLO).go_on


def test_the_top_of_the_climb_meeting_the_slo_says_so():
    d = climb_decision([step(1, 25), step(2, 48), step(4, 90), step(8, 170), step(16, 300)], SLO)
    assert not d.go_on and d.highest == 16 and not d.saturated and "the climb's top" in d.reason


def test_a_step_over_the_slo_stops_the_climb_and_the_one_below_is_the_answer():
    d = climb_decision([step(1, 25), step(2, 48), step(4, 90, tpot=85.5)], SLO)
    assert not d.go_on and d.highest == 2 and d.reason == "C4 misses the SLO: TPOT p99 85.5 ms > 80 ms; TTFT p99 500 " \
        "ms <= 4500 ms"
    none = climb_decision([step(1, 25, ttft=5000)], SLO)
    assert not none.go_on and none.highest is None and "C1 misses the SLO: TTFT p99 5000 ms > 4500 ms" in none.reason
    # a p99 the client did not report is not a pass
    assert slo_met({"p99_ttft_ms": 100.0, "p99_tpot_ms": None}, SLO) == (False, "TPOT p99 not measured; TTFT p99 "
                                                                                "100 ms <= 4500 ms")


def test_a_saturated_server_stops_the_climb_within_the_slo():
    d = climb_decision([step(1, 25), step(2, 48), step(4, 50, tpot=70)], SLO)
    assert not d.go_on and d.saturated and d.highest == 4
    assert d.reason == "C4 saturates the server: output throughput +4.2% over C2 (< 10%) while TPOT p99 40 -> 70 ms"
    # flat throughput with latency that does not grow is no saturation (the step cost nothing): climb on
    assert climb_decision([step(1, 25), step(2, 26)], SLO).go_on
    # a gain at the bound is enough
    assert climb_decision([step(1, 25), step(2, 27.5, tpot=60)], SLO).go_on


def test_a_step_not_measured_validly_stops_the_climb():
    d = climb_decision([step(1, 25), step(2, 48, invalid="round 1: 1 request(s) failed")], SLO)
    assert not d.go_on and d.highest == 1 and d.reason == "C2 was not measured validly (round 1: 1 request(s) failed)"


def test_the_steps_take_the_named_case_shape():
    kimi = load_profile("kimi-k3-h20")
    slo = kimi.bench.slo
    assert slo is not None and (slo.ttft_p99_ms, slo.tpot_p99_ms) == (4500, 80)     # MLPerf llama3_1-405b-interactive
    shape = next(c for c in kimi.bench.cases if c.name == slo.climb_case)
    steps = climb_cases(shape, slo)
    assert [(s.name, s.concurrency, s.input_len, s.output_len, s.num_prompts) for s in steps[:2]] == \
        [("climb-c1", 1, 1024, 1024, None), ("climb-c2", 2, 1024, 1024, None)]
    assert [s.concurrency for s in steps] == [1, 2, 4, 8, 16, 32, 64]


def test_the_client_computes_its_own_goodput_against_the_slo():
    """vLLM's own flag and field (vllm/benchmarks/serve.py --goodput, result request_goodput)."""
    from gauntlet.steps.client.bench import BenchRequest, client_parser
    req = BenchRequest("http://127.0.0.1:1", "m", "/t", 128, 32, 2, 8, 42, Path("/tmp/x.json"),
                       goodput=goodput_args(4500, 80))
    args = client_parser().parse_args(client_argv(req))
    from vllm.benchmarks.serve import check_goodput_args
    assert check_goodput_args(args) == {"ttft": 4500.0, "tpot": 80.0}
    assert parse_result({"completed": 8, "request_goodput": 0.5})["request_goodput"] == 0.5
    assert parse_result({"completed": 8, "request_goodput": None})["request_goodput"] is None


def _profile(tmp_path: Path, **slo) -> Path:
    doc = yaml.safe_load(profile_path("local-cpu").read_text())
    doc["bench"]["slo"] = slo
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


@pytest.mark.parametrize("slo,why", [
    ({"ttft_p99_ms": 1000, "tpot_p99_ms": 50, "climb": [1, 4, 2], "climb_case": "c2-128-32"}, "must increase"),
    ({"ttft_p99_ms": 1000, "tpot_p99_ms": 50, "climb": [1, 2]}, "slo.climb_case None"),
    ({"ttft_p99_ms": 1000, "tpot_p99_ms": 50, "climb": [1, 2], "climb_case": "c9"}, "slo.climb_case 'c9'"),
    ({"ttft_p99_ms": 0, "tpot_p99_ms": 50}, "ttft_p99_ms"),
])
def test_a_bad_slo_is_refused(tmp_path, slo, why):
    with pytest.raises(ProfileError, match=why):
        load_profile(_profile(tmp_path, **slo))


def test_climb_without_a_climb_or_with_two_shapes_is_a_usage_error(tmp_path, capsys):
    no_climb = _profile(tmp_path, ttft_p99_ms=1000, tpot_p99_ms=50)
    common = ["step", "perf", "--out", str(tmp_path / "o"), "--engine", "vllm", "--endpoint", "http://127.0.0.1:9",
              "--phase", "climb"]
    assert gauntlet([*common, "--profile", str(no_climb), "--cases", "c2-128-32"]) == 2
    assert "states no bench.slo.climb" in capsys.readouterr().err
    assert gauntlet([*common, "--profile", "local-cpu", "--cases", "c2-128-32,c4-128-32"]) == 2
    assert "name the one case" in capsys.readouterr().err


def test_the_climb_measures_nothing_past_the_step_that_stops_it(tmp_path, monkeypatch):
    """Through the step: TPOT grows with the load and throughput stops growing at C4: C8 is never sent."""
    from gauntlet.steps.gates import perf

    sent: list[int] = []

    def client(req, **_):
        if "warmup" not in req.result_path.name:
            sent.append(req.concurrency)
        tput = {1: 25.0, 2: 48.0, 4: 50.0, 8: 51.0}[req.concurrency]
        return ClientRun({"completed": req.num_prompts, "failed": 0, "duration": 1.0, "output_throughput": tput,
                          "request_throughput": 1.0, "request_goodput": 1.0, "p99_ttft_ms": 300.0,
                          "p99_tpot_ms": 30.0 * req.concurrency}, 1.0, 1.0, "fake")

    monkeypatch.setattr(perf, "run_client", client)
    prof = _profile(tmp_path, ttft_p99_ms=10000, tpot_p99_ms=1000, climb=[1, 2, 4, 8], climb_case="c2-128-32")
    out = tmp_path / "run" / "vllm" / "perf-climb"
    rc = gauntlet(["step", "perf", "--profile", str(prof), "--out", str(out), "--engine", "vllm",
                   "--endpoint", "http://127.0.0.1:9", "--cases", "c2-128-32", "--phase", "climb", "--no-store",
                   "--no-ceiling", "--tokenizer", str(tmp_path), "--bench-python", "python3",
                   "--sample-interval", "60"])
    v = json.loads((out / "verdict.json").read_text())
    assert rc == 0, v
    assert sent == [1, 2, 4]
    climb = v["metrics"]["climb"]
    assert climb["highest"] == 4 and climb["saturated"] and climb["not_run"] == [8]
    top = next(c for c in v["checks"] if c["name"] == "climb/highest")
    assert top["status"] == "pass" and top["observed"] == 4 and "not measured: C8" in top["detail"]
    assert [c["status"] for c in v["checks"] if c["name"].startswith("climb/c")] == ["pass"] * 3
