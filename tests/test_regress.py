"""Regression labels on constructed histories, and the step against a real store."""

import dataclasses
import random
import statistics

import pytest

from gauntlet.params import load_profile
from gauntlet.steps.gates.regress import DEFAULT_RULE, Options, Rule, judge, judge_metric, judge_two_stage, nightly_medians, run
from gauntlet.steps.evidence.results import append_rounds


def _hist(n, centre=100.0, jitter=0.01, seed=1):
    rng = random.Random(seed)
    return [centre * (1 + rng.uniform(-jitter, jitter)) for _ in range(n)]


@pytest.mark.parametrize("value,label", [(100.5, "ok"), (90.0, "regressed"), (111.0, "improved")])
def test_throughput_labels(value, label):
    assert judge_metric(value, _hist(10), +1, 0.03)[0] == label


def test_latency_direction_is_inverted():
    assert judge_metric(130.0, _hist(10), -1, 0.10)[0] == "regressed"
    assert judge_metric(70.0, _hist(10), -1, 0.10)[0] == "improved"


def test_insufficient_history():
    assert judge_metric(50.0, _hist(6), +1, 0.03)[0] == "insufficient history"
    assert judge_metric(None, _hist(10), +1, 0.03)[0] == "insufficient history"


def test_one_bad_night_in_history_does_not_mask_a_drop():
    hist = _hist(9) + [40.0]          # an outage night in the history
    assert judge_metric(90.0, hist, +1, 0.03)[0] == "regressed"


def test_noisy_history_widens_the_band():
    noisy = _hist(10, jitter=0.15, seed=3)
    assert judge_metric(92.0, noisy, +1, 0.03)[0] == "ok"


def test_window_keeps_only_recent_nights():
    old = [200.0] * 20
    recent = _hist(5)
    assert judge_metric(100.0, old + recent, +1, 0.03, Rule(window=5, min_history=5))[0] == "ok"


def test_judge_labels_every_metric():
    cur = {("vllm", "c2"): {"output_throughput": 80.0, "p99_ttft_ms": 300.0}}
    hist = {("vllm", "c2"): [{"output_throughput": v, "p99_ttft_ms": 300.0} for v in _hist(8)]}
    labels = {lb.metric: lb.label for lb in judge(cur, hist, DEFAULT_RULE)}
    assert labels["output_throughput"] == "regressed" and labels["p99_ttft_ms"] == "ok"
    assert labels["p99_tpot_ms"] == "insufficient history"


def test_nightly_medians_ignore_invalid_rounds_and_order_by_time():
    rows = [dict(run_id="b", engine="vllm", case="c", valid=True, timestamp="2026-12-02T02:00", output_throughput=t)
            for t in (1.0, 2.0, 30.0)]
    rows += [dict(run_id="a", engine="vllm", case="c", valid=True, timestamp="2026-12-01T02:00", output_throughput=5.0),
             dict(run_id="a", engine="vllm", case="c", valid=False, timestamp="2026-12-01T02:00",
                  output_throughput=500.0)]
    n = nightly_medians(rows)
    assert list(n) == ["a", "b"]
    assert n["b"][("vllm", "c")]["output_throughput"] == 2.0 and n["a"][("vllm", "c")]["output_throughput"] == 5.0


def _store(tmp_path, nights, drop=1.0):
    rng = random.Random(7)
    rows = []
    for i in range(nights + 1):
        last = i == nights
        for rnd in range(3):
            t = 50.0 * (1 + rng.uniform(-0.01, 0.01)) * (drop if last else 1.0)
            rows.append(dict(run_id=f"night{i:02d}", profile="local-cpu", engine="vllm", date=f"2026-11-{i + 1:02d}",
                             timestamp=f"2026-11-{i + 1:02d}T02:00:00", client="vllm-bench-serve", args_hash="h",
                             experiment="baseline", phase="measure", case="c2-128-32", round=rnd + 1, valid=True,
                             output_throughput=t, request_throughput=t / 32, p99_ttft_ms=300.0, p99_tpot_ms=40.0,
                             p99_e2el_ms=1500.0))
    append_rounds(rows, tmp_path / "store")
    return f"night{nights:02d}"


def _args(tmp_path, run_id):
    return Options(profile=load_profile("local-cpu"), results_uri=str(tmp_path / "store"),
                   run_id=run_id, k=3.0, window=14, min_history=7)


def test_step_flags_an_injected_10pct_drop(tmp_path):
    run_id = _store(tmp_path, 8, drop=0.90)
    checks, metrics = run(_args(tmp_path, run_id), tmp_path / "out")
    assert metrics["outputs"]["regressed"] is True
    failed = [c.name for c in checks if c.status == "fail"]
    assert "vllm/c2-128-32/output_throughput" in failed
    assert (tmp_path / "out" / "labels.json").exists()


