"""Issue 19: parameters checked before anything runs; the exit handler's retry fixed; exact engine conditions;
the run's objects owned by its Workflow."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gauntlet.contract import UsageError
from gauntlet.params import load_profile
from gauntlet.steps.gates import params as step
from gauntlet.steps.backends.kubernetes.apply import workflow_owner
from gauntlet.workflows import refs
from gauntlet.workflows.graph import EXIT_BACKOFF, PARAMS_TASK, When, build_graph
from gauntlet.workflows.render import argo_when, render_documents

KIMI = "kimi-k3-h20"


def _allowed() -> tuple[str, ...]:
    task = build_graph(load_profile(KIMI), "argo").main.task(PARAMS_TASK)
    return task.args[task.args.index("--allowed") + 1:]


def _given(**values: str) -> str:
    return json.dumps([{"name": k, "value": v} for k, v in values.items()])


GOOD = {"engines": "sglang", "prewarm": "false", "results-uri": "/runs/results", "retry-backoff": "1s"}


def test_good_parameters_pass(tmp_path):
    """Locally the parameters are all; on the cluster (the API double holding a privileged namespace and the label
    policy, tests/test_admission.py) the step then passes the namespace's Pod Security level and the policy too."""
    import os

    from k8s_double import K8sDouble
    from test_admission import admitting
    opts = step.Options(profile=load_profile("local-cpu"), given=_given(**GOOD), allowed=_allowed())
    checks, metrics = step.run(opts, None)
    assert [c.status for c in checks] == ["pass"] and metrics["parameters"] == GOOD
    # as the rendered template runs it: every parameter, and the argv a pod gets (--profile included)
    with K8sDouble() as d:
        admitting(d, load_profile(KIMI))
        r = subprocess.run([sys.executable, "-m", "gauntlet.workflows.cli", "step", "params", "--profile", KIMI,
                            "--out", str(tmp_path), "--given", _given(**GOOD), "--allowed", *_allowed()],
                           capture_output=True, text=True, env={**os.environ, "GAUNTLET_KUBE_API": d.url})
    assert r.returncode == 0 and "UsageError" not in r.stderr, r.stdout + r.stderr
    verdict = json.loads((tmp_path / "verdict.json").read_text())
    assert [(c["name"], c["status"]) for c in verdict["checks"]] == [
        ("parameters", "pass"), ("pod-security", "pass"), ("label-policy", "pass")]


@pytest.mark.parametrize("bad, says", [
    ({"engines": "foo"}, "parameter engines='foo': must be one of both, sglang, vllm"),
    ({"engines": "sglang,vlm"}, "parameter engines='sglang,vlm': must be one of both, sglang, vllm, or several"),
    ({"engines": "sglang,sglang"}, "parameter engines='sglang,sglang': must be one of both, sglang, vllm, or sev"),
    ({"engines": "sglangx"}, "must be one of"),
    ({"prewarm": "maybe"}, "parameter prewarm='maybe': must be one of false, true"),
    ({"retry-backoff": "abc"}, "parameter retry-backoff='abc': must be a whole number of seconds"),
    ({"retry-backoff": "1.5m"}, "must be a whole number"),
    ({"results-uri": "ftp://host/x"}, "parameter results-uri='ftp://host/x': must be a path, or a URI"),
    ({"results-uri": "s3://user:pw@bucket/x"}, "without credentials"),
    ({"engine": "vllm"}, "parameter 'engine' is not a parameter of this workflow (its parameters: engines, "),
    ({"run-dir": "/tmp/x"}, "parameter 'run-dir' is not a parameter of this workflow"),
])
def test_bad_value_or_name_refused_naming_it(bad, says):
    with pytest.raises(UsageError) as exc:
        step.Options(given=_given(**{**GOOD, **bad}), allowed=_allowed())
    assert says in str(exc.value) and "\n" not in str(exc.value)


def test_every_parameter_of_the_template_is_checked():
    """The rendered template's parameters and the params step's --allowed are the same list, enums alike."""
    doc = render_documents(load_profile(KIMI))[f"gauntlet-{KIMI}.workflowtemplate.yaml"]
    declared = {p["name"]: p.get("enum") for p in doc["spec"]["arguments"]["parameters"]}
    allowed = dict(a.split("=", 1) for a in _allowed())
    assert set(allowed) == set(declared)
    for name, enum in declared.items():
        if enum:
            # engines also takes several engines separated by commas (sglang,vllm: both sequences)
            assert allowed[name] == ("list-of:" if name == "engines" else "one-of:") + "|".join(enum)


