"""Each account's Role grants exactly what its steps' code calls: verbs read from the code and seen on the wire,
per step and so per account (a step's account is its ``NEEDS.api`` role), nothing broader.

A server-side apply is a PATCH, and one that creates the object is also authorized as ``create``
(k8s.io/apiserver pkg/endpoints/handlers/patch.go runs the create validation under a ``Verb: "create"``
authorizer check): every apply needs ``create`` and ``patch``.
"""

from __future__ import annotations

import re
from pathlib import Path

import kubernetes_validate
import pytest
from k8s_double import running

from gauntlet.params import load_profile
from gauntlet.steps import STEPS, needs_of, runner
from gauntlet.steps.backends.kubernetes import cleanup as _cleanup_k8s
from gauntlet.steps.backends.kubernetes import deploy as _deploy_k8s
from gauntlet.steps.backends.kubernetes import janitor as _janitor_k8s
from gauntlet.steps.gates import cleanup
from gauntlet.steps.gates import deploy
from gauntlet.steps.gates import network
from gauntlet.steps.gates import teardown
from gauntlet.steps.backends.kubernetes import RUN_LABEL
from gauntlet.steps.backends.kubernetes import rbac
from gauntlet.steps.backends import BACKENDS
from gauntlet.steps.backends.kubernetes.api import connect
from gauntlet.steps.backends.kubernetes.manager import KINDS, node_gpu_pods

ROOT = Path(__file__).resolve().parents[1]
K8S_CODE = [ROOT / "steps" / p for p in ("backends/kubernetes/api.py", "backends/kubernetes/apply.py",
                                           "backends/kubernetes/manager.py", "backends/kubernetes/deploy.py",
                                           "backends/kubernetes/cleanup.py", "gates/network.py", "gates/nodes.py",
                                           "backends/ranks.py", "backends/kubernetes/admission.py",
                                           "backends/kubernetes/stuck.py")]
# what `gauntlet step janitor` imports and calls (it applies nothing)
JANITOR_CODE = [ROOT / "steps" / p for p in ("backends/kubernetes/api.py", "backends/kubernetes/manager.py",
                                              "backends/kubernetes/cleanup.py", "backends/kubernetes/janitor.py")]
KIMI = load_profile("kimi-k3-h20")
UID = "11111111-2222-4333-8444-555555555555"
VERB = {"read": "get", "list": "list", "patch": "patch", "delete": "delete", "create": "create",
        "replace": "update", "watch": "watch", "delete_collection": "deletecollection", "connect": "create"}
# generated-client method suffix -> (apiGroup, resource)
RESOURCE = {"namespaced_stateful_set": ("apps", "statefulsets"), "namespaced_stateful_set_scale": ("apps", "statefulsets/scale"),
            "namespaced_service": ("", "services"), "namespaced_job": ("batch", "jobs"),
            "namespaced_pod": ("", "pods"), "namespaced_pod_log": ("", "pods/log"),
            "pod_for_all_namespaces": ("", "pods"), "namespaced_custom_object": ("argoproj.io", "workflows"),
            "namespaced_event": ("", "events"), "namespace": ("", "namespaces"),
            "validating_admission_policy_binding": ("admissionregistration.k8s.io", "validatingadmissionpolicybindings"),
            "validating_admission_policy": ("admissionregistration.k8s.io", "validatingadmissionpolicies")}


def granted(rules) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def role_grants(role: str | None) -> set[tuple[str, str, str, str]]:
    """(scope, apiGroup, resource, verb) the role's account holds (Argo's executor's rules aside)."""
    ns, cluster = rbac.ROLES[role]
    return {("namespace", *g) for g in granted(ns)} | {("cluster", *g) for g in granted(cluster)}


def steps_of(role: str | None) -> list[str]:
    return [s for s in STEPS if needs_of(s).api == role]