def test_step_passes_without_a_change(tmp_path):
    run_id = _store(tmp_path, 8)
    checks, metrics = run(_args(tmp_path, run_id), tmp_path / "out")
    assert metrics["outputs"]["regressed"] is False and all(c.status == "pass" for c in checks)


def test_after_a_failure_it_judges_what_was_measured_then_fails(tmp_path):
    """regress runs whatever happened before it (workflows/graph.py): here vLLM's sequence failed, SGLang's rounds
    are in the store. It labels them as always, then fails with an ``upstream`` check, so a failed gate before it
    is still reset by Argo's RETRY (util.go isDescendantNodeSucceeded: a Succeeded descendant keeps it failed)."""
    run_id = _store(tmp_path, 8)
    opts = dataclasses.replace(_args(tmp_path, run_id), upstream=("sglang=Succeeded", "vllm=Failed"))
    checks, metrics = run(opts, tmp_path / "out")
    labels = [c for c in checks if c.name.startswith("vllm/c2-128-32/")]
    assert labels and all(c.status == "pass" for c in labels) and metrics["outputs"]["regressed"] is False
    upstream = next(c for c in checks if c.name == "upstream")
    assert upstream.status == "fail" and upstream.observed == {"vllm": "Failed"} and metrics["upstream"]["vllm"] == "Failed"
    assert "Regress judged what was measured" in upstream.detail
    # nothing failed before it: no such check
    passed = dataclasses.replace(opts, upstream=("sglang=Succeeded", "vllm=Skipped"))
    assert "upstream" not in {c.name for c in run(passed, tmp_path / "out2")[0]}


def test_step_passes_with_insufficient_history(tmp_path):
    run_id = _store(tmp_path, 2, drop=0.5)
    checks, metrics = run(_args(tmp_path, run_id), tmp_path / "out")
    assert metrics["outputs"]["regressed"] is False
    assert all(c.observed == "insufficient data" and c.status == "pass" for c in checks)
    assert all(lb["label"] == "insufficient history" and lb["verdict"] == "insufficient data" for lb in metrics["labels"])


# ---- confirm before alarm ----------------------------------------------------------

def _noisy(n=14, sd=0.02, seed=5):
    rng = random.Random(seed)
    return [100.0 * (1 + rng.gauss(0, sd)) for _ in range(n)]


def _band(hist, k):
    from gauntlet.steps.evidence.stats import mad, median
    return max(k * 1.4826 * mad(hist), 0.03 * median(hist))


def test_suspicion_is_labelled_regressed_only_when_confirmed():
    hist = _noisy()
    rule = DEFAULT_RULE
    from gauntlet.steps.evidence.stats import median
    centre = median(hist)
    night = centre - (_band(hist, rule.k_suspect) + _band(hist, rule.k)) / 2   # past suspect, inside the band
    cleared = judge_two_stage(night, hist, +1, 0.03, rule, confirm=centre, confirm_rounds=6)
    confirmed = judge_two_stage(night, hist, +1, 0.03, rule, confirm=centre - 1.2 * cleared["confirm_threshold"],
                                confirm_rounds=6)
    unchecked = judge_two_stage(night, hist, +1, 0.03, rule)
    assert confirmed["label"] == "regressed" and confirmed["suspected"]
    assert cleared["label"] == "unconfirmed" and cleared["confirm_value"] == centre
    assert unchecked["label"] == "suspect"                      # no confirmation: the single-night band
    assert judge_two_stage(centre - 2 * _band(hist, rule.k), hist, +1, 0.03, rule)["label"] == "regressed"


def test_more_confirmation_rounds_tighten_the_confirmation_band():
    hist = _noisy(sd=0.05)
    a = judge_two_stage(80.0, hist, +1, 0.03, DEFAULT_RULE, confirm=80.0, confirm_rounds=3)
    b = judge_two_stage(80.0, hist, +1, 0.03, DEFAULT_RULE, confirm=80.0, confirm_rounds=12)
    assert a["confirm_threshold"] / b["confirm_threshold"] == pytest.approx(2.0)   # sigma / sqrt(rounds)
    between = a["centre"] - (a["confirm_threshold"] + b["confirm_threshold"]) / 2
    assert judge_two_stage(80.0, hist, +1, 0.03, DEFAULT_RULE, confirm=between, confirm_rounds=3)["label"] == \
        "unconfirmed"
    assert judge_two_stage(80.0, hist, +1, 0.03, DEFAULT_RULE, confirm=between, confirm_rounds=12)["label"] == \
        "regressed"


