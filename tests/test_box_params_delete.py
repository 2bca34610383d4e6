"""Bad parameters and `argo delete` on the control plane in a box (marker ``argo``), as a user does them.

- Each bad value (and a misspelled parameter name) is submitted with the real CLI
  (``argo submit --from workflowtemplate``): the first step, ``params``, refuses it with one line (exit 2),
  every other task is Omitted, no pod that requests a GPU is ever created and the workflow ends Failed.
  Whether the CLI/server refused it at submit is recorded (Argo v4.0.5 does not: docs/cluster.md).
- ``argo delete`` mid-deploy and mid-perf: the engine's objects carry an ownerReference to the Workflow, so
  kube-controller-manager's garbage collector deletes them with it; nothing labelled with the run holds a
  replica or a GPU pod 120 s later. The seconds are written to build/fault-timings.json (docs/reliability.md): 1.3 s
  mid-deploy on an idle box; the bound is for the garbage collector on a loaded CI machine (over 30 s once, at a
  load of 10 on 2 cores, with the rest of the suite beside it), not the figure.
"""

from __future__ import annotations

import time

import pytest

from box.scenarios import requests_gpu
from gauntlet.workflows.render import RUN_LABEL
from gauntlet.workflows.render import template_name
from test_box_faults import (PARAMS, engine_held, record, submit_async, until, wait_done,
                             wait_running, workflow, outcome)

pytestmark = pytest.mark.argo

BAD = {
    "engines=foo": {"engines": "foo"},
    "engines=sglang,vlm": {"engines": "sglang,vlm"},
    "prewarm=maybe": {"prewarm": "maybe"},
    "engine=vllm (undeclared)": {"engine": "vllm"},
    "retry-backoff=abc": {"retry-backoff": "abc"},
    "results-uri=ftp://x": {"results-uri": "ftp://x/results"},
}
SAYS = {"engines=foo": "parameter engines='foo': must be one of both, sglang, vllm",
        "engines=sglang,vlm": "parameter engines='sglang,vlm': must be one of",
        "prewarm=maybe": "parameter prewarm='maybe': must be one of false, true",
        "engine=vllm (undeclared)": "parameter 'engine' is not a parameter of this workflow",
        "retry-backoff=abc": "parameter retry-backoff='abc': must be a whole number",
        "results-uri=ftp://x": "parameter results-uri='ftp://x/results': must be a path, or a URI"}


def _gpu_pods(s, uid: str) -> list[str]:
    return sorted(p["metadata"]["name"] for p in s.pods_seen.values()
                  if (p["metadata"].get("labels") or {}).get(RUN_LABEL) == uid and requests_gpu(p))


def _log(s, pod: str) -> str:
    status, text = s.box.request("GET", f"/api/v1/namespaces/{s.ns}/pods/{pod}/log?container=main")
    return text if isinstance(text, str) else str(text)


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_parameter_refused_before_any_gpu(box_session, case):
    s = box_session
    argv = ["submit", "-n", s.ns, "--from", f"workflowtemplate/{template_name(s.profile)}", "-o", "name",
            "--server-dry-run"]
    for k, v in {**PARAMS, **BAD[case]}.items():
        argv += ["-p", f"{k}={v}"]
    dry = s.box.argo(*argv)
    name = submit_async(s, None, **BAD[case])          # asserts the CLI accepted it (what Argo v4.0.5 does)
    wf = wait_done(s, name, timeout_s=240)
    uid = wf["metadata"]["uid"]
    out = outcome(s, wf)
    assert out.phase == "Failed", f"{case}: workflow {out.phase}: {out.tasks}"
    assert out.tasks.get("params") == "Failed", out.tasks
    ran = {t: p for t, p in out.tasks.items() if t not in ("params", "cleanup") and p not in ("Omitted",)}
    assert not ran, f"{case}: tasks beyond params ran: {ran}"
    assert out.attempts.get("params") == [2], out.attempts
    assert _gpu_pods(s, uid) == [], f"{case}: GPU pods created: {_gpu_pods(s, uid)}"
    assert s.held(uid) == {}
    pod = next(p["metadata"]["name"] for p in s.pods_seen.values()
               if (p["metadata"].get("annotations") or {}).get("workflows.argoproj.io/node-name") == f"{name}.params")
    log = _log(s, pod)
    lines = [ln for ln in log.splitlines() if ln.strip()]
    print(f"{case}: dry-run rc={dry.returncode} {dry.stderr.strip()[:200]!r}; params said {lines[-1:]!r}")
    assert any(SAYS[case] in ln for ln in lines), f"{case}: params log: {log!r}"
    assert "Traceback" not in log
    record(f"bad-param {case}", backend="argo", phase=out.phase, submit_refused=False,
           server_dry_run_rc=dry.returncode, params_said=lines[-1] if lines else "", gpu_pods=0,
           seconds=out.seconds)


