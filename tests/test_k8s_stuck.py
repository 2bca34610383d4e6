"""Pods that cannot start (gauntlet.steps.backends.kubernetes.stuck): recognised on pods as the API returns them, failed after
the grace, named with the cluster's own message.

The pods in tests/fixtures/box-pods/ were read back from the box's API server (``GET`` of the pod,
``managedFields`` dropped): ``unschedulable.json`` carries the condition the REAL kube-scheduler wrote;
the image-pull and config-error pods carry the waiting states the box's process kubelet writes in a real
kubelet's words (box/kubelet.py; no real kubelet runs here). ``failed-create-events.json`` holds the events the
REAL StatefulSet controller recorded when the REAL PodSecurity admission refused the engine's pods in a namespace
labelled baseline (tests/test_box_pod_security.py, which also runs deploy there for real).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from k8s_double import FakeEngine, K8sDouble

from gauntlet.params import load_profile
from gauntlet.steps.backends.kubernetes import deploy as _deploy_k8s
from gauntlet.steps.gates import deploy
from gauntlet.steps.backends.kubernetes import stuck as S
from gauntlet.steps.backends.kubernetes.manager import pod_state

PODS = Path(__file__).resolve().parent / "fixtures" / "box-pods"
KIMI = load_profile("kimi-k3-h20")
UID = "9e0d4c2a-1111-2222-3333-444455556666"


def box_pod(name: str) -> dict:
    return json.loads((PODS / f"{name}.json").read_text())


def box_events() -> list[dict]:
    return json.loads((PODS / "failed-create-events.json").read_text())["items"]


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_unschedulable_pod_carries_the_schedulers_message_verbatim():
    pod = box_pod("unschedulable")
    cond = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
    kind, text = S.stuck_cause(pod)
    assert kind == "unschedulable" and text == f"Unschedulable: {cond['message']}"
    assert "nodes are available" in text and "Insufficient nvidia.com/gpu" in text
    st = pod_state(pod)
    assert st.stuck == text and st.problem is None and st.node is None      # no fail-fast problem: a grace


@pytest.mark.parametrize("name, reason", [("image-pull", ("ErrImagePull", "ImagePullBackOff")),
                                          ("config-error", ("CreateContainerConfigError",))])
def test_waiting_on_image_or_config_is_stuck_not_failed_at_once(name, reason):
    pod = box_pod(name)
    kind, text = S.stuck_cause(pod)
    assert any(f": {r}" in text for r in reason), text
    assert pod_state(pod).problem is None and pod_state(pod).stuck == text


def test_a_scheduled_running_pod_is_not_stuck():
    pod = box_pod("unschedulable")
    pod["status"] = {"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}],
                     "containerStatuses": [{"name": "main", "ready": True, "restartCount": 0,
                                            "state": {"running": {"startedAt": "2026-12-04T20:00:00Z"}}}]}
    assert S.stuck_cause(pod) is None and pod_state(pod).stuck is None


def test_watch_fails_only_after_the_grace_and_restarts_when_the_pod_moves_on():
    clock = Clock()
    w = S.StuckWatch(grace=60, clock=clock)
    unsched, pulling = box_pod("unschedulable"), box_pod("image-pull")
    pulling["metadata"]["name"] = unsched["metadata"]["name"]         # the same pod, once scheduled
    assert w.check([unsched]) is None
    clock.t += 59
    assert w.check([unsched]) is None
    clock.t += 1
    msg = w.check([unsched])
    assert msg and msg.startswith(f"{unsched['metadata']['name']}: Unschedulable: 0/") and msg.endswith("(for 60s)")
    clock.t += 1
    assert w.check([pulling]) is None                 # scheduled now, pulling: a new state, a new grace
    clock.t += 30
    back_off = copy.deepcopy(pulling)
    back_off["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] = "ImagePullBackOff"
    assert w.check([back_off]) is None                # ErrImagePull <-> ImagePullBackOff is one state
    clock.t += 30
    assert "ImagePullBackOff" in (w.check([back_off]) or "")


def test_a_pod_being_deleted_is_not_stuck():
    pod = box_pod("unschedulable")
    pod["metadata"]["deletionTimestamp"] = "2026-12-04T20:00:00Z"
    w = S.StuckWatch(grace=0)
    assert w.check([pod]) is None


@pytest.mark.parametrize("raw, want", [("", S.STUCK_GRACE_S), ("20", 20.0), ("-5", 0.0), ("soon", S.STUCK_GRACE_S)])
def test_grace_from_the_environment(monkeypatch, raw, want):
    monkeypatch.setenv(S.GRACE_ENV, raw)
    assert S.grace_s() == want


def _no_grace(monkeypatch, d, eng) -> None:
    """deploy against the API double and the fake engine, with a zero stuck grace and a fast poll."""
    monkeypatch.setenv("GAUNTLET_KUBE_API", d.url)
    monkeypatch.setenv("GAUNTLET_READY_URL", eng.url)
    monkeypatch.setenv(S.GRACE_ENV, "0")
    monkeypatch.delenv("GAUNTLET_NAMESPACE", raising=False)
    monkeypatch.setattr(_deploy_k8s, "POLL_S", 0.02)


def test_deploy_fails_on_an_unschedulable_rank_quoting_the_scheduler_and_scales_to_zero(monkeypatch, tmp_path):
    """Against the API double: rank 1 has the real scheduler's Unschedulable status; with a zero grace deploy
    fails on the first poll, names the pod and the message, and leaves the StatefulSet at 0 replicas."""
    real = box_pod("unschedulable")
    with K8sDouble() as d, FakeEngine() as eng:
        _no_grace(monkeypatch, d, eng)
        d.pod_log = lambda pod, c: ""
        d.pod_status = lambda pod: (real["status"] if pod["metadata"]["name"].endswith("-1")
                                    else {"phase": "Pending"})
        opts = deploy.Options(profile=KIMI, engine="sglang", variant=None, run_id=UID, backend="kubernetes")
        checks, metrics = _deploy_k8s.deploy(opts, tmp_path)
        ready = {c.name: c for c in checks}["ready"]
        msg = next(c for c in real["status"]["conditions"] if c["type"] == "PodScheduled")["message"]
        assert ready.status == "fail" and f"g-sglang-9e0d4c2a-1: Unschedulable: {msg}" in ready.detail
        assert d.get("statefulsets", "gauntlet", "g-sglang-9e0d4c2a")["spec"]["replicas"] == 0
        assert metrics["outputs"]["endpoint"] == "" and eng.calls == []


def test_the_controllers_failed_create_is_quoted_verbatim_and_other_events_are_not():
    (ev,) = box_events()
    assert S.failed_create([ev]) == f"FailedCreate: {ev['message']}"
    assert 'violates PodSecurity "baseline:latest"' in ev["message"] and ev["source"]["component"] == "statefulset-controller"
    older = {**ev, "message": "an older refusal", "lastTimestamp": "2026-12-05T16:00:00Z"}
    assert S.failed_create([older, ev]) == f"FailedCreate: {ev['message']}"          # the newest
    assert S.failed_create([{**ev, "reason": "SuccessfulCreate"}]) is None


def test_a_controller_short_of_pods_is_stuck_after_the_grace_and_not_once_its_pods_come():
    clock = Clock()
    w = S.StuckWatch(grace=60, clock=clock)
    why = S.failed_create(box_events())
    assert w.check([], {"StatefulSet g-sglang-9e0d4c2a": why}) is None
    clock.t += 60
    assert w.check([], {"StatefulSet g-sglang-9e0d4c2a": why}) == f"StatefulSet g-sglang-9e0d4c2a: {why} (for 60s)"
    clock.t += 1
    assert w.check([]) is None                  # its pods were created (no FailedCreate counted any more)


def test_deploy_fails_when_no_rank_can_be_created_quoting_the_failed_create(monkeypatch, tmp_path):
    """Against the API double: the StatefulSet is accepted but its pods are refused, as the box's API server refused
    them (its controller's event, captured); with a zero grace deploy fails on the first poll quoting the event,
    instead of waiting its ready timeout (90 minutes for the Kimi K3) for pods that never come, and scales to 0."""
    (real,) = box_events()
    with K8sDouble() as d, FakeEngine() as eng:
        _no_grace(monkeypatch, d, eng)
        d.refuse = lambda owner, pod: {k: real[k] for k in ("reason", "message", "type", "source", "lastTimestamp")}
        opts = deploy.Options(profile=KIMI, engine="sglang", variant=None, run_id=UID, backend="kubernetes")
        checks, metrics = _deploy_k8s.deploy(opts, tmp_path)
        ready = {c.name: c for c in checks}["ready"]
        assert ready.status == "fail" and ready.detail.startswith(
            f"sglang not ready: cannot start: StatefulSet g-sglang-9e0d4c2a: FailedCreate: {real['message']} (for 0s)")
        assert d.names("pods") == [] and d.get("statefulsets", "gauntlet", "g-sglang-9e0d4c2a")["spec"]["replicas"] == 0
        assert metrics["outputs"]["endpoint"] == "" and eng.calls == []
