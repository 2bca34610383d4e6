"""Before any GPU is requested: will the API server admit the run's pods, and does it hold the label policy?

**Pod Security.** kube-apiserver's PodSecurity admission plugin (on by default since 1.25:
k8s.io/kubernetes pkg/kubeapiserver/options/plugins.go ``defaultOnPlugins``) refuses every pod that breaks the
level its namespace's ``pod-security.kubernetes.io/enforce`` label names. The engine's pods need host network,
the model's hostPath and ``IPC_LOCK`` (RDMA registers memory), the NCCL probe's the same, the Gate 0/1 steps
the hostPath or the host network: ``baseline`` and ``restricted`` refuse all of them, so only ``privileged``
runs the graph (:func:`baseline_refusals` names what, in PodSecurity's own words). A pod a StatefulSet's
controller cannot create leaves nothing to wait on: no pod, only a FailedCreate event. So the ``params`` step
reads the label first (:func:`pod_security_check`), as the plugin does (k8s.io/pod-security-admission
api/helpers.go ``PolicyToEvaluate``, ``ParseLevel``): a level that is not one of privileged, baseline and
restricted is enforced as ``restricted``; no label means the cluster's default (privileged unless the API
server's PodSecurity configuration sets another, which no API call shows: deploy then quotes the
StatefulSet's FailedCreate event, steps/backends/kubernetes/stuck.py).

**The label policy.** The rendered ``*.rbac.yaml`` holds a ValidatingAdmissionPolicy and its binding
(steps/backends/kubernetes/rbac.py ``label_policy``: ``admissionregistration.k8s.io/v1``, Kubernetes 1.30 or
later). On an older cluster those two documents fail to apply while the RBAC applies, and nothing else would
notice: :func:`label_policy_check` reads the binding and the policy it names.
"""

from __future__ import annotations

import os
import time
from typing import Any

from gauntlet.contract import Check
from gauntlet.params.models import Profile