def calls_in_code(files: list[Path] = K8S_CODE) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) for every generated-client method the code names, directly or through KINDS."""
    found = set()
    method = re.compile(r"\.(read|list|patch|delete_collection|delete|create|replace|watch|connect_\w+?)_("
                        r"namespaced_\w+|pod_for_all_namespaces|\w+_for_all_namespaces|namespace|"
                        r"validating_admission_policy_binding|validating_admission_policy)\b")
    for f in files:
        text = f.read_text()
        for verb, suffix in method.findall(text):
            found.add((*RESOURCE[suffix], VERB[verb.split("_")[0] if verb.startswith("connect") else verb]))
        # Manager._method("<verb>", kind) and apply's f"patch_{suffix}" go through KINDS; a patch sent as
        # server-side apply (APPLY content type) creates what is missing: authorized as create too
        applies = 'f"patch_{suffix}"' in text
        dynamic = set(re.findall(r'_method\("(\w+)"', text)) | ({"patch"} if applies else set()) | (
            {"create"} if applies and "_content_type=APPLY" in text else set())
        for verb in dynamic:
            for _attr, suffix in KINDS.values():
                found.add((*RESOURCE[suffix], VERB[verb]))
    return found


def test_roles_are_exactly_what_the_code_calls():
    code = calls_in_code()
    roles = granted(rbac.RULES) | granted(rbac.CLUSTER_RULES) | granted(rbac.ADMISSION_RULES)
    assert code == roles, f"code calls but not granted: {code - roles}; granted but never called: {roles - code}"


def test_apply_needs_create_and_patch():
    """deploy's first apply creates the StatefulSet and Services: a Role with patch alone gets 403."""
    code = calls_in_code()
    for _attr, suffix in KINDS.values():
        group, resource = RESOURCE[suffix]
        assert {(group, resource, "create"), (group, resource, "patch")} <= code
        assert {(group, resource, "create"), (group, resource, "patch")} <= granted(rbac.RULES)


def test_janitor_role_is_exactly_what_the_janitor_calls():
    code = calls_in_code(JANITOR_CODE)
    assert code == granted(rbac.JANITOR_RULES), (
        f"called but not granted: {code - granted(rbac.JANITOR_RULES)}; "
        f"granted but never called: {granted(rbac.JANITOR_RULES) - code}")
    # it reads workflows and never creates or patches anything but a scale
    assert {v for (_, r, v) in code if r != "statefulsets/scale"} <= {"get", "list", "delete"}
    assert ("argoproj.io", "workflows", "list") in code


def test_nothing_broad():
    for rule in rbac.RULES + rbac.CLUSTER_RULES + rbac.ADMISSION_RULES + rbac.EXECUTOR_RULES + rbac.JANITOR_RULES:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
        assert not {"update", "deletecollection", "escalate", "bind", "impersonate"} & set(rule["verbs"])
        # create only where server-side apply needs it (with patch), or Argo's executor reporting outputs
        assert "create" not in rule["verbs"] or "patch" in rule["verbs"]
    assert granted(rbac.CLUSTER_RULES) == {("", "pods", "list")}          # cluster-wide: read one list only
    # the params step's: get three objects, each by name (resourceNames, added where the documents are rendered)
    assert {v for *_, v in granted(rbac.ADMISSION_RULES)} == {"get"}
    admission = next(d for d in rbac.access_manifests("team-a", "gauntlet") if d["kind"] == "ClusterRole"
                     and d["metadata"]["name"] == "gauntlet-admission-team-a-admission")
    assert [r["resourceNames"] for r in admission["rules"]] == [["team-a"], ["gauntlet-team-a-run-label"]]
    # and only the node step's and params' accounts hold anything cluster-wide; only manage and janitor change anything
    assert [r for r, (_, cluster) in rbac.ROLES.items() if cluster] == ["nodes", "admission"]
    assert {needs_of(s).api for s in STEPS if needs_of(s).api in ("nodes", "admission")} == {"nodes", "admission"}
    assert [s for s in STEPS if needs_of(s).api == "admission"] == ["params"]
    changes = {"create", "patch", "delete"}
    assert [r for r, (ns, _) in rbac.ROLES.items() if changes & {v for *_, v in granted(ns)}] == ["manage", "janitor"]
    assert rbac.ROLES[None] == ([], [])