def test_a_quiet_night_is_never_suspected():
    hist = _noisy()
    j = judge_two_stage(hist[-1], hist, +1, 0.03, DEFAULT_RULE, confirm=10.0, confirm_rounds=6)
    assert j["label"] == "ok" and not j["suspected"] and j["confirm_value"] is None


def _confirm_rows(run_id, factor, n=6):
    return [dict(run_id=run_id, profile="local-cpu", engine="vllm", date="2026-11-30", timestamp="2026-11-30T03:00:00",
                 client="vllm-bench-serve", args_hash="h", experiment="baseline", phase="confirm", case="c2-128-32",
                 round=i + 1, valid=True, output_throughput=50.0 * factor, request_throughput=50.0 * factor / 32,
                 p99_ttft_ms=300.0, p99_tpot_ms=40.0, p99_e2el_ms=1500.0) for i in range(n)]


def _stage_args(tmp_path, run_id, stage):
    return dataclasses.replace(_args(tmp_path, run_id), stage=stage, engine="vllm" if stage == "suspect" else None)


def test_suspect_stage_names_the_case_and_never_fails(tmp_path):
    run_id = _store(tmp_path, 8, drop=0.90)
    checks, metrics = run(_stage_args(tmp_path, run_id, "suspect"), tmp_path / "suspect")
    assert metrics["outputs"]["suspect"] is True and metrics["outputs"]["suspect_cases"] == "c2-128-32"
    assert all(c.status == "pass" for c in checks)
    quiet = _store(tmp_path / "q", 8)
    _, m2 = run(_stage_args(tmp_path / "q", quiet, "suspect"), tmp_path / "q-suspect")
    assert m2["outputs"] == {"regressed": False, "suspect": False, "suspect_cases": ""}


@pytest.mark.parametrize("factor,label", [(0.90, "regressed"), (1.0, "unconfirmed")])
def test_final_stage_judges_the_confirmation_rounds(tmp_path, factor, label):
    run_id = _store(tmp_path, 8, drop=0.90)
    append_rounds(_confirm_rows(run_id, factor), tmp_path / "store")
    checks, metrics = run(_stage_args(tmp_path, run_id, "final"), tmp_path / "out")
    lb = next(x for x in metrics["labels"] if x["metric"] == "output_throughput")
    assert lb["label"] == label and lb["suspected"] and lb["confirm_rounds"] == 6
    assert metrics["outputs"]["regressed"] is (label == "regressed")
    assert len(metrics["rounds"]["confirm"]["vllm/c2-128-32"]) == 6
    assert len(metrics["rounds"]["measure"]["vllm/c2-128-32"]) == 3


@pytest.mark.parametrize("suspect,runs", [("true", True), ("false", False), ("", False)])
def test_confirmation_runs_only_on_a_suspicion_and_never_holds_longctx_back(suspect, runs):
    """The graph both back ends walk: confirm's `when` on the suspect stage's output (its Argo default is
    empty), and longctx after confirm whether it ran or was skipped."""
    from gauntlet.workflows import refs
    from gauntlet.workflows.graph import build_graph

    seq = build_graph(load_profile("local-cpu"), "local").sequences[0]
    confirm, longctx = seq.task("confirm"), seq.task("longctx")
    assert confirm.when.subject == refs.output("suspect", "suspect")
    assert confirm.when.holds(suspect) is runs
    assert confirm.step == "perf" and "--phase" in confirm.args and "confirm" in confirm.args
    assert str(DEFAULT_RULE.confirm_rounds) in confirm.args
    assert seq.task("suspect").step == "regress" and "suspect" in seq.task("suspect").args
    # the climb to the highest load meeting the SLO runs next whether confirm ran or was skipped; then Gate 6's
    # baseline phases on the still-up baseline, then longctx
    after = seq.task("climb")
    assert after.upstream == ("confirm",) and seq.task("baseline-phases").upstream == ("climb",)
    assert longctx.upstream == ("baseline-phases",)
    assert all(n.met({"confirm": "Succeeded" if runs else "Skipped"}) for n in after.depends)


# ---- where the change came from --------------------------------------------------

def _night_rows(i, value, digest, rev="abc", driver="550.54.15", nodes="node-a"):
    return [dict(run_id=f"night{i:02d}", profile="local-cpu", engine="vllm", date=f"2026-11-{i + 1:02d}",
                 timestamp=f"2026-11-{i + 1:02d}T02:00:00", client="vllm-bench-serve", args_hash="h",
                 experiment="baseline", phase="measure", case="c2-128-32", round=r + 1, valid=True,
                 image_digest=digest, model_fingerprint="fp", git_rev=rev, nodes=nodes, driver=driver,
                 output_throughput=value * (1 + 0.002 * (r - 1)), request_throughput=value / 32, p99_ttft_ms=300.0,
                 p99_tpot_ms=40.0, p99_e2el_ms=1500.0) for r in range(3)]


