"""The process kubelet's pure plans (box.podplan), its namespace starter and its stand-ins.

End-to-end runs against the real API server and Argo controller are the box scenarios
(marker ``argo``); these are the rules those runs rely on, one table at a time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from box import podplan as P

BOX = Path(__file__).resolve().parent / "box"


def pod(name: str = "wf-step-123", ns: str = "gauntlet", labels=None, annotations=None, **spec) -> dict:
    return {"metadata": {"name": name, "namespace": ns, "uid": "u-1", "labels": labels or {},
                         "annotations": annotations or {}},
            "spec": {"containers": [{"name": "main", "image": "img"}], **spec}}


# ---- images and commands ----

def test_find_image_exact_then_longest_prefix_then_predicate():
    a, b, c, d = (P.ImageRun(entrypoint=(x,)) for x in "abcd")
    table = {"reg/x@sha256:1": a, "reg/*": b, "reg/x*": c, (lambda r: r.startswith("other/")): d}
    assert P.find_image(table, "reg/x@sha256:1") is a
    assert P.find_image(table, "reg/x:2") is c
    assert P.find_image(table, "reg/y") is b
    assert P.find_image(table, "other/z") is d
    assert P.find_image(table, "nowhere/z") is None


@pytest.mark.parametrize("command, args, argv", [
    (None, None, ["entry", "cmd1"]),                  # the image's ENTRYPOINT + CMD
    (None, ["a1"], ["entry", "a1"]),                  # args replace CMD
    (None, [], ["entry"]),                            # empty args are still args
    (["c0"], None, ["c0"]),                           # command drops the image's CMD too
    (["c0"], ["a1", "$(X)"], ["c0", "a1", "x-value"]),
])
def test_command_and_args_rules(command, args, argv):
    image = P.ImageRun(entrypoint=("entry",), cmd=("cmd1",))
    c = {"name": "main", **({"command": command} if command is not None else {}),
         **({"args": args} if args is not None else {})}
    assert P.container_argv(c, image, {"X": "x-value"}) == argv


@pytest.mark.parametrize("text, out", [
    ("$(A)", "1"), ("x$(A)y$(B)", "x1y2"), ("$(MISSING)", "$(MISSING)"), ("$$(A)", "$(A)"), ("$$", "$"),
    ("cost $5", "cost $5"), ("$(A", "$(A"), ("$", "$"),
])
def test_var_expansion_as_kubernetes_does(text, out):
    assert P.expand_refs(text, {"A": "1", "B": "2"}) == out


# ---- environment ----

def _env_pod():
    return pod(labels={"app": "x", "gauntlet.dev/run": "r1"}, annotations={"note": 'say "hi"'},
               nodeName="node-a", serviceAccountName="gauntlet")


def test_env_values_field_refs_and_expansion():
    c = {"name": "main", "env": [
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
        {"name": "RUN", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['gauntlet.dev/run']"}}},
        {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
        {"name": "UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        {"name": "VLLM_HOST_IP", "value": "$(IP)"},
        {"name": "PLAIN", "value": "v"},
    ]}
    env = P.resolve_env(c, _env_pod(), {"PATH": "/bin"}, lambda n: None, lambda n: None)
    assert env == {"PATH": "/bin", "POD": "wf-step-123", "NODE": "node-a", "IP": "127.0.0.1", "RUN": "r1",
                   "SA": "gauntlet", "UID": "u-1", "VLLM_HOST_IP": "127.0.0.1", "PLAIN": "v"}


def test_env_from_config_maps_and_secrets_honours_optional():
    cms = {"cm": {"K": "cv"}}
    secrets = {"s": {"PASS": "pw"}}
    c = {"name": "main",
         "envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "CM_"}, {"secretRef": {"name": "s"}},
                     {"configMapRef": {"name": "gone", "optional": True}}],
         "env": [{"name": "ONE", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "K"}}},
                 {"name": "NOPE", "valueFrom": {"secretKeyRef": {"name": "s", "key": "x", "optional": True}}}]}
    env = P.resolve_env(c, _env_pod(), {}, cms.get, secrets.get)
    assert env == {"CM_K": "cv", "PASS": "pw", "ONE": "cv"}


@pytest.mark.parametrize("entry, message", [
    ({"envFrom": [{"secretRef": {"name": "gone"}}]}, 'secret "gone" not found'),
    ({"env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "nokey"}}}]},
     "couldn't find key nokey in configmap cm"),
    ({"env": [{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "spec.nonsense"}}}]}, "unsupported fieldPath"),
])
def test_env_missing_required_reference_is_a_config_error(entry, message):
    with pytest.raises(P.ConfigError, match=message):
        P.resolve_env({"name": "main", **entry}, _env_pod(), {}, {"cm": {"K": "v"}}.get, lambda n: None)


def test_downward_api_files_use_the_kubelets_format():
    files = P.downward_files([{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                              {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}},
                              {"path": "ns", "fieldRef": {"fieldPath": "metadata.namespace"}}], _env_pod())
    assert files == {"labels": 'app="x"\ngauntlet.dev/run="r1"', "annotations": 'note="say \\"hi\\""',
                     "ns": "gauntlet"}


def test_go_quote_escapes_like_strconv_quote():
    assert P.go_quote('a"b\\c\nd\te') == '"a\\"b\\\\c\\nd\\te"'
    assert P.go_quote("é") == '"é"'
    assert P.go_quote("\x01") == '"\\x01"'


# ---- mounts and hosts ----

def test_mount_plan_orders_parents_first_and_resolves_sub_paths():
    c = {"name": "wait", "volumeMounts": [
        {"name": "runs", "mountPath": "/mainctrfs/runs"},
        {"name": "tmp", "mountPath": "/tmp", "subPath": "1"},
        {"name": "var-run-argo", "mountPath": "/var/run/argo"},
        {"name": "model", "mountPath": "/models/k3", "readOnly": True},
    ]}
    dirs = {"runs": "/w/pvc/runs", "tmp": "/w/pods/p/volumes/tmp", "var-run-argo": "/w/v", "model": "/data/k3"}
    plan = P.mount_plan(c, dirs, [P.Mount("/w/hosts", "/etc/hosts")])
    assert [m.target for m in plan] == ["/tmp", "/etc/hosts", "/mainctrfs/runs", "/models/k3", "/var/run/argo"]
    assert P.Mount("/w/pods/p/volumes/tmp/1", "/tmp") in plan
    assert P.Mount("/data/k3", "/models/k3", True) in plan
    with pytest.raises(P.ConfigError, match="no such volume"):
        P.mount_plan({"volumeMounts": [{"name": "x", "mountPath": "/x"}]}, {})


def test_nested_mount_point_is_created_inside_the_parent_mounts_source():
    mounts = [P.Mount("/src/data", "/data"), P.Mount("/src/cache", "/data/cache"), P.Mount("/s/o", "/other")]
    assert P.mountpoint_on_host(mounts, 0) == "/data"
    assert P.mountpoint_on_host(mounts, 1) == "/src/data/cache"
    assert P.mountpoint_on_host(mounts, 2) == "/other"


def test_hosts_maps_services_and_statefulset_pods_to_loopback():
    svc = {"metadata": {"name": "g-sglang-1234", "namespace": "gauntlet"}}
    sts = {"metadata": {"name": "g-sglang-1234", "namespace": "gauntlet"},
           "spec": {"serviceName": "g-sglang-1234-hl", "replicas": 2}}
    job_pod = {"metadata": {"name": "probe-0-x", "namespace": "gauntlet"},
               "spec": {"hostname": "probe-0", "subdomain": "rdzv"}}
    text = P.hosts_text([svc], [sts], [job_pod], "me")
    lines = text.splitlines()
    assert "127.0.0.1\tlocalhost me" in lines
    assert ("127.0.0.1\tg-sglang-1234.gauntlet.svc.cluster.local g-sglang-1234.gauntlet.svc "
            "g-sglang-1234.gauntlet g-sglang-1234") in lines
    assert any(ln.startswith("127.0.0.1\tg-sglang-1234-1.g-sglang-1234-hl.gauntlet.svc.cluster.local")
               for ln in lines)
    assert any(ln.startswith("127.0.0.1\tprobe-0.rdzv.gauntlet.svc.cluster.local") for ln in lines)


# ---- stand-ins ----

def argo_pod(step: str, node: str, wf: str = "g-abc") -> dict:
    return pod(name=f"{wf}-{step}-1234", labels={"gauntlet.dev/step": step, "workflows.argoproj.io/workflow": wf},
               annotations={"workflows.argoproj.io/node-name": node})


def test_attempts_of_one_task_share_a_key_and_tasks_do_not():
    first, retry = argo_pod("nodes", "g-abc.nodes-0(0)"), argo_pod("nodes", "g-abc.nodes-0(1)")
    other = argo_pod("nodes", "g-abc.nodes-1(0)")
    assert P.standin_key(first) == P.standin_key(retry) == "gauntlet/g-abc/g-abc.nodes-0"
    assert P.standin_key(other) != P.standin_key(first)


def test_stand_in_table_matches_the_task_name_before_the_step_label():
    table = {"nodes": [{"exit": 0}], "nodes-1": [{"exit": 1}]}
    assert P.standin_behaviours(table, argo_pod("nodes", "g-abc.nodes-0(0)")) == ("nodes", [{"exit": 0}])
    assert P.standin_behaviours(table, argo_pod("nodes", "g-abc.nodes-1(0)")) == ("nodes", [{"exit": 1}])
    assert P.standin_behaviours(table, argo_pod("preflight", "g-abc.preflight-0(0)")) is None


def test_each_attempt_gets_its_behaviour_and_the_last_repeats():
    bs = [{"exit": 75, "after_s": 0}, {"exit": 0}]
    assert [P.choose_behaviour(bs, n)["exit"] for n in range(4)] == [75, 0, 0, 0]
    assert P.choose_behaviour([], 3) == {}


def test_stand_in_replaces_only_the_command_after_the_emissarys_separator():
    argv = ["/var/run/argo/argoexec", "emissary", "--loglevel", "info", "--", "gauntlet", "step", "smoke",
            "--profile", "/p.yaml", "--out", "/runs/u/sglang/smoke"]
    out = P.standin_argv(argv, "/py", "/box/standin.py", "smoke", {"exit": 1})
    assert out[:5] == argv[:5]
    assert out[5:] == ["/py", "/box/standin.py", "step", "--step", "smoke", "--out", "/runs/u/sglang/smoke",
                       "--behaviour", '{"exit": 1}']


def test_engine_stand_in_takes_port_rank_and_served_name_from_the_pod():
    c = {"name": "engine", "command": ["/bin/sh", "-c", "exec python -m sglang.launch_server "
                                       "--served-model-name kimi-k3 --port 30000"],
         "ports": [{"name": "dist", "containerPort": 20000}, {"name": "http", "containerPort": 30000}]}
    argv = P.engine_argv(pod(name="g-sglang-ab12-1"), c, "/py", "/s.py")
    assert argv == ["/py", "/s.py", "engine", "--port", "30000", "--rank", "1", "--served-name", "kimi-k3"]


# ---- status ----

def run(name, state, code=None, init=False, restarts=0):
    c = P.ContainerRun(name, "img", init=init, state=state, exit_code=code, restart_count=restarts,
                       started_at="t0" if state != "waiting" else None)
    if state == "terminated":
        c.reason, c.finished_at = ("Completed" if code == 0 else "Error"), "t1"
    return c


@pytest.mark.parametrize("policy, inits, mains, phase", [
    ("Never", [run("init", "running", init=True)], [run("main", "waiting")], "Pending"),
    ("Never", [run("init", "terminated", 1, init=True)], [run("main", "waiting")], "Failed"),
    ("Never", [], [run("wait", "running"), run("main", "terminated", 0)], "Running"),
    ("Never", [], [run("wait", "terminated", 0), run("main", "terminated", 0)], "Succeeded"),
    ("Never", [], [run("wait", "terminated", 0), run("main", "terminated", 1)], "Failed"),
    ("OnFailure", [], [run("main", "terminated", 1)], "Running"),
    ("OnFailure", [], [run("main", "terminated", 0)], "Succeeded"),
    ("Always", [], [run("engine", "terminated", 0)], "Running"),
    ("Always", [], [run("engine", "waiting", restarts=2)], "Running"),     # CrashLoopBackOff is Running
])
def test_pod_phase(policy, inits, mains, phase):
    assert P.pod_phase(policy, inits, mains) == phase


def test_status_reports_ips_conditions_and_container_states():
    main = run("main", "terminated", 1)
    main.message = "verdict: fail"
    st = P.pod_status("Failed", [run("init", "terminated", 0, init=True)], [main, run("wait", "terminated", 0)],
                      "t0", "t2")
    assert st["phase"] == "Failed" and st["podIP"] == st["hostIP"] == "127.0.0.1"
    conds = {c["type"]: (c["status"], c.get("reason")) for c in st["conditions"]}
    assert conds["Initialized"] == ("True", None) and conds["PodScheduled"] == ("True", None)
    assert conds["Ready"] == ("False", "PodCompleted")
    term = st["containerStatuses"][0]["state"]["terminated"]
    assert term == {"exitCode": 1, "reason": "Error", "startedAt": "t0", "finishedAt": "t1", "containerID": "",
                    "message": "verdict: fail"}
    assert st["initContainerStatuses"][0]["state"]["terminated"]["reason"] == "Completed"


def test_waiting_and_running_states_and_the_previous_instance():
    c = P.ContainerRun("engine", "reg/e@sha256:1", state="waiting", reason="CrashLoopBackOff", message="back-off 2s",
                       restart_count=1, last={"exitCode": 3, "reason": "Error"})
    s = P.container_status(c)
    assert s["state"] == {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 2s"}}
    assert s["lastState"] == {"terminated": {"exitCode": 3, "reason": "Error"}}
    assert s["restartCount"] == 1 and s["ready"] is False and s["imageID"] == "reg/e@sha256:1"
    c.state, c.started_at = "running", "t3"
    assert P.container_status(c)["state"] == {"running": {"startedAt": "t3"}} and P.container_status(c)["ready"]


# ---- the processes ----

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mount namespaces need root")


@needs_root
def test_nsexec_binds_read_only_in_its_own_namespaces_and_reports_the_exit_code(tmp_path):
    src, target = tmp_path / "src", tmp_path / "target"
    src.mkdir()
    target.mkdir()
    (src / "f").write_text("hello")
    script = "cat $T/f; echo; echo pid=$$; touch $T/new 2>/dev/null || echo read-only; exit 7"
    plan = {"argv": ["sh", "-c", script], "env": {"PATH": "/usr/bin:/bin", "T": str(target)}, "cwd": "/",
            "mounts": [[str(src), str(target), True]]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    r = subprocess.run([sys.executable, str(BOX / "nsexec.py"), str(tmp_path / "plan.json")],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 7
    assert r.stdout.split() == ["hello", "pid=1", "read-only"]
    assert not list(target.iterdir())          # the bind mount never reached the host's view


def test_stand_in_step_writes_the_evidence_contract(tmp_path):
    behaviour = {"exit": 75, "status": "error", "outputs": {"endpoint": "http://e:1"}}
    r = subprocess.run([sys.executable, str(BOX / "standin.py"), "step", "--step", "nodes", "--out", str(tmp_path),
                        "--behaviour", json.dumps(behaviour)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 75, r.stderr
    verdict = json.loads((tmp_path / "verdict.json").read_text())
    assert verdict["gate"] == "nodes" and verdict["status"] == "error"
    assert (tmp_path / "outputs" / "verdict").read_text() == "error"
    assert (tmp_path / "outputs" / "endpoint").read_text() == "http://e:1"


def test_task_path_nests_like_the_ui_and_drops_the_attempt():
    assert P.task_path(argo_pod("smoke", "g-abc.sglang.smoke(1)")) == "sglang/smoke"
    assert P.task_path(argo_pod("cleanup", "g-abc.onExit")) == "onExit"
    table = {"sglang/smoke": [{"exit": 75}], "smoke": [{"exit": 0}]}
    assert P.standin_behaviours(table, argo_pod("smoke", "g-abc.sglang.smoke(0)")) == ("smoke", [{"exit": 75}])
    assert P.standin_behaviours(table, argo_pod("smoke", "g-abc.vllm.smoke(0)")) == ("smoke", [{"exit": 0}])


def test_kubelet_endpoint_serves_logs_and_runs_exec_over_tls(tmp_path):
    import ssl
    import urllib.error
    import urllib.request

    from box.kubeletserver import KubeletServer, serving_cert

    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
                    "ca.crt", "-days", "1", "-subj", "/CN=test-ca"], cwd=tmp_path, check=True, capture_output=True)
    cert, key = serving_cert(tmp_path / "ca.crt", tmp_path / "ca.key", tmp_path / "kubelet")
    ran = []
    logs = {("ns", "p", "main", False): "one\ntwo\nthree\n", ("ns", "p", "main", True): "before\n"}
    server = KubeletServer(cert, key, logs=lambda *a: logs.get(a),
                           exec_=lambda ns, pod, c, argv: ran.append((ns, pod, c, argv)) or 0).start()
    ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))

    def get(path: str, method: str = "GET") -> tuple[int, str]:
        req = urllib.request.Request(f"https://127.0.0.1:{server.port}{path}", method=method)
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    try:
        assert get("/containerLogs/ns/p/main") == (200, "one\ntwo\nthree\n")
        assert get("/containerLogs/ns/p/main?tailLines=1") == (200, "three\n")
        assert get("/containerLogs/ns/p/main?previous=true") == (200, "before\n")
        assert get("/containerLogs/ns/gone/main")[0] == 404
        code, text = get("/exec/ns/p/main?command=%2Fvar%2Frun%2Fargo%2Fargoexec&command=kill&command=15&command=1"
                         "&output=1&error=1", "POST")
        assert code == 400 and "exit 0" in text
        assert ran == [("ns", "p", "main", ["/var/run/argo/argoexec", "kill", "15", "1"])]
    finally:
        server.stop()


# ---- on the box (marker argo): the real Argo controller and argoexec through this kubelet ----

@pytest.mark.argo
def test_real_argoexec_reports_outputs_retries_and_logs_through_the_kubelet(box_session):
    """A plain container's output parameter set by the real argoexec; a stand-in exiting 75 then passing,
    retried by Argo; the step's log read through the API server's pods/log from the kubelet endpoint."""
    import time

    from box.scenarios import GENERAL_NODE
    from gauntlet.params import load_images

    s, box = box_session, box_session.box
    step_image = load_images()["steps"].ref
    node = GENERAL_NODE                # untainted: the pool's nodes carry the profile's taints
    s.kubelet.set_standins({"kubelet-probe": [{"exit": 75}, {"exit": 0, "outputs": {"answer": "42"}}]})
    name = f"kubelet-probe-{int(time.time())}"
    wf = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "metadata": {"name": name, "namespace": s.ns},
          "spec": {"entrypoint": "main", "serviceAccountName": s.profile.service_account,
                   "nodeSelector": {"kubernetes.io/hostname": node}, "templates": [
                       {"name": "main", "dag": {"tasks": [{"name": "hello", "template": "hello"},
                                                          {"name": "probe", "template": "probe",
                                                           "depends": "hello.Succeeded"}]}},
                       {"name": "hello", "container": {"image": step_image,
                                                       "command": ["sh", "-c", "echo hi > /tmp/x; echo said hi"]},
                        "outputs": {"parameters": [{"name": "x", "valueFrom": {"path": "/tmp/x"}}]}},
                       {"name": "probe", "metadata": {"labels": {"gauntlet.dev/step": "kubelet-probe"}},
                        "retryStrategy": {"limit": 2, "retryPolicy": "Always", "backoff": {"duration": "1s"}},
                        "container": {"image": step_image, "command": ["gauntlet"],
                                      "args": ["step", "kubelet-probe", "--out", "/tmp/probe"]},
                        "outputs": {"parameters": [{"name": "answer",
                                                    "valueFrom": {"path": "/tmp/probe/outputs/answer"}}]}}]}}
    status, out = box.request("POST", f"/apis/argoproj.io/v1alpha1/namespaces/{s.ns}/workflows", wf)
    assert status == 201, out
    deadline = time.monotonic() + 170
    while time.monotonic() < deadline:
        _, got = box.request("GET", f"/apis/argoproj.io/v1alpha1/namespaces/{s.ns}/workflows/{name}")
        st = got.get("status") or {}
        if st.get("phase") in ("Succeeded", "Failed", "Error") and st.get("finishedAt"):
            break
        time.sleep(1)
    nodes = {n["displayName"]: n for n in (st.get("nodes") or {}).values()}
    assert st.get("phase") == "Succeeded", {k: (n["phase"], n.get("message")) for k, n in nodes.items()}

    def params(n: dict) -> dict:
        return {p["name"]: p.get("value") for p in (n.get("outputs") or {}).get("parameters", [])}
    assert params(nodes["hello"]) == {"x": "hi"}
    assert [(nodes[f"probe({i})"]["outputs"] or {}).get("exitCode") for i in (0, 1)] == ["75", "0"]
    assert params(nodes["probe"]) == {"answer": "42"}
    pod = next(p for p in s.kubelet.pods.values() if p.name.startswith(f"{name}-hello-"))
    code, log = box.request("GET", f"/api/v1/namespaces/{s.ns}/pods/{pod.name}/log?container=main")
    assert code == 200 and "said hi" in str(log)
    assert s.kubelet.errors == []


def test_paths_under_tmp_stay_visible_under_any_cover_of_tmp(tmp_path):
    """A box cache or checkout under /tmp (a CI clone, GAUNTLET_BOX_CACHE=/tmp/...) must be re-bound inside a
    container whose /tmp is covered, by the private /tmp or by a volume (Argo's wait container mounts its
    emptyDir there): without it the wait container found no /bin/argoexec."""
    assert str(tmp_path.resolve()).startswith("/tmp/")
    cache, app = tmp_path / "cache" / "bin", tmp_path / "cache" / "app"
    cache.mkdir(parents=True)
    app.mkdir()
    other = tmp_path / "checkout"
    other.mkdir()
    got = P.keep_under_tmp([str(cache), str(app), str(tmp_path / "cache"), str(other), "/usr/bin",
                            str(tmp_path / "missing")], {"/tmp"})
    assert [(m.source, m.target) for m in got] == [(str(tmp_path / "cache"),) * 2, (str(other),) * 2]
    # where a volume already sits at that path, the volume wins
    assert P.keep_under_tmp([str(other)], {str(other)}) == []
    # the plan mounts them after what covers /tmp, so they are seen through it
    plan = P.mount_plan({"volumeMounts": [{"name": "tmp-dir-argo", "mountPath": "/tmp"}]},
                        {"tmp-dir-argo": str(tmp_path / "emptydir")}, got)
    assert [m.target for m in plan][0] == "/tmp" and {m.target for m in plan[1:]} == {m.target for m in got}