def test_rendered_documents():
    docs = rbac.access_manifests("gauntlet", "gauntlet")
    for d in docs:
        kubernetes_validate.validate(d, "1.37.0", strict=True)
    accounts = [d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"]
    assert accounts == ["gauntlet-manager", "gauntlet-nodes", "gauntlet-janitor", "gauntlet-admission", "gauntlet"]
    assert [rbac.account("gauntlet", r) for r in rbac.ROLES] == accounts
    for role, (rules, cluster_rules) in rbac.ROLES.items():
        name = rbac.account("gauntlet", role)
        role_doc = next(d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == name)
        assert granted(role_doc["rules"]) == granted(rules) | granted(rbac.EXECUTOR_RULES)   # each: the executor's too
        binding = next(d for d in docs if d["kind"] == "RoleBinding" and d["metadata"]["name"] == name)
        assert binding["roleRef"]["name"] == name and binding["subjects"] == [
            {"kind": "ServiceAccount", "name": name, "namespace": "gauntlet"}]
        crb = [d for d in docs if d["kind"] == "ClusterRoleBinding" and d["subjects"][0]["name"] == name]
        assert bool(crb) == bool(cluster_rules)
        if crb:
            cr = next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == crb[0]["roleRef"]["name"])
            assert granted(cr["rules"]) == granted(cluster_rules)
    assert [d["kind"] for d in docs[-2:]] == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]


def test_label_policy_covers_the_accounts_that_change_things():
    """The policy binds the manager's and the janitor's accounts, on every kind either may change, in our
    namespace only; every operation RBAC grants them is matched."""
    pol, binding = rbac.label_policy("team-a", "gauntlet")
    spec = pol["spec"]
    assert rbac.RUN_LABEL_KEY == RUN_LABEL and spec["failurePolicy"] == "Fail"
    (cond,) = spec["matchConditions"]
    assert cond["expression"] == ("request.userInfo.username in ['system:serviceaccount:team-a:gauntlet-manager', "
                                  "'system:serviceaccount:team-a:gauntlet-janitor']")
    matched = {(g, r, op) for rule in spec["matchConstraints"]["resourceRules"] for g in rule["apiGroups"]
               for r in rule["resources"] for op in rule["operations"]}
    op = {"create": "CREATE", "patch": "UPDATE", "delete": "DELETE"}
    for rules in (rbac.RULES, rbac.JANITOR_RULES):
        for g, r, v in granted(rules):
            if v in op:
                assert (g, r, op[v]) in matched, (g, r, v)
    assert all(f"'{RUN_LABEL}' in " in v["expression"] or "replicas == 0" in v["expression"]
               for v in spec["validations"])
    assert binding["spec"] == {"policyName": pol["metadata"]["name"], "validationActions": ["Deny"], "matchResources": {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "team-a"}}}}


def test_render_gives_each_template_the_account_of_its_steps_role():
    from gauntlet.workflows.render import render_documents
    docs = render_documents(KIMI)
    wt = docs["gauntlet-kimi-k3-h20.workflowtemplate.yaml"]
    accounts = {d["metadata"]["name"] for d in docs["gauntlet-kimi-k3-h20.rbac.yaml"] if d["kind"] == "ServiceAccount"}
    seen = {}
    for t in wt["spec"]["templates"]:
        if "container" in t:
            step = t["container"]["args"][1]
            seen[step] = t["serviceAccountName"]
            assert t["serviceAccountName"] == rbac.account(KIMI.service_account, needs_of(step).api), t["name"]
    assert seen["deploy"] == seen["cleanup"] == seen["longctx"] == seen["network"] == "gauntlet-manager"
    assert seen["smoke"] == seen["perf"] == "gauntlet-manager" and seen["nodes"] == "gauntlet-nodes"   # redeploy
    assert seen["params"] == "gauntlet-admission"
    assert seen["report"] == seen["regress"] == seen["preflight"] == "gauntlet"
    assert set(seen.values()) <= accounts and wt["spec"]["serviceAccountName"] == "gauntlet"   # the default: no API
    jan = docs["gauntlet-janitor.cronworkflow.yaml"]["spec"]["workflowSpec"]
    assert jan["serviceAccountName"] == rbac.JANITOR_ACCOUNT in accounts


def test_engine_and_probe_pods_carry_no_token():
    from gauntlet.steps.backends.kubernetes import manifests as M
    sts = M.engine_objects(KIMI, "sglang", UID, "img", KIMI.engine("sglang"), None)[-1]
    job = M.probe_job(KIMI, "intra", UID, "img", {}, "x", [])
    for pod in (sts["spec"]["template"]["spec"], job["spec"]["template"]["spec"]):
        assert pod["automountServiceAccountToken"] is False and pod["serviceAccountName"] == KIMI.service_account