__all__ = ["ENFORCE_LABEL", "LEVELS", "BASELINE_CAPABILITIES", "baseline_refusals", "pod_security_check",
           "label_policy_check", "admission_checks", "run_pods"]

ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
LEVELS = ("privileged", "baseline", "restricted")
# what baseline lets a container add (k8s.io/pod-security-admission policy/check_capabilities_baseline.go
# capabilities_allowed_1_0)
BASELINE_CAPABILITIES = frozenset({"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                                   "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"})
_WITHOUT_POLICY = ("without it only gauntlet's own code keeps the manager and the janitor off objects that do not "
                   "carry gauntlet.dev/run (Manager reads the label before every scale, apply and delete); their "
                   "Roles still let them delete any StatefulSet, Job, Service or pod of the namespace")


def baseline_refusals(pod_spec: dict[str, Any]) -> dict[str, str]:
    """What of ``pod_spec`` the ``baseline`` level forbids, keyed by PodSecurity's own reason
    (k8s.io/pod-security-admission policy/check_hostNamespaces.go, check_hostPathVolumes.go, check_hostPorts.go,
    check_capabilities_baseline.go, check_privileged.go), with the fields that break it. With host network the
    API server makes every containerPort a hostPort (pkg/apis/core/v1/defaults.go ``defaultHostNetworkPorts``)
    before admission sees the pod. ``restricted`` forbids all of these and more."""
    out: dict[str, str] = {}
    hosts = [f"{k}=true" for k in ("hostNetwork", "hostPID", "hostIPC") if pod_spec.get(k)]
    if hosts:
        out["host namespaces"] = ", ".join(hosts)
    paths = [v["name"] for v in pod_spec.get("volumes") or [] if v.get("hostPath")]
    if paths:
        out["hostPath volumes"] = ", ".join(paths)
    containers = (pod_spec.get("initContainers") or []) + (pod_spec.get("containers") or [])
    ports = sorted({p.get("hostPort") or (p["containerPort"] if pod_spec.get("hostNetwork") else 0)
                    for c in containers for p in c.get("ports") or []} - {0})
    if ports:
        out["hostPort"] = ", ".join(map(str, ports))
    caps = sorted({cap for c in containers for cap in ((c.get("securityContext") or {}).get("capabilities") or {})
                   .get("add") or [] if cap not in BASELINE_CAPABILITIES})
    if caps:
        out["non-default capabilities"] = ", ".join(caps)
    if any((c.get("securityContext") or {}).get("privileged") for c in containers):
        out["privileged"] = "privileged: true"
    return out


def run_pods(profile: Profile) -> dict[str, dict[str, Any]]:
    """The pod specs of what the run creates on the cluster itself, by what they are (the Gate 0/1 step pods come
    from the rendered template: their hostPath and host network are the same fields)."""
    from gauntlet.steps.backends.kubernetes import manifests as M
    pods = {f"engine {e}": M.engine_statefulset(profile, e, "0" * 8, "image")["spec"]["template"]["spec"]
            for e in profile.engine_order()}
    pods["NCCL probe"] = M.probe_job(profile, "inter", "0" * 8, "image", {}, "", [])["spec"]["template"]["spec"]
    return pods


def _needs(profile: Profile) -> str:
    """One phrase: what of the run's own pods baseline forbids (in PodSecurity's words), and the step pods'."""
    why: dict[str, set[str]] = {}
    for spec in run_pods(profile).values():
        for reason, fields in baseline_refusals(spec).items():
            why.setdefault(reason, set()).update(f.strip() for f in fields.split(","))
    said = "; ".join(f"{r}: {', '.join(sorted(f, key=lambda x: (len(x), x)))}" for r, f in why.items())
    return (f"the engine's and the NCCL probe's pods ({said}) and the Gate 0/1 step pods that mount the model "
            "cache (hostPath) or use the host network")


def pod_security_check(namespace: str, labels: dict[str, str] | None, needs: str) -> Check:
    """The namespace's Pod Security enforce level against what the run's pods need (``needs``: one phrase)."""
    name = "pod-security"
    raw = (labels or {}).get(ENFORCE_LABEL)
    fix = (f"label it privileged: kubectl label namespace {namespace} {ENFORCE_LABEL}=privileged --overwrite "
           "(docs/cluster.md, 'What to create before the first submit')")
    if raw is None:
        return Check(name, "skip", f"{ENFORCE_LABEL}=privileged", None,
                     f"namespace {namespace} has no {ENFORCE_LABEL} label: the cluster's default level applies "
                     "(privileged unless the API server's PodSecurity configuration sets another; deploy would then "
                     f"quote the StatefulSet's FailedCreate event); to be sure, {fix}")
    if raw == "privileged":
        return Check(name, "pass", f"{ENFORCE_LABEL}=privileged", raw,
                     f"namespace {namespace} is labelled {ENFORCE_LABEL}=privileged: it admits {needs}")
    level = raw if raw in LEVELS else "restricted"     # PodSecurity's ParseLevel: an unknown level is restricted
    said = (f"namespace {namespace} is labelled {ENFORCE_LABEL}={raw}" if raw in LEVELS else
            f"namespace {namespace} is labelled {ENFORCE_LABEL}={raw!r}, not a level ({', '.join(LEVELS)}): "
            "Pod Security enforces restricted")
    return Check(name, "fail", f"{ENFORCE_LABEL}=privileged", raw,
                 f"{said}: Pod Security admission ({level}) refuses the run's pods: {needs}; {fix}")


def label_policy_check(name: str, binding: dict[str, Any] | None, policy: dict[str, Any] | None,
                       required: bool, why_absent: str = "") -> Check:
    """The label policy's binding ``name`` is there, denies, names the policy, and the policy is there too.
    ``required`` False (the profile's ``label_policy: optional``) makes a missing one a skip."""
    cname, want = "label-policy", f"ValidatingAdmissionPolicyBinding {name} (Deny) and its policy"
    problems = []
    if binding is None:
        problems.append(f"no ValidatingAdmissionPolicyBinding {name}{why_absent}")
    else:
        spec = binding.get("spec") or {}
        if spec.get("policyName") != name:
            problems.append(f"ValidatingAdmissionPolicyBinding {name} names policy {spec.get('policyName')!r}, "
                            f"not {name!r}")
        if "Deny" not in (spec.get("validationActions") or []):
            problems.append(f"ValidatingAdmissionPolicyBinding {name} does not Deny "
                            f"(validationActions {spec.get('validationActions')})")
        if policy is None:
            problems.append(f"no ValidatingAdmissionPolicy {name} (a binding of a missing policy is ignored)")
    if not problems:
        return Check(cname, "pass", want, name, f"ValidatingAdmissionPolicy {name} is bound (Deny): the API server "
                     "refuses the manager's and the janitor's changes to objects without gauntlet.dev/run")
    fix = ("apply the rendered build/gauntlet-<profile>.rbac.yaml (admissionregistration.k8s.io/v1: Kubernetes 1.30 "
           "or later), or set the profile's label_policy: optional to run without it")
    return Check(cname, "fail" if required else "skip", want, None,
                 f"{'; '.join(problems)}: {_WITHOUT_POLICY}; {fix}")


def admission_checks(profile: Profile, tries: int = 3, wait_s: float = 2.0) -> list[Check]:
    """Both checks, read from the API server as the ``admission`` role (rbac.py ``ADMISSION_RULES``). The step
    that runs them is never retried (exit 75), so an API that does not answer is retried here, ``tries`` times,
    then a failed check naming the error; a refusal (401/403: the RBAC not applied) is a UsageError."""
    from gauntlet.contract import TransientError

    attempt = 1
    while True:
        try:
            return _read_and_judge(profile)
        except TransientError as exc:
            if attempt >= tries:
                return [Check("admission", "fail", "the API server answers", None,
                              f"could not read the namespace and the label policy after {tries} tries: {exc}")]
            time.sleep(wait_s * attempt)
            attempt += 1


def _read_and_judge(profile: Profile) -> list[Check]:
    from gauntlet.steps.backends.kubernetes.api import NotFound, call, connect
    from gauntlet.steps.backends.kubernetes.rbac import policy_name

    ns = os.environ.get("GAUNTLET_NAMESPACE") or profile.namespace
    api = connect()
    namespace = call(api.core.read_namespace, ns)
    checks = [pod_security_check(ns, (namespace.get("metadata") or {}).get("labels"), _needs(profile))]
    name = policy_name(ns, profile.service_account)
    found: dict[str, dict[str, Any] | None] = {}
    why = ""
    for kind, fn in (("binding", api.admission.read_validating_admission_policy_binding),
                     ("policy", api.admission.read_validating_admission_policy)):
        try:
            found[kind] = call(fn, name)
        except NotFound as exc:
            found[kind] = None
            # a server before 1.30 (or with the API off) serves no such resource at all: say so
            why = why or ("" if f'"{name}" not found' in str(exc) else
                          " (the API server does not serve admissionregistration.k8s.io/v1 policies: before 1.30?)")
    checks.append(label_policy_check(name, found["binding"], found["policy"], profile.label_policy == "required",
                                     why))
    return checks
