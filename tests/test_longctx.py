"""Gate 5: the ladder's stop rule, rung judgement, the vLLM long-context block, needle prompts."""

import pytest

from gauntlet.params import load_profile
from gauntlet.params.models import Rung
from gauntlet.steps.gates.longctx import (Probe, RungResult, blocked_reason, build_haystack, judge_answer, judge_rung, rung_outcome,
                           run_ladder)


def _send(outcomes):
    def send(r):
        oc = outcomes[r.tokens]
        st, label, detail = judge_rung(r, oc, [])
        return RungResult(r.tokens, r.expect, oc, st, label, detail)
    return send


def test_ladder_stops_at_first_failure():
    rungs = [Rung(tokens=t) for t in (4096, 1024, 2048, 8192)]
    sent = []
    outcomes = {1024: "passed", 2048: "missed", 4096: "passed", 8192: "passed"}
    res = run_ladder(rungs, lambda r: (sent.append(r.tokens), _send(outcomes)(r))[1], lambda r: None)
    assert sent == [1024, 2048]
    assert [r.outcome for r in res] == ["passed", "missed", "not-run", "not-run"]
    assert res[1].status == "fail" and "stopped at 2048" in res[2].detail


def test_local_ladder_known_limit_is_recorded_not_failed():
    lad = load_profile("local-cpu").longctx.ladder
    base = [r for r in lad if not r.requires_all_lower]
    res = run_ladder(base, _send({1024: "passed", 2048: "passed", 4096: "passed", 8192: "missed"}), lambda r: None)
    assert [r.tokens for r in res] == [1024, 2048, 4096, 8192]
    assert [r.status for r in res] == ["pass", "pass", "pass", "pass"]
    assert res[-1].label == "beyond capability (known)"
    assert not all(r.outcome == "passed" for r in res)  # so unlock_all_lower stays false


@pytest.mark.parametrize("expect,outcome,status,label", [
    ("pass", "passed", "pass", "passed"),
    ("pass", "missed", "fail", "missed"),
    ("pass", "refused", "fail", "refused"),
    ("pass", "error", "fail", "crash"),
    ("fail", "missed", "pass", "beyond capability (known)"),
    ("fail", "passed", "pass", "passed"),
    ("refused", "refused", "pass", "beyond capability (refused)"),
    ("refused", "passed", "fail", "accepted"),
    ("refused", "error", "fail", "crash"),
])
def test_judge_rung(expect, outcome, status, label):
    st, lb, _ = judge_rung(Rung(tokens=16384, expect=expect), outcome, [Probe(0.5, "1-A", status=400)])
    assert (st, lb) == (status, label)


def test_rung_outcome_from_probes():
    assert rung_outcome([Probe(0.1, "x", status=200, found=True)]) == "passed"
    assert rung_outcome([Probe(0.1, "x", status=200, found=True), Probe(0.5, "x", status=200)]) == "missed"
    assert rung_outcome([Probe(0.1, "x", status=400)]) == "refused"
    assert rung_outcome([Probe(0.1, "x", status=500)]) == "error"
    assert rung_outcome([Probe(0.1, "x", status=None, error="ReadTimeout")]) == "error"


def test_vllm_256k_blocked_unless_fixed():
    spec = load_profile("kimi-k3-h20").engines["vllm"]
    assert "refused until the image lists fix" in blocked_reason("vllm", spec, 262144, [])
    assert blocked_reason("vllm", spec, 131072, []) is None
    assert blocked_reason("vllm", spec, 262144, [spec.longctx_fix]) is None
    assert blocked_reason("sglang", load_profile("kimi-k3-h20").engines["sglang"], 1048576, []) is None  # no limit


def test_haystack_places_needle_at_depth():
    text = build_haystack(100, 0.9, "1234-ECHO")
    assert text.endswith("Reply with the passcode only.")
    pos = text.index("1234-ECHO") / len(text)
    assert 0.85 < pos < 0.95


def test_judge_answer():
    assert judge_answer("The passcode is 1234-ECHO.", "stop", "1234-ECHO") == (True, [])
    assert judge_answer("4321-ECHO", "stop", "1234-ECHO")[0] is False
    found, problems = judge_answer("1234-ECHO \ufffd\ufffd", "stop", "1234-ECHO")
    assert not found and problems


# ---- real engine --------------------------------------------------------------



@pytest.mark.engine
def test_ladder_real_engine_pass_then_refusal(tmp_path, endpoint):
    """1024 finds the needle at every depth; 16384 (> max-model-len 4096) is a 400: beyond capability. The
    session's engine has no deployment record here, so nothing is restarted (the evidence says so)."""
    import json

    from gauntlet.workflows.cli import main as gauntlet
    out = tmp_path / "longctx"
    rc = gauntlet(["step", "longctx", "--profile", "local-cpu", "--out", str(out), "--engine", "vllm",
                   "--endpoint", endpoint, "--rungs", "1024,16384"])
    v = json.loads((out / "verdict.json").read_text())
    rungs = {r["tokens"]: r for r in v["metrics"]["ladder"]}
    assert rungs[1024]["outcome"] == "passed", rungs[1024]
    assert all(900 <= p["prompt_tokens"] <= 1024 for p in rungs[1024]["probes"])
    assert rungs[16384]["outcome"] == "refused" and rungs[16384]["label"] == "beyond capability (refused)"
    assert "400" in rungs[16384]["detail"] and "no running deployment" in rungs[16384]["detail"]
    assert v["metrics"]["engine_restarts"] == []
    assert rc == 0 and v["status"] == "pass"
    # a refusal is not a pass: the rungs that need every lower one stay locked
    assert (out / "outputs" / "unlock_all_lower").read_text() == "false"


@pytest.mark.engine
def test_ladder_real_engine_unlocks_when_all_pass(tmp_path, endpoint):
    import json

    from gauntlet.workflows.cli import main as gauntlet
    out = tmp_path / "longctx"
    rc = gauntlet(["step", "longctx", "--profile", "local-cpu", "--out", str(out), "--engine", "vllm",
                   "--endpoint", endpoint, "--rungs", "1024"])
    assert rc == 0, json.loads((out / "verdict.json").read_text())
    assert (out / "outputs" / "unlock_all_lower").read_text() == "true"