def test_every_gate_that_watches_ranks_may_list_pods():
    for s in STEPS:
        if needs_of(s).engine_ranks:
            assert ("namespace", "", "pods", "list") in role_grants(needs_of(s).api), s


def wire_to_rules(method: str, path: str, ctype: str = "") -> set[tuple[str, str, str, str]]:
    """(scope, apiGroup, resource, verb) one request needs."""
    if path == "/api/v1/pods":
        return {("cluster", "", "pods", "list")}
    named = re.match(r"^/api/v1/namespaces/[^/]+$|^/apis/(admissionregistration.k8s.io)/v1/([a-z]+)/[^/]+$", path)
    if named and method == "GET":             # a cluster-scoped object read by its name
        return {("cluster", named[1] or "", named[2] or "namespaces", "get")}
    m = re.match(r"^/apis?/(?:(apps|batch|argoproj.io)/)?v1(?:alpha1)?/namespaces/[^/]+/([a-z]+)"
                 r"(?:/([^/]+)(?:/([a-z]+))?)?$", path)
    assert m, path
    group, plural, name, sub = m.groups()
    resource = f"{plural}/{sub}" if sub else plural
    verb = {"GET": "get" if name else "list", "PATCH": "patch", "DELETE": "delete"}[method]
    if method == "PATCH" and ctype.startswith("application/apply-patch"):
        return {("namespace", group or "", resource, "patch"), ("namespace", group or "", resource, "create")}
    return {("namespace", group or "", resource, verb)}


@pytest.fixture
def wire(api_double, monkeypatch, tmp_path):
    """Every step that talks to the API, once, against the double, through the code that step runs:
    step -> the requests it sent."""
    by_step: dict[str, list] = {}
    d, eng = api_double
    monkeypatch.setenv("GAUNTLET_RUN_ID", UID)

    def step(name, fn, *a, **kw):
        d.requests.clear()
        result = fn(*a, **kw)
        by_step.setdefault(name, []).extend(d.requests)
        return result

    k8s = BACKENDS["kubernetes"]
    a = dict(profile=KIMI, engine="sglang", run_id=UID)
    step("deploy", deploy.run, deploy.Options(**a), tmp_path / "deploy")
    for gate in ("smoke", "perf", "experiment-baseline"):          # the rank watch, at the gate's start
        assert step(gate, runner._ranks, KIMI, "sglang", tmp_path / gate)
        # a retry that finds the engine released: read the deployment, deploy it again (steps/gates/engine_present.py)
        assert step(gate, k8s.deployed, KIMI, "sglang", run_dir=tmp_path, run_id=UID)
        step(gate, k8s.deploy, deploy.Options(**a), tmp_path / f"{gate}-redeploy")
    # Gate 5: its rank watch, the deployment it reads, the restart at a longer context (the ladder's calls)
    step("longctx", runner._ranks, KIMI, "sglang", tmp_path / "longctx")
    assert step("longctx", k8s.deployed, KIMI, "sglang", run_dir=tmp_path, run_id=UID)
    step("longctx", k8s.restart, deploy.Options(**a, context_length=65536), tmp_path / "restart")
    step("teardown", teardown.run, teardown.Options(**a), tmp_path / "teardown")
    # Gate 6: a variant deployed and torn down through the same steps' code
    step("experiment", deploy.run, deploy.Options(**a, variant="prefix-cache"), tmp_path / "var")
    step("experiment", teardown.run, teardown.Options(**a, variant="prefix-cache"), tmp_path / "var-down")
    step("nodes", node_gpu_pods, connect(), "h20-node-01")           # what nodes.run calls on the API
    from test_admission import admitting

    from gauntlet.steps.backends.kubernetes.admission import admission_checks
    admitting(d, KIMI)
    assert [c.status for c in step("params", admission_checks, KIMI)] == ["pass", "pass"]
    # a rank the API server refuses to create: deploy reads its StatefulSet's FailedCreate event
    monkeypatch.setenv("GAUNTLET_POD_STUCK_GRACE_S", "0")
    d.refuse = lambda owner, pod: {"reason": "FailedCreate", "type": "Warning", "message": "refused"}
    step("deploy", deploy.run, deploy.Options(**a, variant="dspark"), tmp_path / "refused")
    d.refuse = lambda owner, pod: None
    d.pod_status = lambda pod: {"phase": "Succeeded", "containerStatuses": [
        {"name": "probe", "restartCount": 0, "state": {"terminated": {"exitCode": 0}}}]}
    (tmp_path / "network").mkdir()
    step("network", network.run, network.Options(profile=KIMI, run_id=UID, inputs=(), backend="kubernetes"),
         tmp_path / "network")
    d.pod_status = running
    step("deploy", deploy.run, deploy.Options(profile=KIMI, engine="vllm", run_id=UID), tmp_path / "deploy-vllm")
    step("cleanup", _cleanup_k8s.cleanup, cleanup.Options(run_id=UID, workflow_status="Succeeded",
                                                          run_dir=str(tmp_path)), KIMI, tmp_path / "cleanup")
    yield by_step


