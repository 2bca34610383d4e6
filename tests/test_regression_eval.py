"""benchmarks/regression_eval.py runs as the docs say, and its goal check does not call sampling noise a lead.

It is a benchmark script (its figures are in docs/regression.md); these tests keep it runnable on a
noise file of a user's own and its wording honest, with few trials so they take seconds.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "regression_eval.py"
RECORDED = SCRIPT.parent / "data" / "noise-local-cpu.json"


def _module():
    spec = importlib.util.spec_from_file_location("regression_eval", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod           # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


def test_lead_inside_two_standard_errors_is_noise_not_a_lead():
    ev = _module()
    assert ev._lead(0.50, 0.50, 0.01) == "tie"
    assert ev._lead(0.143, 0.153, 0.029).startswith("within sampling noise: anchor higher by 1.0")
    assert ev._lead(0.40, 0.50, 0.01).startswith("ANCHOR AHEAD by 10.0")
    assert ev._lead(0.50, 0.40, 0.01).startswith("ours ahead by 10.0")


@pytest.mark.slow
def test_evaluate_on_a_noise_series_of_ones_own(tmp_path):
    """A user's own rounds (no case/profile keys) through the whole evaluation: table, goal check, JSON rows."""
    rounds = json.loads(RECORDED.read_text())["rounds"]
    own = tmp_path / "own.json"
    own.write_text(json.dumps({"rounds": [{k: r[k] for k in ("output_throughput", "request_throughput", "p99_ttft_ms",
                                                            "p99_tpot_ms", "p99_e2el_ms", "valid")} for r in rounds]}))
    r = _run("evaluate", str(own), "--trials", "200", "--otava-trials", "0", "--offset-trials", "0",
             "--json", str(tmp_path / "rows.json"))
    assert r.returncode == 0, r.stderr
    assert "note: 200 trials" in r.stdout
    for series in ("recorded", "CV 1%", "CV 2%", "CV 5%"):
        assert f"| {series} | ours (suspect + confirm) |" in r.stdout
        assert f"- {series}: false alarms" in r.stdout
    rows = json.loads((tmp_path / "rows.json").read_text())
    ours = [x for x in rows if x["key"] == "ours"]
    assert len(ours) == 4 and all(0 <= x["step 0"]["fa_any"] <= 1 for x in ours)
    # at CV 1% a 20% step is found on the first night by the rule, every time
    assert next(x for x in ours if x["series"] == "CV 1%")["step 0.2"]["first"] == 1.0


def test_bad_noise_file_and_missing_otava_are_one_line_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rounds": [{"output_throughput": 1.0}]}))
    r = _run("evaluate", str(bad), "--otava-trials", "0")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0 and "cannot read recorded rounds" in r.stderr
    if importlib.util.find_spec("otava") is None:
        r = _run("evaluate", str(RECORDED), "--trials", "10")
        assert r.returncode != 0 and "apache-otava is not installed" in r.stderr and "Traceback" not in r.stderr


def _nights(values_per_metric):
    """(1 trial, nights, 5 metrics) night values: the same series on every metric (throughputs first)."""
    import numpy as np
    return np.array([[[v] * 5 for v in values_per_metric]], dtype=float)


def test_hud_policy_is_its_published_rule():
    """pytorch/test-infra's vLLM policy: the baseline point nearest the median of the 3 nights before a 3-night
    comparison window; a throughput below 0.8 x it, a latency above 1.2 x, violates; regression on 2 in a row at
    the end."""
    ev = _module()
    tp, lat = ev.TPUT[0], ev.MET.index("p99_ttft_ms")
    # baseline window 100, 90, 110 -> 100; comparison 100, 79, 79: throughput regressed, latency not (lower)
    reg, sus = ev.hud_policy(_nights([100, 90, 110, 100, 79, 79]), 5)
    assert reg[0, tp] and not reg[0, lat] and not sus.any()
    # only tonight bad: one violation, no regression; 80 is not below 0.8 x 100 (strict)
    assert not ev.hud_policy(_nights([100, 90, 110, 100, 100, 79]), 5)[0].any()
    assert not ev.hud_policy(_nights([100, 90, 110, 100, 80, 80]), 5)[0][0, tp]
    # latency 121 twice: above 1.2 x 100
    reg, _ = ev.hud_policy(_nights([100, 90, 110, 100, 121, 121]), 5)
    assert reg[0, lat] and not reg[0, tp]


def test_sglang_policy_is_its_published_rule():
    """sgl-project/sglang's ci_performance_regression: the mean of the 10 runs before the latest, 10% either way."""
    ev = _module()
    tp, lat = ev.TPUT[0], ev.MET.index("p99_e2el_ms")
    hist = [95, 105] * 5                        # mean 100
    assert ev.sglang_policy(_nights(hist + [89.9]), 10)[0, tp]
    assert not ev.sglang_policy(_nights(hist + [90.1]), 10)[0, tp]
    got = ev.sglang_policy(_nights(hist + [110.1]), 10)
    assert got[0, lat] and not got[0, tp]


def test_policies_runs_and_prints_one_row_per_policy_and_series(tmp_path):
    out = tmp_path / "rows.json"
    r = _run("policies", str(RECORDED), "--trials", "60", "--grid-trials", "30", "--json", str(out))
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())
    assert [(x["series"], x["key"]) for x in rows] == [
        (s, k) for s in ("recorded", "CV 1%", "CV 2%", "CV 5%") for k in ("ours", "hud", "sglang")]
    # HUD needs two bad nights in a row: it never calls a step on its first night
    assert all(min(x["first 0.3"]) >= 2 for x in rows if x["key"] == "hud")
    assert "| CV 2% | ours (suspect, confirm on 6 fresh rounds) |" in r.stdout