@pytest.mark.parametrize("bad_before", [0, 1])
def test_regressed_label_names_last_good_first_bad_and_what_differed(tmp_path, bad_before):
    rng = random.Random(3)
    good = 10 - bad_before
    rows = [r for i in range(good) for r in _night_rows(i, 50.0 * (1 + rng.uniform(-0.01, 0.01)), "sha256:aaa")]
    # the new image lands on night `good`; with bad_before=1 it already ran (suspected, unconfirmed) a night ago
    rows += [r for i in range(good, 11) for r in _night_rows(i, 40.0, "sha256:bbb", rev="def")]
    append_rounds(rows, tmp_path / "store")
    checks, metrics = run(_args(tmp_path, "night10"), tmp_path / "out")
    lb = next(x for x in metrics["labels"] if x["metric"] == "output_throughput")
    assert lb["label"] == "regressed"
    o = lb["origin"]
    assert o["last_good"]["run_id"] == f"night{good - 1:02d}" and o["first_bad"]["run_id"] == f"night{good:02d}"
    assert o["differed"] == {"image_digest": {"last_good": "sha256:aaa", "first_bad": "sha256:bbb"},
                             "git_rev": {"last_good": "abc", "first_bad": "def"}}
    detail = next(c.detail for c in checks if c.name == "vllm/c2-128-32/output_throughput")
    assert f"first bad night{good:02d} (2026-11-{good + 1:02d})" in detail
    assert "image_digest sha256:aaa->sha256:bbb" in detail and detail.startswith("regressed: ")
    assert o["last_good"]["date"] == f"2026-11-{good:02d}" and o["first_bad"]["date"] == f"2026-11-{good + 1:02d}"
    assert all(x["origin"] is None for x in metrics["labels"] if x["verdict"] != "regressed")


# ---- real engine: suspect, confirm, label ------------------------------------------------

@pytest.mark.engine
def test_confirm_before_alarm_real_engine(tmp_path, endpoint):
    """A history three times as fast as this engine: the suspect stage names the case, perf --phase confirm
    measures it again on the real engine, and the final stage labels it regressed with both sets of rounds."""
    import json

    import yaml

    from gauntlet.params import profile_path
    from gauntlet.steps.evidence.results import read_rounds
    from gauntlet.workflows.cli import main as gauntlet

    doc = yaml.safe_load(profile_path("local-cpu").read_text())
    doc["bench"].update(warmup_prompts=1, prompts_per_concurrency=1)
    doc["bench"]["cases"] = [dict(doc["bench"]["cases"][0], output_len=8)]
    for e in doc["engines"].values():      # the plan's per-case rates name only cases the profile has
        if (e.get("plan") or {}).get("case_tps"):
            e["plan"]["case_tps"] = {k: v for k, v in e["plan"]["case_tps"].items() if k == "c2-128-32"}
    prof = tmp_path / "local-small.yaml"
    prof.write_text(yaml.safe_dump(doc))
    run = tmp_path / "runs" / "tonight"
    store = str(tmp_path / "store")
    common = ["--profile", str(prof), "--results-uri", store]
    assert gauntlet(["step", "perf", *common, "--out", str(run / "vllm" / "perf"), "--engine", "vllm",
                     "--endpoint", endpoint, "--cases", "c2-128-32"]) == 0
    tonight = read_rounds(store).to_pylist()
    # eight earlier, quiet nights on the same args hash and client, three times as fast as tonight's median: a 67%
    # drop. Quiet: each night's rounds within 0.4% of each other, so the confirmation's band comes from the history,
    # not from tonight's rounds, which a loaded CI machine can spread by 100% (then even -50% was "unconfirmed")
    med = {k: statistics.median(r[k] for r in tonight) for k in ("output_throughput", "request_throughput")}
    hist = [dict(r, run_id=f"night{i}", timestamp=f"2026-11-{i + 1:02d}T02:00:00", date=f"2026-11-{i + 1:02d}",
                 image_digest="sha256:old",
                 **{k: 3 * v * (1 + 0.01 * (i % 3)) * (1 + 0.002 * j) for k, v in med.items()})
            for i in range(8) for j, r in enumerate(tonight)]
    append_rounds(hist, store)
    assert gauntlet(["step", "regress", *common, "--out", str(run / "vllm" / "suspect"), "--engine", "vllm",
                     "--stage", "suspect"]) == 0
    outs = run / "vllm" / "suspect" / "outputs"
    assert (outs / "suspect").read_text().strip() == "true"
    cases = (outs / "suspect_cases").read_text().strip()
    assert cases == "c2-128-32"
    assert gauntlet(["step", "perf", *common, "--out", str(run / "vllm" / "confirm"), "--engine", "vllm",
                     "--endpoint", endpoint, "--cases", cases, "--phase", "confirm", "--rounds", "6"]) == 0
    assert gauntlet(["step", "regress", *common, "--out", str(run / "regress")]) == 1      # a confirmed regression
    v = json.loads((run / "regress" / "verdict.json").read_text())
    lb = next(x for x in v["metrics"]["labels"] if x["metric"] == "output_throughput")
    assert lb["label"] == "regressed" and lb["suspected"] and lb["confirm_rounds"] == 6
    assert lb["origin"]["last_good"]["run_id"] == "night7" and lb["origin"]["first_bad"]["run_id"] == "tonight"
    assert "image_digest" in lb["origin"]["differed"]
    assert len(v["metrics"]["rounds"]["confirm"]["vllm/c2-128-32"]) == 6


