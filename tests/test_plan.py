"""`gauntlet plan`: the estimate's arithmetic (checked by hand), every task estimated, render refusing deadlines
that cannot hold the estimate. Pure: no cluster, no engine (the rates are the profile's)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from gauntlet.params import load_profile, profile_path
from gauntlet.params.models import Profile
from gauntlet.workflows.cli import main
from gauntlet.workflows.graph import Dag, build_graph
from gauntlet.workflows.plan import ESTIMATES, PlanError, plan_graph, plan_profile, suggested_timeout, too_short
from gauntlet.workflows.render import render_documents


def _small(**top) -> Profile:
    """h200-1gpu made small enough to check by hand: one node of 1 GPU, one case, one rung, no variant."""
    d = yaml.safe_load(profile_path("h200-1gpu").read_text())
    d["model"]["weight_bytes"] = 10_000_000_000
    d["hardware"]["storage"]["read_gbps"] = 5.0
    d["engines"]["vllm"]["plan"] = {"init_s": 100, "prefill_tps": 1000, "decode_tps": 10}
    d["bench"].update(warmup_prompts=2, rounds=3, prompts_per_concurrency=2,
                      cases=[{"name": "c2", "input_len": 100, "output_len": 50, "concurrency": 2}],
                      slo=None)      # no climb (test_climb_by_hand adds one)
    d["longctx"].update(ladder=[{"tokens": 65536}], needle_depths=[0.5], max_tokens=10)
    d["model"]["architecture"]["max_position_embeddings"] = 131072
    d["experiments"] = []
    d.update(top)
    return Profile.model_validate(d, strict=False)


def _row(plan, path):
    return next(r for r in plan.rows if r.path == path)


def test_climb_by_hand() -> None:
    """The qualification's climb (after the regression cases): every step of bench.slo.climb on the climb
    case's shape, the first with the warmup; the nightly has none. c2's shape, C2 then C4, 1 round each:
    C2: 4 prompts + 2 warmup in 1 + 2 waves of (2 x 100 / 1000 + 50 / 10) = 15.6 s + the 15 s ceiling;
    C4: 8 prompts in 2 waves of (4 x 100 / 1000 + 5) = 10.8 s + 15 s; plus the client's 60 s start."""
    base = _small()
    bench = base.bench.model_dump()
    bench["slo"] = {"ttft_p99_ms": 500, "tpot_p99_ms": 30, "climb": [2, 4], "climb_case": "c2", "climb_rounds": 1}
    prof = _small(bench=bench)
    plan = plan_profile(prof)
    row = _row(plan, "vllm/climb")
    assert row.seconds == pytest.approx(60 + 30.6 + 25.8)
    assert "2 concurrencies (C2-C4)" in row.detail
    order = [r.path for r in plan.rows if r.path.startswith("vllm/")]
    assert order.index("vllm/confirm") < order.index("vllm/climb") < order.index("vllm/longctx"), order
    assert not any(r.path.endswith("/climb") for r in plan_profile(prof, "nightly").rows)
    assert not any(r.path.endswith("/climb") for r in plan_profile(base).rows)