def _owned(s, uid: str) -> dict[str, list[str]]:
    """Each labelled StatefulSet/Service -> the uids of its owners."""
    sel = f"labelSelector={RUN_LABEL}%3D{uid}"
    owned = {}
    for path, kind in ((f"/apis/apps/v1/namespaces/{s.ns}/statefulsets", "StatefulSet"),
                       (f"/api/v1/namespaces/{s.ns}/services", "Service")):
        _, items = s.box.request("GET", f"{path}?{sel}")
        for o in items.get("items", []):
            owned[f"{kind}/{o['metadata']['name']}"] = [r["uid"] for r in o["metadata"].get("ownerReferences", [])]
    return owned


RELEASE_BOUND_S = 120     # the garbage collector's latency on a loaded machine; the measured seconds are recorded


def _delete_and_measure(s, name: str, uid: str, row: str) -> None:
    owned = _owned(s, uid)
    assert owned and all(v == [uid] for v in owned.values()), f"not owned by the workflow {uid}: {owned}"
    held = s.held(uid)
    assert held, "nothing held before the delete"
    t0 = time.monotonic()
    r = s.box.argo("delete", "-n", s.ns, name)
    assert r.returncode == 0, r.stderr
    until(lambda: s.held(uid) == {}, RELEASE_BOUND_S,
          f"run {uid} released within {RELEASE_BOUND_S} s of argo delete (held: {s.held(uid)})")
    seconds = round(time.monotonic() - t0, 1)
    until(lambda: _owned(s, uid) == {}, RELEASE_BOUND_S, "the engine's StatefulSet and Services deleted")
    gone, _ = s.box.request("GET", f"/apis/argoproj.io/v1alpha1/namespaces/{s.ns}/workflows/{name}")
    assert gone == 404
    record(row, backend="argo", released=True, seconds=seconds, held_before=held,
           how="ownerReference to the Workflow: kube-controller-manager's garbage collector")


def test_delete_mid_deploy_releases_in_seconds(box_session):
    s = box_session
    # the engine ranks never answer, so deploy waits for them: the StatefulSet and its GPU pods exist
    name = submit_async(s, {"engine": [{"exit": 1, "after_s": 600}]})
    wf = wait_running(s, name, "sglang/deploy")
    uid = wf["metadata"]["uid"]
    until(lambda: engine_held(s, uid) and any(k.startswith("Pod/") for k in s.held(uid)), 120,
          "the engine's GPU pods")
    assert workflow(s, name)["status"]["phase"] == "Running"
    _delete_and_measure(s, name, uid, "delete mid-deploy")


def test_delete_mid_perf_releases_in_seconds(box_session):
    s = box_session
    name = submit_async(s, {"sglang/perf": [{"exit": 0, "after_s": 300}]})
    wf = wait_running(s, name, "sglang/perf")
    uid = wf["metadata"]["uid"]
    assert engine_held(s, uid), s.held(uid)
    _delete_and_measure(s, name, uid, "delete mid-perf")