# ---- the confirmation's sigma from the history's rounds ------------------------------------------

from gauntlet.steps.gates.regress import confirm_sigma, median_var, round_sigma  # noqa: E402

# 14 nights: each night's rounds m - 3, m, m + 3 (within-night pairs differ by 3, 3, 6); the nights'
# medians m spread as a night median of such rounds would (robust night sigma 2.22)
_OFFSETS = (-3, -2, -1.5, -1, -0.5, 0, 0, 0.5, 1, 1.5, 2, 3, -2.5, 2.5)
_ROUNDS = [[100 + o - 3, 100 + o, 100 + o + 3] for o in _OFFSETS]


def test_round_sigma_pools_pairs_within_nights_and_ignores_offsets_between_them():
    assert round_sigma([[1.0, 2.0, 3.0]] * 7) == pytest.approx(1 / (0.67449 * 2 ** 0.5))
    shifted = [[v + 50 * i for v in rs] for i, rs in enumerate([[1.0, 2.0, 3.0]] * 7)]
    assert round_sigma(shifted) == round_sigma([[1.0, 2.0, 3.0]] * 7)
    slow = [[1.0, 2.0, 300.0]] + [[1.0, 2.0, 3.0]] * 6                        # one slow round
    assert round_sigma(slow) == round_sigma([[1.0, 2.0, 3.0]] * 7)
    assert round_sigma([[1.0]] * 7) is None and round_sigma([[1.0, 2.0]] * 6, min_nights=7) is None


def test_confirm_sigma_is_within_night_spread_plus_what_the_nights_add():
    assert confirm_sigma(2.0, 0.0, 3, 6) == pytest.approx(2.0)                 # all between nights
    only_within = 3.0 * median_var(3) ** 0.5                                   # night sigma = its within part
    assert confirm_sigma(only_within, 3.0, 3, 6) == pytest.approx(3.0 * median_var(6) ** 0.5)
    assert confirm_sigma(only_within, 3.0, 3, 12) < confirm_sigma(only_within, 3.0, 3, 6)
    assert confirm_sigma(only_within + 1, 3.0, 3, 6) > confirm_sigma(only_within, 3.0, 3, 6)


def test_history_rounds_confirm_a_drop_the_night_sigma_rule_leaves_unconfirmed():
    hist = [rs[1] for rs in _ROUNDS]
    new = judge_two_stage(95.0, hist, +1, 0.02, DEFAULT_RULE, confirm=96.0, confirm_rounds=6, history_rounds=_ROUNDS)
    old = judge_two_stage(95.0, hist, +1, 0.02, DEFAULT_RULE, confirm=96.0, confirm_rounds=6)
    assert new["suspected"] and new["label"] == "regressed"
    assert old["suspected"] and old["label"] == "unconfirmed"
    assert new["confirm_threshold"] < 4.0 < old["confirm_threshold"]
    # too few nights with rounds: the night-sigma rule
    few = judge_two_stage(95.0, hist, +1, 0.02, DEFAULT_RULE, confirm=96.0, confirm_rounds=6,
                          history_rounds=_ROUNDS[:DEFAULT_RULE.min_history - 1])
    assert few["confirm_threshold"] == old["confirm_threshold"]


def test_nights_that_differ_more_than_their_rounds_keep_a_repeat_of_the_offset_unconfirmed():
    """Tight rounds, nights far apart (a restart's warm state, a neighbour for hours): a confirmation on
    the same night repeats the night's offset, and the between-night part of its sigma keeps it a suspicion."""
    offsets = [-10, -6, -4, -3, -2, -1, 0, 0, 1, 2, 3, 4, 6, 10]
    rounds = [[100 + o - 0.3, 100 + o, 100 + o + 0.3] for o in offsets]
    hist = [rs[1] for rs in rounds]
    j = judge_two_stage(92.0, hist, +1, 0.02, DEFAULT_RULE, confirm=92.0, confirm_rounds=6, history_rounds=rounds)
    assert j["suspected"] and j["label"] == "unconfirmed"
    within_only = DEFAULT_RULE.k_confirm * round_sigma(rounds) * median_var(6) ** 0.5
    assert within_only < 100 - 92.0 < j["confirm_threshold"]