def needed(requests) -> set[tuple[str, str, str, str]]:
    return set().union(*(wire_to_rules(m, p, c) for (m, p, _, c) in requests))


def test_every_request_of_every_step_is_granted_to_its_account(wire):
    for s, requests in wire.items():
        assert needed(requests) <= role_grants(needs_of(s).api), (s, needs_of(s).api,
                                                                  needed(requests) - role_grants(needs_of(s).api))
    # and each account's steps use every grant it has: nothing in a Role is dead weight
    for role in ("manage", "nodes", "admission"):
        seen = set().union(*(needed(r) for s, r in wire.items() if needs_of(s).api == role))
        assert seen == role_grants(role), (role, role_grants(role) - seen)
        assert set(steps_of(role)) <= set(wire), (role, set(steps_of(role)) - set(wire))   # every step tried
    # the steps of no role call nothing: none of the modules they import (transitively) reaches the API
    # (the back-end registry counts: it imports the Kubernetes back end on demand)
    for s in steps_of(None):
        reached = imported_modules(STEPS[s])
        assert STEPS[s] in reached and len(reached) > 3, (s, reached)      # the walk itself works
        assert not {m for m in reached if m.startswith("gauntlet.steps.backends")}, s


def imported_modules(module: str) -> set[str]:
    """The project modules ``module`` imports, at any depth (function-level and importlib ones too)."""
    from test_boundaries import module_graph

    graph = module_graph()
    seen, todo = set(), [module]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += graph.get(name, ())
    return seen


def test_the_reach_walk_finds_the_kubernetes_back_end_behind_deploy():
    assert any(m.startswith("gauntlet.steps.backends.kubernetes") for m in imported_modules(STEPS["deploy"]))


WF_DONE = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
           "metadata": {"name": "gauntlet-kimi-k3-h20-done", "namespace": "gauntlet", "uid": UID},
           "status": {"phase": "Failed", "finishedAt": "2026-12-01T00:00:00Z"}}


def test_janitor_wire_is_granted_by_its_role(api_double, monkeypatch, tmp_path):
    """The janitor, once over a finished run with a StatefulSet, a Job, Services and a bare pod."""
    d, eng = api_double
    _deploy_k8s.deploy(deploy.Options(profile=KIMI, engine="sglang", run_id=UID),
                       tmp_path / "deploy")
    d.add({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "probe", "namespace": "gauntlet",
           "labels": {"gauntlet.dev/run": UID}}, "spec": {"completions": 1, "template": {"spec": {
               "containers": [{"name": "p", "image": "x"}]}}}})
    d.add({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bare", "namespace": "gauntlet",
           "labels": {"gauntlet.dev/run": UID}}, "spec": {"containers": [{"name": "c", "image": "x"}]},
           "status": {"phase": "Running"}})
    d.add(WF_DONE)
    d.requests.clear()
    checks, metrics = _janitor_k8s.sweep("gauntlet", tmp_path / "janitor", 60)
    assert metrics["held"] == [] and UID in metrics["released"], checks
    seen = needed(d.requests)
    assert needs_of("janitor").api == "janitor"
    assert seen == role_grants("janitor"), (seen - role_grants("janitor"), role_grants("janitor") - seen)
