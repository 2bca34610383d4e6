"""Pod Security admission and the label policy, decided by the box's REAL kube-apiserver v1.37.2 (marker ``argo``).

Only the control plane is needed. Its API server runs the default admission plugins, PodSecurity among them
(tests/box/controlplane.py passes no ``--enable-admission-plugins``; k8s.io/kubernetes
pkg/kubeapiserver/options/plugins.go ``defaultOnPlugins``), and the real StatefulSet controller runs in
kube-controller-manager. Here:

- every pod the run creates (the engine's and the NCCL probe's, built by the code that deploys them; the Gate 0/1
  step pods made from the rendered template's containers and volumes, as Argo's controller makes them, less its own
  init and wait containers) is created with a server-side dry run in namespaces labelled baseline, restricted and
  privileged: refused by the first two, and at baseline for exactly the reasons
  ``admission.baseline_refusals`` names (what the params step's line quotes); admitted at privileged;
- deploy, the real code, in a namespace labelled baseline: the StatefulSet is accepted, its controller's pods are
  refused, and deploy fails after the grace quoting the controller's FailedCreate event (the events are what
  tests/fixtures/box-pods/failed-create-events.json holds: ``GAUNTLET_RECAPTURE=1`` writes it again);
- the params step's reads under the rendered ``gauntlet-admission`` account's own token: the namespace's label and
  the label policy's binding, which fails naming the binding once it is deleted.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from gauntlet.params import load_profile
from gauntlet.steps.backends.kubernetes import admission as A
from gauntlet.steps.backends.kubernetes import rbac
from gauntlet.workflows.render import render_documents, template_name

pytestmark = pytest.mark.argo

KIMI = load_profile("kimi-k3-h20")
UID = "9e0d4c2a-1111-2222-3333-444455556666"       # the run id of tests/test_k8s_stuck.py: the same object names
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "box-pods" / "failed-create-events.json"


def _namespace(cp, name: str, level: str | None) -> None:
    labels = {A.ENFORCE_LABEL: level} if level else {}
    status, out = cp.request("PATCH", f"/api/v1/namespaces/{name}?fieldManager=gauntlet-box&force=true",
                             json.dumps({"apiVersion": "v1", "kind": "Namespace",
                                         "metadata": {"name": name, "labels": labels}}),
                             content_type="application/apply-patch+yaml")
    assert status < 300, (status, out)


def _account(cp, namespace: str, name: str) -> None:
    status, out = cp.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts",
                             {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}})
    assert status in (201, 409), (status, out)


def _step_pod(wt: dict[str, Any], template: str) -> dict[str, Any]:
    """A Gate 0/1 step's pod spec as Argo's controller builds it from the template (its main container, the
    workflow volumes it mounts, its podSpecPatch), without Argo's own init and wait containers."""
    t = next(x for x in wt["spec"]["templates"] if x["name"] == template)
    mounted = {m["name"] for m in t["container"].get("volumeMounts") or []}
    spec = {"containers": [{**t["container"], "name": "main"}],
            "volumes": [v for v in wt["spec"]["volumes"] if v["name"] in mounted],
            "serviceAccountName": t.get("serviceAccountName") or "default", "restartPolicy": "Never"}
    return {**spec, **json.loads(t.get("podSpecPatch") or "{}")}


def _pods() -> dict[str, dict[str, Any]]:
    wt = render_documents(KIMI)[f"{template_name(KIMI)}.workflowtemplate.yaml"]
    pods = A.run_pods(KIMI)
    for step in ("preflight-0", "prewarm-0", "nodes-0", "params", "cleanup"):
        pods[f"step {step}"] = _step_pod(wt, step)
    return pods


def _reasons(message: str) -> set[str]:
    """PodSecurity's reasons in its refusal: 'violates PodSecurity "baseline:latest": host namespaces (...), ...'."""
    body = message.split('": ', 1)[1] if '": ' in message else message
    return {m.strip() for m in re.findall(r"(?:^|\), )([a-zA-Z][^(]*?) \(", body)}


def test_the_run_pods_need_privileged_for_the_reasons_the_params_step_names(control_plane):
    cp = control_plane
    pods = _pods()
    for level in ("baseline", "restricted", "privileged"):
        _namespace(cp, f"psa-{level}", level)
        for account in {spec.get("serviceAccountName") or "default" for spec in pods.values()}:
            _account(cp, f"psa-{level}", account)       # the ServiceAccount plugin refuses a pod of a missing one
    admitted_at_baseline = []
    for what, spec in pods.items():
        name = re.sub(r"[^a-z0-9-]", "-", what.lower())
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}
        got = {}
        for level in ("baseline", "restricted", "privileged"):
            status, out = cp.request("POST", f"/api/v1/namespaces/psa-{level}/pods?dryRun=All", pod)
            got[level] = (status, out.get("message", "") if isinstance(out, dict) else str(out))
        assert got["privileged"][0] == 201, (what, got["privileged"])
        status, msg = got["baseline"]
        if not A.baseline_refusals(spec):
            assert status == 201, (what, msg)           # params and cleanup: nothing of baseline's
            admitted_at_baseline.append(what)
            continue
        assert status == 403 and 'violates PodSecurity "baseline:latest"' in msg, (what, status, msg)
        assert _reasons(msg) == set(A.baseline_refusals(spec)), (what, msg)
        assert got["restricted"][0] == 403 and 'violates PodSecurity "restricted:latest"' in got["restricted"][1]
    # the step that reads the label runs at baseline (its own pod is admitted), every GPU or model-cache pod does not;
    # at restricted even its pod is refused (Argo's containers set no runAsNonRoot, seccomp or dropped capabilities):
    # the run then fails at params with Argo's node message quoting the refusal
    assert admitted_at_baseline == ["step params", "step cleanup"], admitted_at_baseline