def _rows_of_night(i, rounds, phase="measure"):
    return [dict(run_id=f"night{i:02d}", profile="local-cpu", engine="vllm", date=f"2026-11-{i + 1:02d}",
                 timestamp=f"2026-11-{i + 1:02d}T0{2 if phase == 'measure' else 3}:00:00", client="vllm-bench-serve",
                 args_hash="h", experiment="baseline", phase=phase, case="c2-128-32", round=r + 1, valid=True,
                 image_digest="sha256:aaa" if i < len(_ROUNDS) else "sha256:bbb", output_throughput=v,
                 request_throughput=v / 32, p99_ttft_ms=300.0, p99_tpot_ms=40.0, p99_e2el_ms=1500.0)
            for r, v in enumerate(rounds)]


def test_two_night_step_only_the_rounds_rule_labels(tmp_path):
    """Two nights 5% down: the first night's confirmation (median 97) clears both rules; the second's
    (median 96) is confirmed by the store's rounds and not by the night-sigma rule."""
    store = tmp_path / "store"
    a, b = len(_ROUNDS), len(_ROUNDS) + 1
    rows = [r for i, rs in enumerate(_ROUNDS) for r in _rows_of_night(i, rs)]
    rows += _rows_of_night(a, [93.0, 95.0, 97.0]) + _rows_of_night(a, [94.0, 96.0, 97.0, 97.0, 98.0, 99.0], "confirm")
    rows += _rows_of_night(b, [93.0, 95.0, 97.0]) + _rows_of_night(b, [93.0, 95.0, 96.0, 96.0, 97.0, 99.0], "confirm")
    append_rounds(rows, store)
    labels = {}
    for night in (a, b):
        _, metrics = run(_stage_args(tmp_path, f"night{night:02d}", "final"), tmp_path / f"out{night}")
        labels[night] = next(x for x in metrics["labels"] if x["metric"] == "output_throughput")
    assert labels[a]["label"] == "unconfirmed" and labels[b]["label"] == "regressed"
    assert labels[b]["origin"]["first_bad"]["run_id"] == f"night{a:02d}"
    # the same nights by the night-sigma rule (no rounds): neither is labelled
    hist = [rs[1] for rs in _ROUNDS] + [95.0]
    for night, conf in ((a, 97.0), (b, 96.0)):
        h = hist[:len(_ROUNDS) + (night - a)]
        assert judge_two_stage(95.0, h, +1, 0.02, DEFAULT_RULE, confirm=conf, confirm_rounds=6)["label"] == \
            "unconfirmed"


def _simulate(step, trials=1000, cv=0.05, seed=11, rounds=True):
    """Normal rounds, 14 nights of 3, a night and its 6 confirmation rounds ``step`` down: how often labelled."""
    rng = random.Random(seed)
    hits = 0
    for _ in range(trials):
        nights = [[100 * (1 + rng.gauss(0, cv)) for _ in range(3)] for _ in range(14)]
        hist = [sorted(rs)[1] for rs in nights]
        night = sorted(100 * (1 - step) * (1 + rng.gauss(0, cv)) for _ in range(3))[1]
        conf = sorted(100 * (1 - step) * (1 + rng.gauss(0, cv)) for _ in range(6))
        j = judge_two_stage(night, hist, +1, 0.02, DEFAULT_RULE, confirm=(conf[2] + conf[3]) / 2, confirm_rounds=6,
                            history_rounds=nights if rounds else None)
        hits += j["label"] == "regressed"
    return hits / trials


def test_no_change_stays_within_the_budget_and_a_step_is_found_more_often():
    assert _simulate(0.0) <= 0.01
    assert _simulate(0.10) > _simulate(0.10, rounds=False) + 0.03


# ---- the user's verdict: regressed / suspicious / no regression / insufficient data ------------------------

from gauntlet.steps.gates.regress import VERDICT, VERDICTS, summary, verdict_of  # noqa: E402


def test_every_label_has_exactly_one_verdict_and_only_regressed_fails():
    from gauntlet.steps.gates.regress import FAILING, PASSING
    assert set(VERDICT) == set(FAILING) | set(PASSING) and set(VERDICT.values()) == set(VERDICTS)
    assert [lb for lb in VERDICT if verdict_of(lb) == "regressed"] == list(FAILING)
    assert {lb for lb in VERDICT if verdict_of(lb) == "suspicious"} == {"unconfirmed", "suspect"}
    assert {lb for lb in VERDICT if verdict_of(lb) == "no regression"} == {"ok", "improved"}


