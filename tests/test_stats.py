"""Round validity, summaries and stability (the C32 rule's input)."""

import json
from pathlib import Path

import pytest

from gauntlet.steps.client.bench import parse_result
from gauntlet.steps.evidence.stats import mad, round_validity, spread_rel, stability, summarize

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "vllm-0.32.0-cpu/bench-serve-result.json"


def test_summary_is_median_with_min_max_and_iqr_not_best():
    s = summarize([10.0, 30.0, 20.0])
    assert (s.median, s.min, s.max) == (20.0, 10.0, 30.0)
    assert s.q1 == 15.0 and s.q3 == 25.0 and s.iqr == 10.0
    assert s.spread_rel == pytest.approx(1.0)


def test_summary_drops_none_and_nan():
    s = summarize([None, float("nan"), 4.0, 6.0])
    assert s.n == 2 and s.median == 5.0
    assert summarize([]).median is None and spread_rel([]) is None


def test_mad():
    assert mad([1, 2, 3, 4, 100]) == 1.0


def test_real_round_is_valid():
    rec = parse_result(json.loads(FIXTURE.read_text()))
    assert round_validity(rec, 16) == (True, "16/16 completed, 0 failed")


def test_round_with_one_failed_request_is_rejected():
    rec = dict(parse_result(json.loads(FIXTURE.read_text())), completed=15, failed=1)
    ok, why = round_validity(rec, 16)
    assert not ok and "completed 15 of 16" in why
    ok, why = round_validity(dict(rec, completed=16, failed=1), 16)
    assert not ok and "1 request(s) failed" in why


def _rounds(*tputs, valid=True):
    return [{"valid": valid, "output_throughput": t} for t in tputs]


@pytest.mark.parametrize("rounds,stable,why", [
    (_rounds(100, 101, 99), True, "spread 2.0% <= 10%"),
    (_rounds(100, 130, 99), False, "spread 31.0% > 10%"),
    (_rounds(100, 101) + _rounds(99, valid=False), False, "1 of 3 rounds invalid"),
    (_rounds(100, 101), False, "2 of 3 rounds ran"),
])
def test_stability(rounds, stable, why):
    st = stability(rounds, 0.1, 3)
    assert st.stable is stable
    assert why in st.reason
