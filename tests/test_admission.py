"""Before any GPU is requested, the params step reads what the API server will do with the run's pods: the namespace's
Pod Security level and the label policy's binding (gauntlet.steps.backends.kubernetes.admission).

What the real API server decides is shown on the box (tests/test_box_pod_security.py: the rendered pods refused at
baseline and restricted by the real PodSecurity plugin, the binding read under the rendered Role; the box scenario
``pod-security-baseline``). Here: the judgement on the objects the API returns, and the step through the API double.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from k8s_double import K8sDouble

from gauntlet.params import load_profile
from gauntlet.steps.backends.kubernetes import admission as A
from gauntlet.steps.backends.kubernetes import rbac
from gauntlet.steps.backends.kubernetes.admission import ENFORCE_LABEL

KIMI = load_profile("kimi-k3-h20")


def admitting(d: K8sDouble, profile, level: str | None = "privileged", binding: bool = True) -> None:
    """The double holds the profile's namespace (labelled ``level``) and the rendered label policy (and its binding)."""
    labels = {"kubernetes.io/metadata.name": profile.namespace, **({ENFORCE_LABEL: level} if level else {})}
    d.add({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": profile.namespace, "labels": labels}})
    policy, bind = rbac.label_policy(profile.namespace, profile.service_account)
    for doc in (policy, bind) if binding else (policy,):
        d.add(doc)


def _judge(level: str | None):
    labels = {"kubernetes.io/metadata.name": "gauntlet", **({ENFORCE_LABEL: level} if level is not None else {})}
    return A.pod_security_check("gauntlet", labels, "the engine's pods (x)")


@pytest.mark.parametrize("level", ["baseline", "restricted"])
def test_a_baseline_or_restricted_namespace_fails_naming_the_label_in_one_line(level):
    c = _judge(level)
    assert c.status == "fail" and c.observed == level and "\n" not in c.detail
    assert c.detail.startswith(f"namespace gauntlet is labelled {ENFORCE_LABEL}={level}: Pod Security admission "
                               f"({level}) refuses the run's pods")
    assert f"kubectl label namespace gauntlet {ENFORCE_LABEL}=privileged --overwrite" in c.detail


def test_privileged_passes_no_label_is_the_clusters_default_and_a_typo_is_restricted():
    assert _judge("privileged").status == "pass"
    none = _judge(None)
    assert none.status == "skip" and "the cluster's default level applies" in none.detail
    # k8s.io/pod-security-admission api/helpers.go ParseLevel: an unknown level is enforced as restricted
    typo = _judge("Privileged")
    assert typo.status == "fail" and "'Privileged', not a level" in typo.detail and "(restricted)" in typo.detail


def test_what_baseline_forbids_in_the_run_pods_is_named_in_pod_securitys_words():
    """The rendered engine and probe pods, read for the fields the baseline checks forbid (the box test compares
    these reasons with the real plugin's refusal, tests/test_box_pod_security.py)."""
    pods = A.run_pods(KIMI)
    eng = A.baseline_refusals(pods["engine sglang"])
    assert eng == {"host namespaces": "hostNetwork=true", "hostPath volumes": "model",
                   "hostPort": f"{KIMI.hardware.telemetry.port}, 20000, 30000", "non-default capabilities": "IPC_LOCK"}
    probe = A.baseline_refusals(pods["NCCL probe"])
    assert probe["host namespaces"] == "hostNetwork=true" and probe["non-default capabilities"] == "IPC_LOCK"
    assert A.baseline_refusals({"containers": [{"name": "c", "securityContext": {"capabilities": {
        "add": ["CHOWN", "NET_BIND_SERVICE"]}}}]}) == {}        # baseline's own capabilities


def test_label_policy_present_missing_or_wrong():
    name = rbac.policy_name("gauntlet", "gauntlet")
    policy, binding = rbac.label_policy("gauntlet", "gauntlet")
    assert A.label_policy_check(name, binding, policy, required=True).status == "pass"
    gone = A.label_policy_check(name, None, policy, required=True)
    assert gone.status == "fail" and f"no ValidatingAdmissionPolicyBinding {name}" in gone.detail
    # what the guard covers without it, and how to get it back
    assert "only gauntlet's own code keeps the manager and the janitor off" in gone.detail
    assert "build/gauntlet-<profile>.rbac.yaml" in gone.detail and "\n" not in gone.detail
    assert A.label_policy_check(name, None, None, required=False).status == "skip"
    warn = {**binding, "spec": {**binding["spec"], "validationActions": ["Warn"]}}
    assert "does not Deny" in A.label_policy_check(name, warn, policy, required=True).detail
    assert "a binding of a missing policy is ignored" in A.label_policy_check(name, binding, None, True).detail


def _step(d: K8sDouble, out: Path) -> subprocess.CompletedProcess:
    from test_params_step import GOOD, _allowed, _given
    return subprocess.run([sys.executable, "-m", "gauntlet.workflows.cli", "step", "params", "--profile", "kimi-k3-h20",
                           "--out", str(out), "--given", _given(**GOOD), "--allowed", *_allowed()],
                          capture_output=True, text=True, env={**os.environ, "GAUNTLET_KUBE_API": d.url,
                                                                "GAUNTLET_NAMESPACE": KIMI.namespace})


def _checks(out: Path) -> dict[str, dict]:
    return {c["name"]: c for c in json.loads((out / "verdict.json").read_text())["checks"]}


def test_the_step_fails_on_a_baseline_namespace_and_reads_only_its_three_objects(tmp_path):
    with K8sDouble() as d:
        admitting(d, KIMI, "baseline")
        r = _step(d, tmp_path)
        sent = list(d.requests)
    assert r.returncode == 1, r.stdout + r.stderr
    c = _checks(tmp_path)["pod-security"]
    assert c["status"] == "fail" and f"{ENFORCE_LABEL}=baseline" in c["detail"]
    line = next(ln for ln in r.stdout.splitlines() if ln.split()[:2] == ["fail", "pod-security"])
    assert line.split(None, 2)[2] == c["detail"]          # the step's own line says it
    name = rbac.policy_name(KIMI.namespace, KIMI.service_account)
    assert sorted(p for _, p, _, _ in sent) == sorted([
        f"/api/v1/namespaces/{KIMI.namespace}",
        f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/{name}",
        f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/{name}"])


def test_the_step_fails_when_the_binding_is_missing_or_the_server_has_no_such_api(tmp_path):
    name = rbac.policy_name(KIMI.namespace, KIMI.service_account)
    with K8sDouble() as d:
        admitting(d, KIMI, binding=False)
        r = _step(d, tmp_path / "a")
        d.unserved |= {"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies",
                       "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"}
        old = _step(d, tmp_path / "b")
    assert r.returncode == 1
    c = _checks(tmp_path / "a")["label-policy"]
    assert c["status"] == "fail" and c["detail"].startswith(f"no ValidatingAdmissionPolicyBinding {name}:")
    assert old.returncode == 1
    assert "the API server does not serve admissionregistration.k8s.io/v1 policies: before 1.30?" in \
        _checks(tmp_path / "b")["label-policy"]["detail"]


def test_an_api_that_does_not_answer_is_a_failed_check_not_a_retry(monkeypatch):
    """params is never retried (no retryStrategy: Needs.transient False), so it tries a few times itself."""
    from gauntlet.steps.engines.local_vllm import free_port
    monkeypatch.setenv("GAUNTLET_KUBE_API", f"http://127.0.0.1:{free_port()}")
    (c,) = A.admission_checks(KIMI, tries=2, wait_s=0)
    assert c.status == "fail" and c.detail.startswith("could not read the namespace and the label policy after 2 tries")