def _verdict_store(tmp_path, last, confirm=None, good_driver="550.54.15", bad_driver="550.54.15",
                   bad_nodes="node-a", bad_digest="sha256:" + "a" * 64):
    """Ten quiet nights (output 50 tok/s, image a..., driver 550.54.15, node-a), then tonight at ``last`` (with
    its own image, driver and nodes), and ``confirm`` rounds for tonight when given."""
    rng = random.Random(3)
    rows = [r for i in range(10) for r in _night_rows(i, 50.0 * (1 + rng.uniform(-0.01, 0.01)), "sha256:" + "a" * 64,
                                                      driver=good_driver)]
    rows += _night_rows(10, last, bad_digest, driver=bad_driver, nodes=bad_nodes)
    if confirm is not None:
        rows += [dict(r, phase="confirm", round=j + 1, output_throughput=confirm)
                 for j, r in enumerate(_night_rows(10, confirm, bad_digest, driver=bad_driver, nodes=bad_nodes) * 2)]
    append_rounds(rows, tmp_path / "store")
    return run(_args(tmp_path, "night10"), tmp_path / "out")


@pytest.mark.parametrize("last,confirm,verdict,status", [
    (44.0, 44.0, "regressed", "fail"),      # -12%, the 6 fresh rounds repeat it
    (48.6, 50.0, "suspicious", "pass"),     # -2.8%: suspected, the fresh rounds do not confirm it
    (48.6, None, "regressed", "fail"),      # no fresh rounds (the engine was gone): the single-night band
    (50.1, None, "no regression", "pass"),
    (56.0, None, "no regression", "pass"),  # improved: kept as a note
])
def test_verdicts_on_a_real_store(tmp_path, last, confirm, verdict, status):
    checks, metrics = _verdict_store(tmp_path, last, confirm)
    lb = next(x for x in metrics["labels"] if x["metric"] == "output_throughput")
    check = next(c for c in checks if c.name == "vllm/c2-128-32/output_throughput")
    assert lb["verdict"] == verdict and check.observed == verdict and check.status == status
    assert metrics["outputs"]["regressed"] is (verdict == "regressed")
    if verdict == "no regression":
        assert lb["origin"] is None
        assert lb["note"] == ("improved +12.0%" if last > 55 else "") or lb["note"].startswith("improved +1")
        return
    # a bad night: tonight is the first bad one, night09 the last good; nothing else changed
    o = lb["origin"]
    assert o["first_bad"]["run_id"] == "night10" and o["first_bad"]["date"] == "2026-11-11"
    assert o["last_good"]["run_id"] == "night09" and o["last_good"]["date"] == "2026-11-10"
    assert o["differed"] == {}
    expected_note = {(True, "regressed"): "confirmed by 6 fresh rounds", (True, "suspicious"): "not confirmed by 6",
                     (False, "regressed"): "beyond the single-night band (no confirmation rounds)"}
    assert expected_note[(confirm is not None, verdict)] in lb["note"]


def test_improved_keeps_its_note(tmp_path):
    _, metrics = _verdict_store(tmp_path, 56.0)
    lb = next(x for x in metrics["labels"] if x["metric"] == "output_throughput")
    assert lb["label"] == "improved" and lb["verdict"] == "no regression" and lb["note"].startswith("improved +1")


def test_insufficient_data_names_the_nights(tmp_path):
    run_id = _store(tmp_path, 3, drop=0.5)
    checks, metrics = run(_args(tmp_path, run_id), tmp_path / "out")
    lb = next(x for x in metrics["labels"] if x["metric"] == "output_throughput")
    assert lb["verdict"] == "insufficient data" and lb["note"] == "3 night(s) of history" and lb["origin"] is None
    assert summary(metrics["labels"]) == "5 insufficient data"