def test_arithmetic_by_hand() -> None:
    p = _small()
    plan = plan_profile(p)
    load = 10e9 / 5e9 + 100                                       # 2 s of reading on 1 node + init
    assert _row(plan, "vllm/deploy").seconds == pytest.approx(load)
    # n = 2 x 2 = 4 prompts; waves: warmup ceil(2/2) = 1, rounds 3 x ceil(4/2) = 6; a wave: 2 x 100 prefill
    # tokens at 1000 tok/s + 50 output tokens at 10 tok/s = 5.2 s; plus the ceiling run and the client start
    assert _row(plan, "vllm/perf").seconds == pytest.approx(60 + 15 + 7 * 5.2)
    # one rung of 65536 over the served 32768: one restart (every rank stopped: the teardown figure, 300 s; then a
    # load), then one depth: prefill + the reply budget, the 10-token answer and Qwen3's thinking (model.reasoning:
    # the default 4096 tokens) at 10 tok/s
    assert _row(plan, "vllm/longctx").seconds == pytest.approx(300 + load + 65536 / 1000 + (10 + 4096) / 10)
    assert "1 restart(s) x (stop + load)" in _row(plan, "vllm/longctx").detail
    # GPUs: none in Gate 0, the node's in Gate 1, the engine's from deploy to teardown; GPU-h accumulate
    assert _row(plan, "preflight-0").gpus == 0 and _row(plan, "nodes-0").gpus == 1
    perf = _row(plan, "vllm/perf")
    assert perf.gpus == 1
    before = sum(r.seconds * r.gpus for r in plan.rows if r.end_s <= perf.end_s) / 3600
    assert perf.gpu_h_spent == pytest.approx(before)
    assert perf.start_s == pytest.approx(_row(plan, "vllm/smoke").end_s)
    # the assumptions name the profile field each rate came from, or say it is a default
    src = {a.name: a.source for a in plan.assumptions}
    assert src["hardware.storage.read_gbps"] == "hardware.storage.read_gbps"
    assert src["engines.vllm.plan.decode_tps"] == "engines.vllm.plan.decode_tps"
    assert src["preflight (s)"].startswith("default:")


def test_case_tps_replaces_the_wave_model() -> None:
    d = yaml.safe_load(profile_path("h200-1gpu").read_text())
    d["bench"].update(warmup_prompts=2, rounds=3, prompts_per_concurrency=2,
                      cases=[{"name": "c2", "input_len": 100, "output_len": 50, "concurrency": 2}], slo=None)
    d["experiments"] = []
    d["engines"]["vllm"]["plan"] = {"case_tps": {"c2": 300}}
    plan = plan_profile(Profile.model_validate(d, strict=False))
    # (2 warmup + 3 x 4) prompts x 150 tokens / 300 tok/s, plus the ceiling run and the client start
    assert _row(plan, "vllm/perf").seconds == pytest.approx(60 + 15 + 14 * 150 / 300)
    d["engines"]["vllm"]["plan"] = {"case_tps": {"nope": 300}}
    with pytest.raises(ValueError, match="case_tps.nope: no bench case"):
        Profile.model_validate(d, strict=False)


@pytest.mark.parametrize("name", ["kimi-k3-h20", "local-cpu", "h200-1gpu"])
def test_every_task_has_an_estimate(name: str) -> None:
    profile = load_profile(name)
    orch = "argo" if profile.hardware.kind == "kubernetes" else "local"
    graph = build_graph(profile, orch)
    plan = plan_graph(graph, profile, orch)
    seq_tasks = [t for d in graph.sequences for t in d.tasks]
    engines = [t for t in graph.main.tasks if t.dag]
    expected = len([t for t in graph.main.tasks if t.step]) + len(engines) * len(seq_tasks) + 1
    assert len(plan.rows) == expected
    assert {t.step for d in graph.dags for t in d.tasks if t.step} <= set(ESTIMATES)
    if orch == "local":
        assert all(r.gpus == 0 for r in plan.rows)


def test_a_step_without_an_estimate_is_one_clear_error() -> None:
    profile = load_profile("local-cpu")
    graph = build_graph(profile, "local")
    seq = graph.sequences[0]
    new = Dag(seq.name, (*seq.tasks, dataclasses.replace(seq.tasks[-1], name="brand-new", step="brand-new",
                                                          depends=())), seq.inputs)
    with pytest.raises(PlanError, match="task brand-new: no estimate for step 'brand-new'"):
        plan_graph(dataclasses.replace(graph, sequences=(new,)), profile, "local")