def test_every_task_waits_for_params():
    """A failed params step leaves nothing able to run: every task reaches it through its depends."""
    for backend, profile in (("argo", KIMI), ("local", "local-cpu")):
        main = build_graph(load_profile(profile), backend).main
        assert main.tasks[0].name == PARAMS_TASK and not main.tasks[0].depends
        for t in main.tasks[1:]:
            assert t.depends, f"{backend}: {t.name} does not wait for params"


def test_the_step_exits_2_with_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "gauntlet.workflows.cli", "step", "params", "--out", str(tmp_path),
                        "--profile", KIMI,
                        "--given", _given(**{**GOOD, "prewarm": "maybe"}), "--allowed", *_allowed()],
                       capture_output=True, text=True)
    assert r.returncode == 2, r
    assert r.stderr.strip().splitlines() == ["UsageError: parameter prewarm='maybe': must be one of false, true"]


def test_one_of_is_anchored_per_item_on_both_back_ends():
    """``engines=sglang,vllm`` runs both sequences (it always has); a near miss runs none."""
    import re
    w = When.one_of(refs.parameter("engines"), "sglang", "both")
    assert argo_when(w) == "'{{workflow.parameters.engines}}' =~ '(^|,)(sglang|both)(,|$)'"
    pattern = argo_when(w).split("=~ ")[1].strip("'")          # what Argo's regexp sees
    for text in ("sglang", "both", "sglang,vllm", "vllm,sglang", "sglangx", "xboth", "vllm", "sglang-x", ""):
        assert w.holds(text) is bool(re.search(pattern, text)), text
    assert w.holds("sglang,vllm") and w.holds("vllm,sglang") and w.holds("both")
    assert not w.holds("sglangx") and not w.holds("xboth") and not w.holds("vllm")


def test_the_exit_handler_retry_never_reads_a_parameter():
    doc = render_documents(load_profile(KIMI))[f"gauntlet-{KIMI}.workflowtemplate.yaml"]
    by = {t["name"]: t for t in doc["spec"]["templates"]}
    assert by["cleanup"]["retryStrategy"]["backoff"]["duration"] == EXIT_BACKOFF
    assert "{{" not in json.dumps(by["cleanup"]["retryStrategy"])
    assert by["seq-smoke"]["retryStrategy"]["backoff"]["duration"] == "{{workflow.parameters.retry-backoff}}"


def test_owner_reference_only_for_this_run_in_its_namespace(monkeypatch):
    monkeypatch.setenv("GAUNTLET_WORKFLOW", "gauntlet-kimi-abc")
    monkeypatch.setenv("GAUNTLET_RUN_ID", "uid-1")
    monkeypatch.setenv("GAUNTLET_NAMESPACE", "gauntlet")
    assert workflow_owner("gauntlet", "uid-1") == {
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "name": "gauntlet-kimi-abc", "uid": "uid-1",
        "controller": False, "blockOwnerDeletion": False}
    assert workflow_owner("other-ns", "uid-1") is None       # the GC would delete a cross-namespace dependent
    assert workflow_owner("gauntlet", "uid-2") is None
    monkeypatch.delenv("GAUNTLET_WORKFLOW")
    assert workflow_owner("gauntlet", "uid-1") is None


def test_prewarm_is_offered_only_where_the_profile_names_a_source():
    """h200-1gpu names no model.source_path: its prewarm would stop at Gate 0 ("no --src"), so the template
    offers prewarm=false only and the run's first step refuses true, before Gate 0 begins."""
    one_gpu = build_graph(load_profile("h200-1gpu"), "argo")
    task = one_gpu.main.task(PARAMS_TASK)
    allowed = task.args[task.args.index("--allowed") + 1:]
    assert "prewarm=one-of:false" in allowed and "prewarm=one-of:false|true" in _allowed()
    with pytest.raises(UsageError, match=r"parameter prewarm='true': must be one of false$"):
        step.Options(given=_given(prewarm="true"), allowed=allowed)
    step.Options(given=_given(prewarm="false"), allowed=allowed)
    assert one_gpu.parameters["prewarm"][1] == ("false",)
