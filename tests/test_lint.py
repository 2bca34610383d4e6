"""The strict lint catches the mistakes Argo would reject (or silently accept)."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import yaml

from gauntlet.params import load_profile
from gauntlet.workflows.lint import lint_documents
from gauntlet.workflows.render import dump_yaml, render_documents


@pytest.fixture(scope="module")
def docs():
    d = render_documents(load_profile("kimi-k3-h20"))
    wt = next(v for k, v in d.items() if k.endswith("workflowtemplate.yaml"))
    cron = next(v for k, v in d.items() if k.endswith("cronworkflow.yaml"))
    return wt, cron


def _tmpl(wt, name):
    return next(t for t in wt["spec"]["templates"] if t["name"] == name)


def _task(wt, dag, name):
    return next(t for t in _tmpl(wt, dag)["dag"]["tasks"] if t["name"] == name)


def typo_field(wt):
    wt["spec"]["entrypiont"] = wt["spec"].pop("entrypoint")


def dangling_depends(wt):
    _task(wt, "main", "network")["depends"] = "nodes-9.Succeeded"


def cycle(wt):
    _task(wt, "main", "preflight-0")["depends"] = "network.Succeeded"


def when_on_undefined_output(wt):
    _task(wt, "engine-sequence", "perf-c32-1k-1k")["when"] = "{{tasks.perf.outputs.parameters.stable_c99}} == true"


def enum_default_outside(wt):
    p = next(p for p in wt["spec"]["arguments"]["parameters"] if p["name"] == "engines")
    p["value"] = "trtllm"


def missing_onexit(wt):
    wt["spec"]["templates"] = [t for t in wt["spec"]["templates"] if t["name"] != "cleanup"]


def singular_mutex(wt):
    wt["spec"]["synchronization"] = {"mutex": {"name": "gauntlet-h20-kimi"}}


def empty_sync(wt):
    wt["spec"]["synchronization"] = {}


def container_without_image(wt):
    del _tmpl(wt, "preflight-0")["container"]["image"]


def hera_default_image(wt):
    _tmpl(wt, "preflight-0")["container"]["image"] = "python:3.10"


def mixed_depends(wt):
    _task(wt, "main", "network")["dependencies"] = ["nodes-0"]


def bad_task_name(wt):
    _task(wt, "main", "report")["name"] = "report_final"


def undefined_workflow_param(wt):
    _tmpl(wt, "preflight-0")["container"]["args"].append("{{workflow.parameters.nope}}")


def undefined_input(wt):
    _tmpl(wt, "seq-smoke")["container"]["args"].append("{{inputs.parameters.nope}}")


def missing_template(wt):
    _task(wt, "main", "network")["template"] = "netwrok"


def wrong_type(wt):
    wt["spec"]["activeDeadlineSeconds"] = "eight hours"


def output_from_non_ancestor(wt):
    _task(wt, "engine-sequence", "smoke")["when"] = "{{tasks.perf.outputs.parameters.unlock_c32_1k_1k}} == true"


def status_from_non_ancestor(wt):
    """smoke reads perf's phase: perf runs after smoke, so Argo would refuse it ("missing dependency")."""
    _task(wt, "engine-sequence", "smoke").setdefault("arguments", {}).setdefault("parameters", []).append(
        {"name": "perf-status", "value": "{{tasks.perf.status}}"})


def relative_host_path(wt):
    next(v for v in wt["spec"]["volumes"] if v.get("hostPath"))["hostPath"]["path"] = ".cache/models/smollm2"


def zero_digest(wt):
    _tmpl(wt, "preflight-0")["container"]["image"] = "local/vllm-cpu@sha256:" + "0" * 64


def zero_digest_init(wt):
    t = next(t for t in wt["spec"]["templates"] if t.get("initContainers"))
    t["initContainers"][0]["image"] = "local/steps@sha256:" + "0" * 64


def depends_syntax(wt):
    _task(wt, "main", "network")["depends"] = "nodes-0.Succeeded && (nodes-1.Succeeded"


def when_syntax(wt):
    _task(wt, "main", "sglang")["when"] = "'{{workflow.parameters.engines}}' =~"


MISTAKES = {
    "depends_syntax": (depends_syntax, "depends-syntax"),
    "when_syntax": (when_syntax, "when-syntax"),
    "relative_host_path": (relative_host_path, "hostpath-absolute"),
    "zero_digest": (zero_digest, "image-digest"),
    "zero_digest_init": (zero_digest_init, "image-digest"),
    "typo_field": (typo_field, "schema.additionalProperties"),
    "dangling_depends": (dangling_depends, "depends-ref"),
    "cycle": (cycle, "dag-cycle"),
    "when_on_undefined_output": (when_on_undefined_output, "output-ref"),
    "enum_default_outside": (enum_default_outside, "enum-default"),
    "missing_onexit": (missing_onexit, "template-ref"),
    "singular_mutex": (singular_mutex, "argo4-sync"),
    "empty_sync": (empty_sync, "empty-sync"),
    "container_without_image": (container_without_image, "image-required"),
    "hera_default_image": (hera_default_image, "image-digest"),
    "mixed_depends": (mixed_depends, "depends-xor-dependencies"),
    "bad_task_name": (bad_task_name, "task-name"),
    "undefined_workflow_param": (undefined_workflow_param, "param-ref"),
    "undefined_input": (undefined_input, "param-ref"),
    "missing_template": (missing_template, "template-ref"),
    "wrong_type": (wrong_type, "schema.type"),
    "output_from_non_ancestor": (output_from_non_ancestor, "output-ref"),
    "status_from_non_ancestor": (status_from_non_ancestor, "status-ref"),
}


def test_clean_documents_have_no_findings(docs):
    wt, cron = docs
    assert lint_documents([("wt", wt), ("cron", cron)]) == []


@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_lint_catches(docs, name):
    wt = copy.deepcopy(docs[0])
    mutate, rule = MISTAKES[name]
    mutate(wt)
    findings = lint_documents([("wt.yaml", wt)])
    rules = {f.rule for f in findings}
    assert rule in rules, f"{name}: expected rule {rule}, got {[str(f) for f in findings]}"
    assert all(f.doc.startswith("wt.yaml:WorkflowTemplate/") and f.path for f in findings)


def test_cron_singular_schedule_rejected(docs):
    cron = copy.deepcopy(docs[1])
    cron["spec"]["schedule"] = cron["spec"].pop("schedules")[0]
    rules = {f.rule for f in lint_documents([("c", cron)])}
    assert "argo4-cron" in rules and "cron-schedules" in rules


def test_k8s_manifest_validated_with_real_schema():
    bad = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "x"}, "automountServiceAcountToken": True}
    findings = lint_documents([("sa.yaml", bad)])
    assert findings and findings[0].rule == "kubernetes-validate"


def test_lint_cli_exit_1_on_findings(docs, tmp_path):
    wt = copy.deepcopy(docs[0])
    dangling_depends(wt)
    (tmp_path / "wt.yaml").write_text(dump_yaml(wt))
    r = subprocess.run([sys.executable, "-m", "gauntlet.workflows.cli", "lint", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 1
    assert "depends-ref" in r.stderr and "nodes-9" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / "wt.yaml").write_text(yaml.safe_dump(docs[0]))
    r = subprocess.run([sys.executable, "-m", "gauntlet.workflows.cli", "lint", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
