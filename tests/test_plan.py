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
                      cases=[{"name": "c2", "input_len": 100, "output_len": 50, "concurrency": 2}])
    d["longctx"].update(ladder=[{"tokens": 65536}], needle_depths=[0.5], max_tokens=10)
    d["model"]["architecture"]["max_position_embeddings"] = 131072
    d["experiments"] = []
    d.update(top)
    return Profile.model_validate(d, strict=False)


def _row(plan, path):
    return next(r for r in plan.rows if r.path == path)


def test_arithmetic_by_hand() -> None:
    p = _small()
    plan = plan_profile(p)
    load = 10e9 / 5e9 + 100                                       # 2 s of reading on 1 node + init
    assert _row(plan, "vllm/deploy").seconds == pytest.approx(load)
    # n = 2 x 2 = 4 prompts; waves: warmup ceil(2/2) = 1, rounds 3 x ceil(4/2) = 6; a wave: 2 x 100 prefill
    # tokens at 1000 tok/s + 50 output tokens at 10 tok/s = 5.2 s; plus the ceiling run and the client start
    assert _row(plan, "vllm/perf").seconds == pytest.approx(60 + 15 + 7 * 5.2)
    # one rung of 65536 over the served 32768: one restart (a load), then one depth: prefill + 10-token answer
    assert _row(plan, "vllm/longctx").seconds == pytest.approx(load + 65536 / 1000 + 10 / 10)
    assert "1 restart" in _row(plan, "vllm/longctx").detail
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
                      cases=[{"name": "c2", "input_len": 100, "output_len": 50, "concurrency": 2}])
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
    d = json.loads(capsys.readouterr().out)
    assert d["orchestrator"] == "argo" and d["total_s"] <= d["workflow_deadline_s"]
    assert {r["path"] for r in d["rows"]} >= {"sglang/deploy", "vllm/exp-prefix-cache", "cleanup"}
    assert next(r for r in d["rows"] if r["path"] == "sglang/perf")["gpus"] == 16
