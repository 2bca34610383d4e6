"""Rendered Argo documents: golden files, graph properties, determinism.

Golden files are compared after parsing; regenerate them only on purpose with
``GAUNTLET_UPDATE_GOLDEN=1 pytest tests/test_render.py``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from params import load_profile
from workflows.graph import build_graph
from workflows.lint import lint_paths
from workflows.render import RUN_LABEL, dump_yaml, render_documents, render_profile

GOLDEN = Path(__file__).parent / "golden"
PROFILES = ["kimi-k3-h20", "local-cpu"]


def _docs(profile: str) -> dict:
    return render_documents(load_profile(profile))


def _wt(profile: str = "kimi-k3-h20") -> dict:
    return next(v for k, v in _docs(profile).items() if k.endswith(".workflowtemplate.yaml"))


def _cron(profile: str = "kimi-k3-h20") -> dict:
    return next(v for k, v in _docs(profile).items() if k.endswith(".cronworkflow.yaml"))


def _templates(wt: dict) -> dict[str, dict]:
    return {t["name"]: t for t in wt["spec"]["templates"]}


def _tasks(wt: dict, dag: str) -> dict[str, dict]:
    return {t["name"]: t for t in _templates(wt)[dag]["dag"]["tasks"]}


@pytest.mark.parametrize("profile", PROFILES)
def test_golden(profile, tmp_path):
    docs = _docs(profile)
    for name, doc in docs.items():
        golden = GOLDEN / profile / name
        if os.environ.get("GAUNTLET_UPDATE_GOLDEN") == "1":
            golden.parent.mkdir(parents=True, exist_ok=True)
            golden.write_text(dump_yaml(doc))
        assert golden.is_file(), f"missing golden {golden}: run with GAUNTLET_UPDATE_GOLDEN=1"
        want = list(yaml.safe_load_all(golden.read_text()))
        got = doc if isinstance(doc, list) else [doc]
        assert got == want, f"{name} differs from its golden file"


@pytest.mark.parametrize("profile", PROFILES)
def test_rendered_files_pass_strict_lint_and_are_deterministic(profile, tmp_path):
    a = render_profile(load_profile(profile), tmp_path / "a")
    b = render_profile(load_profile(profile), tmp_path / "b")
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    assert lint_paths(a) == []


def test_make_run_style_render_writes_template_and_cron(tmp_path):
    r = subprocess.run([sys.executable, "-m", "workflows.cli", "render", "--profile", "kimi-k3-h20",
                        "--out", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["gauntlet-kimi-k3-h20-nightly.cronworkflow.yaml", "gauntlet-kimi-k3-h20.rbac.yaml",
                     "gauntlet-kimi-k3-h20.workflowtemplate.yaml"]
    assert "lint: ok" in r.stdout


def _depends_terms(expr: str) -> list[str]:
    return re.findall(r"([A-Za-z0-9-]+)\.(Succeeded|Skipped|Failed)", expr or "")


def test_every_gate_depends_on_its_predecessors_success():
    wt = _wt()
    graph = build_graph(load_profile("kimi-k3-h20"))
    for dag in graph.dags:
        tasks = _tasks(wt, dag.name)
        for t in dag.tasks:
            if t.local_only:
                continue
            rendered = tasks[t.name]
            if t.depends is None:
                assert "depends" not in rendered
                continue
            terms = _depends_terms(rendered["depends"])
            assert terms, rendered["depends"]
            # a predecessor is only ever accepted as Succeeded (or Skipped, for optional cases)
            assert {s for _, s in terms} <= {"Succeeded", "Skipped"} or t.name == "report"
            for name, state in terms:
                if state == "Skipped":
                    assert (name, "Succeeded") in terms


def test_gate_order_of_the_plan():
    tasks = _tasks(_wt(), "main")
    order = ["preflight-0", "preflight-compare", "engine-check-sglang", "nodes-0", "network", "sglang", "vllm",
             "regress", "report"]
    for before, after in zip(order, order[1:]):
        assert before in tasks[after]["depends"] or any(
            before in tasks[d]["depends"] for d, _ in _depends_terms(tasks[after]["depends"])), (before, after)
    seq = _tasks(_wt(), "engine-sequence")
    chain = ["deploy", "smoke", "perf", "perf-c32-1k-1k", "suspect", "confirm", "longctx", "longctx-1048576",
             "exp-prefix-cache", "exp-dspark", "exp-hicache", "teardown"]
    for before, after in zip(chain, chain[1:]):
        assert f"{before}.Succeeded" in seq[after]["depends"], (before, after, seq[after]["depends"])
    assert seq["perf-c32-1k-1k"]["when"] == "{{tasks.perf.outputs.parameters.unlock_c32_1k_1k}} == true"
    assert seq["longctx-1048576"]["when"] == "{{tasks.longctx.outputs.parameters.unlock_all_lower}} == true"
    # confirm before alarm: the suspected cases only, measured again while the engine is up
    assert seq["confirm"]["when"] == "'{{tasks.suspect.outputs.parameters.suspect}}' == 'true'"
    assert "{{tasks.suspect.outputs.parameters.suspect_cases}}" in str(seq["confirm"]["arguments"])
    # vLLM Experimental only after the SGLang baseline, and the same sequence template for both
    main = _tasks(_wt(), "main")
    assert main["sglang"]["template"] == main["vllm"]["template"] == "engine-sequence"
    assert "sglang.Succeeded" in main["vllm"]["depends"]


def test_exit_handler_reaches_every_engine():
    wt = _wt()
    spec = wt["spec"]
    assert spec["onExit"] == "cleanup"
    cleanup = _templates(wt)["cleanup"]
    args = cleanup["container"]["args"]
    assert "{{workflow.status}}" in args and "{{workflow.failures}}" in args
    assert cleanup["container"]["args"][:2] == ["step", "cleanup"]
    # cleanup acts on the run label, which every pod of every engine carries
    assert spec["podMetadata"]["labels"][RUN_LABEL] == "{{workflow.uid}}"
    engines = {a["value"] for t in _tasks(wt, "main").values() if t.get("template") == "engine-sequence"
               for a in t["arguments"]["parameters"]}
    assert engines == set(load_profile("kimi-k3-h20").engines)


def test_retries_only_on_exit_75():
    for t in _wt()["spec"]["templates"]:
        if "container" not in t:
            continue
        rs = t["retryStrategy"]
        assert rs["expression"] == "asInt(lastRetry.exitCode) == 75", t["name"]


def test_gpu_requests_only_where_gpus_are_used():
    for t in _wt()["spec"]["templates"]:
        if "container" not in t:
            continue
        res = t["container"].get("resources", {})
        gpus = res.get("requests", {}).get("nvidia.com/gpu")
        if t["name"].startswith("nodes-"):
            assert gpus == "8"
        else:
            assert gpus is None, f"{t['name']} must not request GPUs"
    tmpl = _templates(_wt())
    for i in (0, 1):
        pre = tmpl[f"preflight-{i}"]
        assert "nvidia.com/gpu" not in str(pre["container"]["resources"])
        assert pre["nodeSelector"] == {"kubernetes.io/hostname": load_profile("kimi-k3-h20").hardware.nodes[i].name}
        mount = next(m for m in pre["container"]["volumeMounts"] if m["name"] == "model-cache")
        assert mount["readOnly"] is True and mount["mountPath"] == "/models-nvme/Kimi-K3/v1"


def test_outputs_have_defaults_and_evidence_artifacts():
    for t in _wt()["spec"]["templates"]:
        if "container" not in t:
            continue
        params = {p["name"]: p for p in t["outputs"]["parameters"]}
        assert params["verdict"]["valueFrom"]["default"] == "error"
        assert all("default" in p["valueFrom"] for p in params.values())
        assert t["outputs"]["artifacts"][0]["name"] == "evidence"


def test_workflow_level_settings():
    spec = _wt()["spec"]
    assert spec["synchronization"] == {"mutexes": [{"name": "gauntlet-h20-kimi"}]}
    assert spec["serviceAccountName"] == "gauntlet"
    assert spec["activeDeadlineSeconds"] == 28800
    assert spec["podGC"]["strategy"] and spec["ttlStrategy"]["secondsAfterFailure"]
    engines = next(p for p in spec["arguments"]["parameters"] if p["name"] == "engines")
    assert engines["enum"] == ["both", "sglang", "vllm"] and engines["value"] == "both"


def test_cron_forbids_overlap_and_refs_the_template():
    cron = _cron()
    spec = cron["spec"]
    assert spec["concurrencyPolicy"] == "Forbid"
    assert spec["schedules"] == ["0 2 * * *"] and "schedule" not in spec
    assert spec["timezone"] == "Asia/Shanghai"
    assert spec["startingDeadlineSeconds"] > 0
    assert spec["workflowSpec"]["workflowTemplateRef"] == {"name": "gauntlet-kimi-k3-h20"}


def test_rbac_is_namespaced_and_least_privilege():
    """Everything that writes is namespaced; the one cluster-wide grant is listing pods (read-only),
    which Gate 1 needs to name other teams' GPU pods on our nodes."""
    rbac = next(v for k, v in _docs("kimi-k3-h20").items() if k.endswith(".rbac.yaml"))
    kinds = sorted(d["kind"] for d in rbac)
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount"]
    role = next(d for d in rbac if d["kind"] == "Role")
    assert role["metadata"]["namespace"] == "gauntlet"
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"]
        assert not {"create", "update", "deletecollection", "escalate", "bind", "impersonate"} & set(rule["verbs"]) \
            or rule["resources"] == ["workflowtaskresults"]
    cluster = next(d for d in rbac if d["kind"] == "ClusterRole")
    assert cluster["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
