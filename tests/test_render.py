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

from gauntlet.params import load_profile
from gauntlet.steps import needs_of
from gauntlet.workflows.graph import build_graph
from gauntlet.workflows.lint import lint_paths
from gauntlet.workflows.render import RUN_LABEL, dump_yaml, render_documents, render_profile

GOLDEN = Path(__file__).parent / "golden"
PROFILES = ["kimi-k3-h20", "h200-1gpu"]          # a local profile renders nothing (test_local_profile_...)


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
    r = subprocess.run([sys.executable, "-m", "gauntlet.workflows.cli", "render", "--profile", "kimi-k3-h20",
                        "--out", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["gauntlet-janitor.cronworkflow.yaml", "gauntlet-kimi-k3-h20-nightly.cronworkflow.yaml",
                     "gauntlet-kimi-k3-h20-nightly.workflowtemplate.yaml",
                     "gauntlet-kimi-k3-h20.profile.yaml", "gauntlet-kimi-k3-h20.rbac.yaml",
                     "gauntlet-kimi-k3-h20.workflowtemplate.yaml"]
    assert "lint: ok" in r.stdout


def _depends_terms(expr: str) -> list[str]:
    return re.findall(r"([A-Za-z0-9-]+)\.(Succeeded|Skipped|Failed)", expr or "")


AFTER_FAILURE = {"main": {("nodes-0", "engine-check-sglang"), ("nodes-0", "engine-check-vllm"),
                          ("nodes-1", "engine-check-sglang"), ("nodes-1", "engine-check-vllm"), ("vllm", "sglang"),
                          ("regress", "sglang"), ("regress", "vllm"), ("report", "regress")}}


def test_every_gate_depends_on_its_predecessors_success():
    wt = _wt()
    graph = build_graph(load_profile("kimi-k3-h20"), "argo")
    for dag in graph.dags:
        tasks = _tasks(wt, dag.name)
        assert list(tasks) == [t.name for t in dag.tasks]          # the argo graph is rendered whole
        for t in dag.tasks:
            rendered = tasks[t.name]
            if not t.depends:
                assert "depends" not in rendered
                continue
            terms = _depends_terms(rendered["depends"])
            assert terms, rendered["depends"]
            # a predecessor is accepted as Succeeded (or Skipped, for optional cases), except where the graph runs
            # on after a failure: Gate 1 after the engine checks, a variant after the one before it, what runs
            # whatever happened (the teardown, the next engine, regress, report: they carry the failure)
            for name, state in terms:
                if state not in ("Succeeded", "Skipped"):
                    assert (t.name, name) in AFTER_FAILURE.get(dag.name, set()) or dag.name == "engine-sequence" and (
                        t.name == "teardown" or t.name.startswith("exp-") and name.startswith("exp-")), (
                        t.name, name, rendered["depends"])
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
    chain = ["deploy", "smoke", "perf", "perf-c32-1k-1k", "suspect", "confirm", "climb", "baseline-phases", "longctx",
             "longctx-1048576", "release-baseline", "exp-prefix-cache", "exp-dspark", "exp-hicache", "exp-symm-mem",
             "teardown"]
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
               for a in t["arguments"]["parameters"] if a["name"] == "engine"}
    assert engines == set(load_profile("kimi-k3-h20").engines)


def test_retries_only_on_exit_75():
    for t in _wt()["spec"]["templates"]:
        if "container" not in t:
            continue
        if "retryStrategy" not in t:        # a gate that never exits 75: its `timeout` must count Pending
            assert not needs_of(t["container"]["args"][1]).transient and t["timeout"], t["name"]
            continue
        rs = t["retryStrategy"]
        assert rs["expression"] == "asInt(lastRetry.exitCode) == 75", t["name"]


def test_retry_backoff_is_a_parameter_and_has_no_max_duration():
    """Argo v4 counts backoff.maxDuration from the first attempt's start and makes it the next attempt's
    deadline (operator.go processNodeRetries): a late exit 75 would never be retried."""
    from gauntlet.workflows.graph import EXIT_BACKOFF
    wt = _wt()
    params = {p["name"]: p for p in wt["spec"]["arguments"]["parameters"]}
    assert params["retry-backoff"]["value"] == "30s"
    for t in wt["spec"]["templates"]:
        if "container" in t and "retryStrategy" in t:
            backoff = t["retryStrategy"]["backoff"]
            assert "maxDuration" not in backoff, t["name"]
            # the exit handler's retry never depends on a user-supplied value (a bad retry-backoff would turn
            # its retry into an Error and leave the GPUs held): a fixed backoff there
            want = EXIT_BACKOFF if t["name"] == "cleanup" else "{{workflow.parameters.retry-backoff}}"
            assert backoff["duration"] == want and backoff["factor"] in ("2", 2), t["name"]
            assert t["activeDeadlineSeconds"] > 0          # each attempt is bounded by its own deadline


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
        term = pre["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert term == [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                               "values": [load_profile("kimi-k3-h20").hardware.nodes[i].name]}]}]
        mount = next(m for m in pre["container"]["volumeMounts"] if m["name"] == "model-cache")
        assert mount["readOnly"] is True and mount["mountPath"] == "/models-nvme/Kimi-K3/v1"


def test_outputs_have_defaults():
    for t in _wt()["spec"]["templates"]:
        if "container" not in t:
            continue
        params = {p["name"]: p for p in t["outputs"]["parameters"]}
        assert params["verdict"]["valueFrom"]["default"] == "error"
        assert all("default" in p["valueFrom"] for p in params.values())


def _with(profile: str, **changes):
    return load_profile(profile).model_copy(update=changes)


def _artifacts(wt: dict) -> list[list]:
    return [t["outputs"].get("artifacts") for t in wt["spec"]["templates"] if "container" in t]


def test_no_output_artifact_without_an_artifact_repository():
    """Without a repository Argo's wait container fails to save an output artifact: the node Errors."""
    profile = load_profile("kimi-k3-h20")
    assert profile.artifact_repository is None
    wt = _wt()
    assert _artifacts(wt) and not any(_artifacts(wt))
    assert "artifactRepositoryRef" not in wt["spec"]
    # the evidence stays on the runs PVC either way
    assert all(any(m["mountPath"] == "/runs" for m in t["container"]["volumeMounts"])
               for t in wt["spec"]["templates"] if "container" in t)


@pytest.mark.parametrize("repo,ref", [("default", None), ("team-artifacts", {"configMap": "team-artifacts"})])
def test_evidence_artifact_with_a_repository(repo, ref):
    docs = render_documents(_with("kimi-k3-h20", artifact_repository=repo))
    wt = next(v for k, v in docs.items() if k.endswith(".workflowtemplate.yaml"))
    assert all(a and a[0]["name"] == "evidence" and a[0]["optional"] for a in _artifacts(wt))
    assert wt["spec"].get("artifactRepositoryRef") == ref


def test_workflow_level_settings():
    spec = _wt()["spec"]
    assert spec["synchronization"] == {"mutexes": [{"name": "gauntlet-h20-kimi"}]}
    assert spec["serviceAccountName"] == "gauntlet"
    assert spec["activeDeadlineSeconds"] == load_profile("kimi-k3-h20").active_deadline_s   # from the plan
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
    # the nightly CronWorkflow submits the nightly template, never the qualification's
    assert spec["workflowSpec"]["workflowTemplateRef"] == {"name": "gauntlet-kimi-k3-h20-nightly"}
    assert spec["workflowSpec"]["workflowMetadata"]["labels"]["gauntlet.dev/run-kind"] == "nightly"


def test_the_nightly_template_is_the_qualification_cut_to_the_regression_run():
    """One graph, two templates: the nightly's tasks are a subset of the qualification's (Gate 0, Gate 1, the
    nightly engines' deploy, smoke, perf on nightly.cases, suspect, confirm, teardown; regress, report), rendered
    the same way; its activeDeadlineSeconds is the window, its report step knows it is the nightly."""
    docs = _docs("kimi-k3-h20")
    qual = docs["gauntlet-kimi-k3-h20.workflowtemplate.yaml"]
    night = docs["gauntlet-kimi-k3-h20-nightly.workflowtemplate.yaml"]
    prof = load_profile("kimi-k3-h20")
    assert night["metadata"]["labels"]["gauntlet.dev/run-kind"] == "nightly"
    assert qual["metadata"]["labels"]["gauntlet.dev/run-kind"] == "qualification"
    assert night["spec"]["activeDeadlineSeconds"] == int(prof.nightly.window_h * 3600) < qual["spec"]["activeDeadlineSeconds"]
    assert night["spec"]["synchronization"] == qual["spec"]["synchronization"]     # one pool, one holder at a time

    def tasks(wt: dict, dag: str) -> dict[str, dict]:
        t = next(x for x in wt["spec"]["templates"] if x["name"] == dag)
        return {x["name"]: x for x in t["dag"]["tasks"]}

    qm, nm = tasks(qual, "main"), tasks(night, "main")
    assert set(nm) < set(qm)
    assert set(qm) - set(nm) == {"prewarm-0", "prewarm-1", "engine-check-vllm", "pull-vllm-0", "pull-vllm-1", "vllm"}
    assert "prewarm" not in {p["name"] for p in night["spec"]["arguments"]["parameters"]}
    engines = next(p for p in night["spec"]["arguments"]["parameters"] if p["name"] == "engines")
    assert engines["value"] == "sglang" and engines["enum"] == ["sglang"]
    qs, ns = tasks(qual, "engine-sequence"), tasks(night, "engine-sequence")
    assert list(ns) == ["deploy", "smoke", "perf", "suspect", "confirm", "teardown"]
    assert ns["deploy"] == qs["deploy"] and ns["smoke"] == qs["smoke"]     # the same gates, rendered the same way
    assert all(ns[t]["template"] == qs[t]["template"] for t in ns)
    assert ns["suspect"]["depends"] == "perf.Succeeded"                  # no gated case in the nightly
    perf = next(x for x in night["spec"]["templates"] if x["name"] == "seq-perf")["container"]["args"]
    assert perf[perf.index("--cases") + 1] == "c16-1k-1k,c16-8k-1k"
    report = next(x for x in night["spec"]["templates"] if x["name"] == "report")
    args = report["container"]["args"]
    assert args[args.index("--run") + 1] == "nightly"
    qreport = next(x for x in qual["spec"]["templates"] if x["name"] == "report")["container"]["args"]
    assert qreport[qreport.index("--run") + 1] == "qualification"


def test_rbac_is_namespaced_and_least_privilege():
    """Everything that writes is namespaced; the cluster-wide grants are read-only: listing pods, which Gate 1
    needs to name other teams' GPU pods on our nodes, and getting three named objects (the namespace, the label
    policy and its binding), which the params step reads before any GPU is requested."""
    rbac = next(v for k, v in _docs("kimi-k3-h20").items() if k.endswith(".rbac.yaml"))
    kinds = sorted(d["kind"] for d in rbac)
    # one account per API role (steps/backends/kubernetes/rbac.py ROLES), the label policy (tests/test_rbac.py)
    assert kinds == [*["ClusterRole"] * 2, *["ClusterRoleBinding"] * 2, *["Role"] * 5, *["RoleBinding"] * 5,
                     *["ServiceAccount"] * 5, "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    for role in (d for d in rbac if d["kind"] == "Role"):
        assert role["metadata"]["namespace"] == "gauntlet"
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"]
            assert not {"update", "deletecollection", "escalate", "bind", "impersonate"} & set(rule["verbs"])
            # create only beside patch: a server-side apply that creates is authorized as create
            assert "create" not in rule["verbs"] or "patch" in rule["verbs"]
    cluster = {d["metadata"]["name"]: d["rules"] for d in rbac if d["kind"] == "ClusterRole"}
    assert cluster["gauntlet-nodes-gauntlet-node-pods"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    policy = "gauntlet-gauntlet-run-label"
    assert cluster["gauntlet-admission-gauntlet-admission"] == [
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"], "resourceNames": ["gauntlet"]},
        {"apiGroups": ["admissionregistration.k8s.io"],
         "resources": ["validatingadmissionpolicies", "validatingadmissionpolicybindings"], "verbs": ["get"],
         "resourceNames": [policy]}]


# --- what makes rendered documents runnable (issue 10: 1, 6, 7) ---------------------------------------------

def test_local_profile_refuses_to_render_in_one_line(tmp_path):
    from gauntlet.workflows.render import RenderError
    with pytest.raises(RenderError, match="hardware.kind 'local'"):
        render_documents(load_profile("local-cpu"))
    r = subprocess.run([sys.executable, "-m", "gauntlet.workflows.cli", "render", "--profile", "local-cpu",
                        "--out", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("RenderError: ") and len(r.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())


def _profile_cm(docs: dict) -> dict:
    return next(v for k, v in docs.items() if k.endswith(".profile.yaml"))


@pytest.mark.parametrize("profile", PROFILES)
def test_every_step_reads_the_rendered_profile_from_its_configmap(profile, tmp_path):
    from gauntlet.workflows.render import PROFILE_DIR
    docs = _docs(profile)
    cm = _profile_cm(docs)
    wt = next(v for k, v in docs.items() if k.endswith(".workflowtemplate.yaml"))
    vol = next(v for v in wt["spec"]["volumes"] if v["name"] == "profile")
    assert vol["configMap"]["name"] == cm["metadata"]["name"]
    assert cm["metadata"]["namespace"] == wt["metadata"]["namespace"]
    for t in wt["spec"]["templates"]:
        if "container" not in t:
            continue
        c = t["container"]
        arg = c["args"][c["args"].index("--profile") + 1]
        mount = next(m for m in c["volumeMounts"] if m["name"] == "profile")
        assert mount["mountPath"] == PROFILE_DIR and arg.startswith(PROFILE_DIR + "/")
        assert arg.removeprefix(PROFILE_DIR + "/") in cm["data"]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["GAUNTLET_IMAGES"].removeprefix(PROFILE_DIR + "/") in cm["data"]
    # what the pod reads validates back into the very profile that was rendered, images included
    for key, text in cm["data"].items():
        (tmp_path / key).write_text(text)
    from gauntlet.params import load_images
    images = load_images(tmp_path / "images.yaml")
    assert images == load_images()
    assert load_profile(tmp_path / f"{load_profile(profile).name}.yaml", images=images) == load_profile(profile)


def test_a_profile_file_outside_the_repo_renders_documents_that_run(tmp_path):
    """`--profile path/to/mine.yaml`: no machine path reaches a container; the pods read the ConfigMap."""
    text = (Path(__file__).resolve().parents[1] / "params" / "profiles" / "kimi-k3-h20.yaml").read_text()
    mine = tmp_path / "elsewhere" / "mine.yaml"
    mine.parent.mkdir()
    mine.write_text(text.replace("name: kimi-k3-h20", "name: kimi-k3-mine", 1))
    out = tmp_path / "build"
    r = subprocess.run([sys.executable, "-m", "gauntlet.workflows.cli", "render", "--profile", str(mine), "--out", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rendered = "".join(p.read_text() for p in out.iterdir())
    assert str(tmp_path) not in rendered
    cm = yaml.safe_load((out / "gauntlet-kimi-k3-mine.profile.yaml").read_text())
    assert "kimi-k3-mine.yaml" in cm["data"] and "name: kimi-k3-mine" in cm["data"]["kimi-k3-mine.yaml"]


def test_janitor_cronworkflow():
    from gauntlet.steps.backends.kubernetes.rbac import JANITOR_ACCOUNT
    jan = _docs("kimi-k3-h20")["gauntlet-janitor.cronworkflow.yaml"]
    spec = jan["spec"]
    assert jan["metadata"]["name"] == "gauntlet-janitor"
    assert spec["concurrencyPolicy"] == "Forbid" and spec["schedules"] == ["*/5 * * * *"]
    ws = spec["workflowSpec"]
    assert ws["serviceAccountName"] == JANITOR_ACCOUNT
    (c,) = [t["container"] for t in ws["templates"]]
    assert c["args"][:2] == ["step", "janitor"] and "{{workflow.parameters.grace}}" in c["args"]
    assert "@sha256:" in c["image"] and "nvidia.com/gpu" not in str(c["resources"])


def test_report_fails_the_nightly_on_a_regression():
    """Argo judges the main DAG by its leaf, report: it runs whatever regress ended in, gets regress's verdict and
    the phase of every task before it, and fails on a regression or on a task that did not pass."""
    main = _tasks(_wt(), "main")
    report = main["report"]
    assert report["depends"] == ("params.Succeeded && (regress.Succeeded || regress.Failed || regress.Errored || "
                                 "regress.Skipped || regress.Omitted)")
    args = {a["name"]: a["value"] for a in report["arguments"]["parameters"]}
    before = list(main)[:list(main).index("report")]
    assert args == {"regress-verdict": "{{tasks.regress.outputs.parameters.verdict}}",
                    **{f"{t}-status": f"{{{{tasks.{t}.status}}}}" for t in before}}
    c = _templates(_wt())["report"]["container"]
    assert c["args"][c["args"].index("--regress-verdict") + 1] == "{{inputs.parameters.regress-verdict}}"
    up = c["args"][c["args"].index("--upstream") + 1:]
    assert up == [f"{t}={{{{inputs.parameters.{t}-status}}}}" for t in before]


def _pinned_to(template: dict) -> list[str]:
    """The nodes a container template's pod may run on (its required node affinity)."""
    terms = template["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return [v for t in terms for e in t["matchExpressions"] for v in e["values"]]


def test_every_image_an_engine_runs_in_is_pulled_on_every_pool_node_before_it():
    """Rank start-up skew is not an image pull: on the rendered template, before each engine sequence (among the
    tasks it depends on), every pool node has a pod of its own pinned to it in the engine's image (what its
    ranks run, telemetry and marker check included: manifests.engine_statefulset) and one in the bench image
    (Gate 4's client), each running whenever that engine's sequence does. A real kubelet pulls the image
    (IfNotPresent, by digest) to start that pod, so by deploy every node holds it. Before Gate 1's pulls only
    engine-check-vllm ran in the vLLM image, on one node of the two (any pool node)."""
    from gauntlet.params import load_images
    profile = load_profile("kimi-k3-h20")
    graph = build_graph(profile, "argo")
    wt, images = _wt(), load_images()
    templates, main = _templates(wt), _tasks(wt, "main")

    def upstream(name: str) -> set[str]:
        seen: set[str] = set()
        todo = [d for d, _ in _depends_terms(main[name].get("depends"))]
        while todo:
            t = todo.pop()
            if t not in seen:
                seen.add(t)
                todo += [d for d, _ in _depends_terms(main[t].get("depends"))]
        return seen

    pool = [n.name for n in profile.hardware.nodes]
    assert len(pool) == 2
    for engine in profile.engine_order():
        before = upstream(engine)
        for key in (profile.engines[engine].image, "steps-vllm"):
            ref = images[key].ref
            for node in pool:
                on_node = [t for t in sorted(before) if "container" in templates[main[t]["template"]]
                           and templates[main[t]["template"]]["container"]["image"] == ref
                           and _pinned_to(templates[main[t]["template"]]) == [node]]
                assert on_node, f"{engine}: no task before it runs {key} ({ref}) pinned to {node}"
                # it runs whenever the engine does (engines=<engine> or both), never only on another's run
                for value in (engine, "both"):
                    assert any(graph.main.task(t).when is None or graph.main.task(t).when.holds(value)
                               for t in on_node), (engine, key, node, value, on_node)
    # each engine's pulls run only where the engine does: engines=sglang pulls no vLLM image
    pulls = {t.name: t for t in graph.main.tasks if t.step == "pull"}
    assert sorted(pulls) == ["pull-sglang-0", "pull-sglang-1", "pull-vllm-0", "pull-vllm-1"]
    assert [n for n, t in pulls.items() if t.when is not None and t.when.holds("sglang")] == \
        ["pull-sglang-0", "pull-sglang-1"]
    # they ask for no GPU (they run beside Gate 1's probes) and fail a pull still Pending at their deadline:
    # no retryStrategy, so Argo's template timeout fires on the Pending pod (render._placement)
    for name in pulls:
        tmpl = templates[main[name]["template"]]
        assert "nvidia.com/gpu" not in str(tmpl["container"]["resources"]) and "retryStrategy" not in tmpl
        assert tmpl["timeout"] == "1800s"
