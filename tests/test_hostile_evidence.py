"""Hostile evidence: a verdict.json that is a list, a string, truncated, binary, empty or missing keys (or whose
metrics the report cannot read) is named in the report as "corrupt verdict (why)", never dropped in silence
("Gates: 0 pass, 0 fail") and never a traceback; the contract's ``Verdict.read`` is the one reader that says why."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gauntlet.contract import STATUSES, Check, CorruptVerdict, Verdict, now_iso
from gauntlet.steps.gates import report as report_step
from gauntlet.steps.evidence.report import build_report, corrupt_line, write_report
from gauntlet.steps.runner import run_step

GOOD = Verdict.of("smoke", now_iso(), [Check("models", "pass", detail="as expected")], {"engine": "vllm"})


@pytest.mark.parametrize("body,why", [
    (b"[1, 2]", "a JSON list, not an object"),
    (b'"pass"', "a JSON string, not an object"),
    (b'{"gate": "perf", "status": "pa', "truncated after 30 bytes"),
    (b"\x89PNG\r\n\x1a\n\x00\xff", "not UTF-8 text"),
    (b"", "empty"),
    (b"{}", "no gate"),
    (b'{"gate": "perf"}', "no status"),
    (b'{"gate": "perf", "status": "green"}', "status 'green' is not one of pass, fail, skip, error"),
    (b'{"gate": "perf", "status": "pass", "checks": {"a": 1}}', "checks is a JSON object, not a list"),
    (b'{"gate": "perf", "status": "pass", "checks": [{"name": "x"}]}', "checks[0] is not a check"),
    (b'{"gate": "perf", "status": "pass", "metrics": [1]}', "metrics is a JSON list, not an object"),
    (b"[" * 100_000, "nested too deeply"),
    (b"1" * 5000, "not JSON this reader accepts"),
    (b'{"gate": "perf", "status": "pass"} trailing', "not JSON: Extra data"),
])
def test_verdict_read_names_the_file_and_why(tmp_path, body, why):
    (tmp_path / "verdict.json").write_bytes(body)
    with pytest.raises(CorruptVerdict) as exc:
        Verdict.read(tmp_path)
    msg = str(exc.value)
    assert msg.startswith(f"{tmp_path / 'verdict.json'}: corrupt verdict (") and why in msg and "\n" not in msg
    assert exc.value.exit_code == 1 and why in exc.value.why


def test_verdict_read_missing_and_round_trip(tmp_path):
    with pytest.raises(CorruptVerdict, match="corrupt verdict \\(missing\\)"):
        Verdict.read(tmp_path)
    GOOD.write(tmp_path)
    assert Verdict.read(tmp_path) == GOOD and Verdict.read(tmp_path / "verdict.json") == GOOD
    (tmp_path / "verdict.json").write_text(json.dumps({**GOOD.to_dict(), "future_key": 1}))
    assert Verdict.read(tmp_path).gate == "smoke"         # keys a later version adds are not corruption


def _run_with(tmp_path: Path, bodies: dict[str, bytes]) -> Path:
    run = tmp_path / "runs" / "r1"
    GOOD.write(run / "vllm" / "smoke")
    for rel, body in bodies.items():
        (run / rel).mkdir(parents=True, exist_ok=True)
        (run / rel / "verdict.json").write_bytes(body)
    return run


def test_the_report_names_every_corrupt_verdict_and_keeps_the_good_ones(tmp_path):
    run = _run_with(tmp_path, {"vllm/perf": b"[]", "vllm/longctx": b'{"gate": "longctx", "sta',
                               "deploy": b"\x00\xff\xfe", "regress": b'"fail"'})
    written = build_report(run, [])
    md = written.path.read_text()
    assert "Gates: 1 pass, 0 fail, 0 error, 0 skip, 4 corrupt verdict(s)." in md
    for rel in ("vllm/perf", "vllm/longctx", "deploy", "regress"):
        assert f"{rel}/verdict.json: corrupt verdict (" in md
        assert f"| {rel} | ? | **corrupt verdict** |" in md and f"### {rel}: **CORRUPT VERDICT**" in md
    assert "| vllm/smoke | smoke | **pass** |" in md
    assert len(written.corrupt) == 4 and "vllm/longctx/verdict.json: corrupt verdict (truncated" in " ".join(
        written.corrupt)


@pytest.mark.parametrize("metrics", [
    {"cases": "not a mapping"},
    {"cases": {"c2": 5}},
    {"cases": {"c2": {"table": {"output_throughput": {"median": "x", "min": 1, "max": 2}}, "rounds": [7]}}},
])
def test_metrics_the_report_cannot_read_name_the_file(tmp_path, metrics):
    bad = Verdict.of("perf", now_iso(), [Check("c2/stable", "pass")], {"engine": "vllm", **metrics})
    run = _run_with(tmp_path, {"vllm/perf": json.dumps(bad.to_dict()).encode()})
    md = write_report(run, []).read_text()
    assert "vllm/perf/verdict.json: corrupt verdict (its metrics do not read: " in md
    assert "| vllm/smoke | smoke | **pass** |" in md


def _step(tmp_path: Path, run: Path, regress_verdict: str | None = None) -> tuple[int, dict]:
    args = argparse.Namespace(profile="local-cpu", out=str(run / "report"), run_dir=run,
                              results_uri=str(tmp_path / "results"), regress_verdict=regress_verdict)
    rc = run_step(report_step, args)
    return rc, json.loads((run / "report" / "verdict.json").read_text())


def test_the_report_step_fails_on_a_corrupt_verdict_naming_it(tmp_path):
    rc, v = _step(tmp_path, _run_with(tmp_path, {"vllm/perf": b"[1]"}))
    checks = {c["name"]: c for c in v["checks"]}
    assert rc == 1 and checks["report"]["status"] == "pass" and checks["evidence"]["status"] == "fail"
    assert "vllm/perf/verdict.json: corrupt verdict (a JSON list, not an object)" in checks["evidence"]["detail"]


def test_a_corrupt_regress_verdict_is_named_by_the_regression_check(tmp_path):
    rc, v = _step(tmp_path, _run_with(tmp_path, {"regress": b"{not json"}), regress_verdict="fail")
    regression = next(c for c in v["checks"] if c["name"] == "regression")
    assert rc == 1 and "regress/verdict.json: corrupt verdict (not JSON" in regression["detail"]


def test_quarantined_store_files_are_named_in_the_report_and_fail_it(tmp_path):
    q = {"path": "rounds/profile=local-cpu/engine=vllm/date=2026-12-01/ab-0.parquet", "why": "no footer",
         "moved_to": "quarantine/rounds/profile=local-cpu/engine=vllm/date=2026-12-01/ab-0.parquet"}
    reg = Verdict.of("regress", now_iso(), [Check("results-store", "skip", detail="quarantined")],
                     {"stage": "suspect", "labels": [], "quarantined": [q]})
    run = _run_with(tmp_path, {"vllm/suspect": json.dumps(reg.to_dict()).encode()})
    rc, v = _step(tmp_path, run)
    store = next(c for c in v["checks"] if c["name"] == "results-store")
    assert rc == 1 and store["status"] == "fail" and q["path"] in store["detail"] and q["moved_to"] in store["detail"]
    md = (run / "report.md").read_text()
    assert f"results store: quarantined {q['path']} (no footer): moved to {q['moved_to']}" in md


# ---- property: whatever a verdict.json holds, the report is written and names it or shows it ---------------

_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
                     lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                     max_leaves=12)
_GATES = st.sampled_from(["perf", "longctx", "regress", "experiment", "smoke", "deploy"]) | _JSON
_METRIC_KEYS = ["engine", "cases", "diagnostics", "meta", "ladder", "engine_restarts", "labels", "rounds", "stage",
                "variant", "change", "comparison", "comparisons", "phase_verdicts", "tables", "speculative",
                "known_deviations", "prefix_cache_hit_rate", "quarantined"]
_CHECK = st.fixed_dictionaries({"name": st.text(max_size=10) | _JSON, "status": st.sampled_from(STATUSES) | _JSON},
                               optional={"detail": _JSON, "expected": _JSON})
_VERDICTISH = st.fixed_dictionaries(
    {"gate": _GATES, "status": st.sampled_from(STATUSES) | _JSON},
    optional={"checks": st.lists(_CHECK, max_size=3) | _JSON, "started": st.text(max_size=5) | _JSON,
              "metrics": st.dictionaries(st.sampled_from(_METRIC_KEYS), _JSON, max_size=4) | _JSON})
# the words the report's sections look up, so that generated metrics reach them
_WORDS = ["table", "rounds", "median", "min", "max", "iqr", "concurrency", "input_len", "output_len", "stability",
          "stable", "spread_rel", "resources", "headroom", "tokens", "expect", "outcome", "label", "detail", "probes",
          "prompt_tokens", "engine", "case", "metric", "value", "centre", "change_rel", "origin", "last_good",
          "first_bad", "differed", "run_id", "output_throughput", "p99_ttft_ms", "p99_e2el_ms", "c2", "measure",
          "baseline", "variant", "error", "completed", "num_prompts", "client", "ok", "rung", "to_context",
          *_METRIC_KEYS]
_SHAPED = st.recursive(st.none() | st.booleans() | st.integers(-3, 10**6) | st.floats() | st.sampled_from(_WORDS),
                       lambda c: st.lists(c, max_size=3) | st.dictionaries(st.sampled_from(_WORDS), c, max_size=5),
                       max_leaves=25)
_NEAR = st.fixed_dictionaries(      # a valid verdict whose metrics are anything the report might look up
    {"gate": st.sampled_from(["perf", "longctx", "regress", "experiment", "smoke"]),
     "status": st.sampled_from(STATUSES), "checks": st.lists(st.fixed_dictionaries(
         {"name": st.text(max_size=8), "status": st.sampled_from(STATUSES), "detail": st.text(max_size=8)}),
         max_size=2),
     "metrics": st.dictionaries(st.sampled_from(_METRIC_KEYS), _SHAPED, max_size=4)})
_BODIES = st.one_of(
    st.binary(max_size=64),
    _JSON.map(lambda x: json.dumps(x).encode()),
    _VERDICTISH.map(lambda x: json.dumps(x).encode()),
    _NEAR.map(lambda x: json.dumps(x).encode()),
    _NEAR.map(lambda x: json.dumps(x).encode()),
    _VERDICTISH.map(lambda x: json.dumps(x).encode()).flatmap(
        lambda b: st.integers(0, max(0, len(b) - 1)).map(lambda n: b[:n])),       # truncated anywhere
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rel=st.sampled_from(["vllm/perf", "regress", "vllm/longctx", "vllm/exp-x/deploy/../../experiment"]),
       body=_BODIES)
def test_any_verdict_file_is_shown_or_named_never_a_traceback(rel, body):
    """Property: generated bytes, JSON and near-verdicts (truncated anywhere, any metrics) in a run's
    verdict.json: the report is written; the file is either a verdict shown in the gate table or a corrupt verdict
    named with why; the good verdict beside it is always shown."""
    rel = rel.replace("/exp-x/deploy/../..", "")
    with tempfile.TemporaryDirectory() as tmp:
        run = _run_with(Path(tmp), {rel: body})
        written = build_report(run, [])
        md = written.path.read_text()
        assert "| vllm/smoke | smoke | **pass** |" in md
        try:
            v = Verdict.read(run / rel)
        except CorruptVerdict as exc:
            assert corrupt_line(rel, exc.why).replace("|", "\\|") in md.replace("\n", " ")
            return
        shown = f"| {rel} | {v.gate.replace('|', chr(92) + '|')} | **{v.status}** |"
        assert shown in md or f"{rel}/verdict.json: corrupt verdict (its metrics do not read: " in md