def _kubeconfig(cp, path: Path, token: str | None = None) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "box",
        "clusters": [{"name": "box", "cluster": {"server": cp.url, "certificate-authority": str(cp.ca_file)}}],
        "users": [{"name": "u", "user": {"token": token or cp.admin_token}}],
        "contexts": [{"name": "box", "context": {"cluster": "box", "user": "u"}}]}))
    return path


def _connect_to(monkeypatch, kubeconfig: Path, namespace: str) -> None:
    for var in ("GAUNTLET_KUBE_API", "KUBERNETES_SERVICE_HOST", "GAUNTLET_READY_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    # the client reads $KUBECONFIG once, when its module is imported (kube_config.KUBE_CONFIG_DEFAULT_LOCATION)
    import kubernetes.config.kube_config as kube_config
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
    monkeypatch.setenv("GAUNTLET_NAMESPACE", namespace)


def test_deploy_fails_quoting_the_statefulsets_failed_create(control_plane, monkeypatch, tmp_path):
    """No pod ever appears to wait on: deploy reads the StatefulSet controller's FailedCreate event, fails after
    the grace (3 s here, 300 s on a cluster) naming Pod Security's refusal, and scales what it applied to 0."""
    from gauntlet.steps.backends.kubernetes import deploy as _deploy
    from gauntlet.steps.gates import deploy

    cp = control_plane
    ns = "psa-deploy"
    _namespace(cp, ns, "baseline")
    _account(cp, ns, KIMI.service_account)
    _connect_to(monkeypatch, _kubeconfig(cp, tmp_path / "admin.kubeconfig"), ns)
    monkeypatch.setenv("GAUNTLET_POD_STUCK_GRACE_S", "3")
    monkeypatch.setattr(_deploy, "POLL_S", 1.0)
    t0 = time.monotonic()
    checks, metrics = _deploy.deploy(deploy.Options(profile=KIMI, engine="sglang", run_id=UID, backend="kubernetes"),
                                     tmp_path / "deploy")
    took = time.monotonic() - t0
    ready = {c.name: c for c in checks}["ready"]
    sts = "g-sglang-9e0d4c2a"
    assert ready.status == "fail" and took < 60, (took, ready.detail)
    # the controller's own words (pkg/controller/statefulset/stateful_pod_control.go recordPodEvent)
    assert f"cannot start: StatefulSet {sts}: FailedCreate: Create Pod {sts}-" in ready.detail, ready.detail
    assert 'is forbidden: violates PodSecurity "baseline:latest": ' in ready.detail
    assert "host namespaces (hostNetwork=true)" in ready.detail and f"scaled {sts} to 0" in ready.detail
    assert cp.request("GET", f"/apis/apps/v1/namespaces/{ns}/statefulsets/{sts}")[1]["spec"]["replicas"] == 0
    assert metrics["outputs"]["endpoint"] == ""
    _, events = cp.request("GET", f"/api/v1/namespaces/{ns}/events?fieldSelector=involvedObject.name%3D{sts}")
    items = [e for e in events["items"] if e.get("reason") == "FailedCreate"]
    assert items and all(e["involvedObject"]["kind"] == "StatefulSet" for e in items)
    if os.environ.get("GAUNTLET_RECAPTURE"):
        for e in items:
            e["metadata"].pop("managedFields", None)
        FIXTURE.write_text(json.dumps({"kind": "EventList", "apiVersion": "v1", "items": items}, indent=1) + "\n")


def test_the_params_reads_under_the_rendered_account(control_plane, monkeypatch, tmp_path):
    """The rendered RBAC in a namespace of its own; the checks read with the gauntlet-admission token: the label
    (absent, then privileged, then baseline), the binding (there, then deleted), nothing of another namespace."""
    cp = control_plane
    ns = "gauntlet-admission"
    profile = KIMI.model_copy(update={"namespace": ns})
    _namespace(cp, ns, None)
    for d in render_documents(profile)[f"{template_name(profile)}.rbac.yaml"]:
        cp.apply(d)
    status, out = cp.request("POST", f"/api/v1/namespaces/{ns}/serviceaccounts/"
                                     f"{rbac.account(profile.service_account, 'admission')}/token",
                             {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                              "spec": {"expirationSeconds": 3600}})
    assert status == 201, (status, out)
    _connect_to(monkeypatch, _kubeconfig(cp, tmp_path / "admission.kubeconfig", out["status"]["token"]), ns)

    def statuses() -> list[tuple[str, str]]:
        return [(c.name, c.status) for c in A.admission_checks(profile)]

    assert statuses() == [("pod-security", "skip"), ("label-policy", "pass")]
    _namespace(cp, ns, "privileged")
    assert statuses() == [("pod-security", "pass"), ("label-policy", "pass")]
    _namespace(cp, ns, "baseline")
    pod_security, _ = A.admission_checks(profile)
    assert pod_security.status == "fail" and f"{A.ENFORCE_LABEL}=baseline" in pod_security.detail
    _namespace(cp, ns, "privileged")
    name = rbac.policy_name(ns, profile.service_account)
    status, out = cp.request("DELETE", f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/{name}")
    assert status == 200, (status, out)
    _, label_policy = A.admission_checks(profile)
    assert label_policy.status == "fail" and label_policy.detail.startswith(
        f"no ValidatingAdmissionPolicyBinding {name}:"), label_policy.detail
    # resourceNames: the account reads its own namespace only
    from gauntlet.contract import UsageError
    monkeypatch.setenv("GAUNTLET_NAMESPACE", "default")
    with pytest.raises(UsageError, match="403"):
        A.admission_checks(profile)