def test_render_refuses_a_deadline_the_plan_cannot_hold(tmp_path: Path, capsys) -> None:
    d = yaml.safe_load(profile_path("kimi-k3-h20").read_text())
    d["timeouts_s"] = {**d.get("timeouts_s", {}), "perf": 3600}
    path = tmp_path / "short.yaml"
    path.write_text(yaml.safe_dump(d))
    assert main(["render", "--profile", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("RenderError: kimi-k3-h20: sglang/perf needs ~")
    assert "its deadline is 60 min (gauntlet plan --profile kimi-k3-h20)" in err[0]
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    # the workflow's deadline too
    d["timeouts_s"].pop("perf")
    d["active_deadline_s"] = 8 * 3600
    path.write_text(yaml.safe_dump(d))
    assert main(["render", "--profile", str(path), "--out", str(tmp_path / "out")]) == 2
    assert "the run needs ~" in capsys.readouterr().err and "active_deadline_s is 8.0 h" in too_short(
        plan_profile(load_profile(str(path))))


def test_kimi_deadlines_come_from_the_plan() -> None:
    profile = load_profile("kimi-k3-h20")
    plan = plan_profile(profile)
    assert too_short(plan) is None
    assert profile.active_deadline_s >= plan.total_s
    # every deadline the profile sets is the plan's suggestion (1.5x, up to the next half hour) for that task
    for task, seconds in profile.timeouts_s.items():
        rows = [r for r in plan.rows if r.path.split("/")[-1] == task]
        assert seconds == max(suggested_timeout(r.seconds) for r in rows), task
    tmpl = render_documents(profile)["gauntlet-kimi-k3-h20.workflowtemplate.yaml"]
    by_name = {t["name"]: t for t in tmpl["spec"]["templates"]}
    assert by_name["seq-perf"]["activeDeadlineSeconds"] == profile.timeouts_s["perf"]
    assert tmpl["spec"]["activeDeadlineSeconds"] == profile.active_deadline_s


def test_timeouts_for_a_task_the_graph_has_not(tmp_path: Path, capsys) -> None:
    d = yaml.safe_load(profile_path("kimi-k3-h20").read_text())
    d["timeouts_s"] = {"perff": 60}
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(d))
    assert main(["plan", "--profile", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "timeouts_s names perff, no task of its graph" in err[0]


def test_cli_plan_table_and_json(capsys) -> None:
    assert main(["plan", "--profile", "local-cpu"]) == 0
    out = capsys.readouterr().out
    assert "vllm/perf" in out and "assumptions:" in out and "engines.vllm.plan.case_tps.c2-128-32" in out
    assert main(["plan", "--profile", "kimi-k3-h20", "--json"]) == 0
    both = json.loads(capsys.readouterr().out)
    assert set(both) == {"qualification", "nightly"} and both["nightly"]["run"] == "nightly"
    assert main(["plan", "--profile", "kimi-k3-h20", "--json", "--run", "qualification"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d == both["qualification"]
    assert d["orchestrator"] == "argo" and d["total_s"] <= d["workflow_deadline_s"]
    assert {r["path"] for r in d["rows"]} >= {"sglang/deploy", "vllm/exp-prefix-cache", "cleanup"}
    assert next(r for r in d["rows"] if r["path"] == "sglang/perf")["gpus"] == 16


def test_kimi_collective_timeout_outlasts_the_worst_rank_start_up_skew() -> None:
    """A rank waits in its first collective (the rendezvous, then the first all-reduce after loading) for the
    slowest of the 16: at worst one that still pulls the engine image (the plan's cold pull, Gate 1's pull
    task) and then reads its share of the weights at the profile's read rate (8 ranks share a node's
    rate). That is past torch's 600 s NCCL default, so each engine's dist_timeout_s must outlast it."""
    profile = load_profile("kimi-k3-h20")
    plan = plan_profile(profile)
    hw, m = profile.hardware, profile.model
    assert m.weight_bytes is not None and hw.storage.read_gbps is not None
    read_s = m.weight_bytes / hw.total_gpus / (hw.storage.read_gbps * 1e9 / hw.gpus_per_node)
    for engine, spec in profile.engines.items():
        skew = _row(plan, f"pull-{engine}-1").seconds + read_s
        assert read_s == pytest.approx(156.1, abs=0.1) and skew > 600
        assert spec.dist_timeout_s is not None and spec.dist_timeout_s >= skew, (engine, spec.dist_timeout_s, skew)
        assert spec.dist_timeout_s == suggested_timeout(skew)      # the plan's margin rule, as its deadlines


def test_kimi_nightly_fits_its_window_and_budget_and_shows_beside_the_qualification(capsys) -> None:
    """Two runs from one graph: the nightly is Gate 0, Gate 1, the baseline's deploy, smoke, Gate 4 on the
    regression cases with the confirm stage, regress, report, cleanup; its plan fits nightly.window_h and
    nightly.gpu_hours, and `gauntlet plan` prints both runs."""
    p = load_profile("kimi-k3-h20")
    night, qual = plan_profile(p, "nightly"), plan_profile(p, "qualification")
    paths = {r.path for r in night.rows}
    assert paths == {"params", "preflight-0", "preflight-1", "preflight-compare", "engine-check-sglang", "nodes-0",
                     "nodes-1", "pull-sglang-0", "pull-sglang-1", "network", "sglang/deploy", "sglang/smoke",
                     "sglang/perf", "sglang/suspect", "sglang/confirm", "sglang/teardown", "regress", "report",
                     "cleanup"}, sorted(paths)
    perf = next(r for r in night.rows if r.path == "sglang/perf")
    assert perf.detail.startswith("2 case(s)")
    confirm = next(r for r in night.rows if r.path == "sglang/confirm")
    assert confirm.detail.startswith("2 case(s)") and "6 rounds" in confirm.detail   # the nightly's cases, not all 4
    assert night.workflow_deadline_s == int(p.nightly.window_h * 3600) and night.gpu_h_budget == p.nightly.gpu_hours
    assert night.total_s <= night.workflow_deadline_s and night.gpu_h_total <= night.gpu_h_budget
    assert too_short(night) is None
    assert night.total_s < qual.total_s / 5 and night.gpu_h_total < qual.gpu_h_total / 5
    assert main(["plan", "--profile", "kimi-k3-h20"]) == 0
    out = capsys.readouterr().out
    assert "the qualification run (argo)" in out and "the nightly run (argo)" in out and "whole night:" in out
    runs = out.split("\nruns:\n", 1)[1].splitlines()
    assert runs[0].split()[0] == "qualification" and runs[1].split()[0] == "nightly"


def _nightly(**nightly) -> Profile:
    d = yaml.safe_load(profile_path("kimi-k3-h20").read_text())
    d["nightly"].update(nightly)
    return Profile.model_validate(d, strict=False)


def test_a_nightly_over_its_window_or_budget_is_refused_in_one_line(tmp_path: Path, capsys) -> None:
    """render refuses (exit 2, one line naming the limit) a nightly whose plan outgrows its window or its
    GPU-hour budget, and writes nothing."""
    over_window = _nightly(window_h=2.0)
    why = too_short(plan_profile(over_window, "nightly"))
    assert why is not None and "nightly: the run needs" in why and "nightly.window_h is 2.0 h" in why
    over_budget = _nightly(gpu_hours=20)
    why = too_short(plan_profile(over_budget, "nightly"))
    assert why is not None and "its budget nightly.gpu_hours is 20" in why and "--run nightly" in why
    for name, prof in (("window", over_window), ("budget", over_budget)):
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(prof.model_dump(mode="json")))
        out = tmp_path / f"out-{name}"
        assert main(["render", "--profile", str(path), "--out", str(out), "--allow-unverified-images"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("RenderError: kimi-k3-h20 nightly:"), err
        assert not out.exists()