def test_origin_names_image_driver_and_nodes_that_changed(tmp_path):
    checks, metrics = _verdict_store(tmp_path, 44.0, 44.0, bad_driver="570.86.10", bad_nodes="node-b",
                                     bad_digest="sha256:" + "b" * 64)
    lb = next(x for x in metrics["labels"] if x["metric"] == "output_throughput")
    assert lb["verdict"] == "regressed"
    assert lb["origin"]["differed"] == {
        "image_digest": {"last_good": "sha256:" + "a" * 64, "first_bad": "sha256:" + "b" * 64},
        "driver": {"last_good": "550.54.15", "first_bad": "570.86.10"},
        "nodes": {"last_good": "node-a", "first_bad": "node-b"}}
    # request throughput drops with it (one duration); the latencies did not move: no regression, no origin
    rq = next(x for x in metrics["labels"] if x["metric"] == "request_throughput")
    assert rq["verdict"] == "regressed" and rq["origin"] == lb["origin"]
    assert all(x["origin"] is None for x in metrics["labels"] if x["verdict"] == "no regression")
    changed = ("first bad night10: image sha256:aaaaaaaaaaaa->sha256:bbbbbbbbbbbb, driver 550.54.15->570.86.10, "
               "nodes node-a->node-b")
    assert summary(metrics["labels"]) == (f"2 regressed (vllm/c2-128-32 output_throughput -11.7%, {changed}; "
                                          f"vllm/c2-128-32 request_throughput -11.7%, {changed}), 3 no regression")
    detail = next(c.detail for c in checks if c.name == "vllm/c2-128-32/output_throughput")
    assert "last good night night09 (2026-11-10), first bad night10 (2026-11-11): image_digest" in detail
    assert "driver 550.54.15->570.86.10, nodes node-a->node-b" in detail


def test_a_driver_the_last_good_night_did_not_record_is_no_change(tmp_path):
    """Rows stored before the driver column existed read null: the first night with it names no driver change."""
    _, metrics = _verdict_store(tmp_path, 44.0, 44.0, good_driver=None, bad_driver="570.86.10")
    lb = next(x for x in metrics["labels"] if x["metric"] == "output_throughput")
    assert lb["verdict"] == "regressed" and lb["origin"]["differed"] == {}
    assert "same image, args, driver, nodes, model and revision" in summary(metrics["labels"])


def test_summary_counts_each_verdict_and_details_each_regression():
    def lb(label, metric="output_throughput", **kw):
        return {"engine": "sglang", "case": "chat-c16", "metric": metric, "label": label, **kw}
    origin = {"last_good": {"run_id": "n12"}, "first_bad": {"run_id": "n13"},
              "differed": {"image_digest": {"last_good": "sha256:aa", "first_bad": "sha256:bb"}}}
    labels = [lb("regressed", change_rel=-0.05, confirm_change_rel=-0.079, origin=origin), lb("unconfirmed"),
              *[lb("ok")] * 9, lb("improved")]
    assert summary(labels) == ("1 regressed (sglang/chat-c16 output_throughput -7.9%, first bad n13: image "
                               "sha256:aa->sha256:bb), 1 suspicious, 10 no regression")
    assert summary([]) == "no regression verdict"
    many = [lb("regressed", metric=f"m{i}", change_rel=-0.1) for i in range(5)]
    assert summary(many).startswith("5 regressed (sglang/chat-c16 m0 -10.0%; ") and "and 2 more)" in summary(many)


def test_driver_is_gate1s_on_a_cluster_and_none_on_a_cpu_run(tmp_path):
    """The store's driver column: each node's Gate 1 inventory (nodes-<i>, its driver) joined; none on a profile
    without GPUs (the local CPU run); what run_meta stamps on every round."""
    from gauntlet.contract import Check, Verdict, now_iso
    from gauntlet.steps.evidence.runmeta import driver, run_meta

    local = load_profile("local-cpu")
    run_dir = tmp_path / "runs" / "r1"
    assert driver(run_dir, local) == "none"
    assert run_meta(run_dir / "vllm" / "perf", local, "vllm")["driver"] == "none"
    for i, v in enumerate(("570.86.10", "570.86.10")):
        Verdict.of("nodes", now_iso(), [Check("gpu_count", "pass")], {"node": f"n{i}", "driver": v}
                   ).write(run_dir / f"nodes-{i}")
    assert driver(run_dir, local) == "570.86.10"
    Verdict.of("nodes", now_iso(), [Check("gpu_count", "pass")], {"node": "n2", "driver": "550.54.15"}
               ).write(run_dir / "nodes-2")
    assert driver(run_dir, local) == "550.54.15,570.86.10"
    assert run_meta(run_dir / "vllm" / "perf", local, "vllm")["driver"] == "550.54.15,570.86.10"
    (run_dir / "nodes-3").mkdir()
    (run_dir / "nodes-3" / "verdict.json").write_text("{not json")     # a corrupt one is passed over
    assert driver(run_dir, local) == "550.54.15,570.86.10"


def test_the_driver_column_round_trips_through_the_store(tmp_path):
    from gauntlet.steps.evidence.results import read_rounds
    append_rounds(_night_rows(0, 50.0, "sha256:aaa", driver="570.86.10"), tmp_path / "store")
    assert {r["driver"] for r in read_rounds(tmp_path / "store").to_pylist()} == {"570.86.10"}
