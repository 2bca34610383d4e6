"""Cleanup cannot refuse: hostile arguments, a broken profile, API errors; both back ends.

The failures argument is tested in the exact form Argo v4.0.5 gives it: the controller
sets ``workflow.failures`` to ``strconv.Quote(json.Marshal(failures))``
(workflow/controller/operator.go), so nothing failed is ``"null"`` with the quotes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from k8s_double import FakeEngine, K8sDouble

from gauntlet.params import load_images, load_profile
from gauntlet.steps.backends.kubernetes import cleanup as _cleanup_k8s
from gauntlet.steps.backends.kubernetes import deploy as _deploy_k8s
from gauntlet.steps.gates import cleanup
from gauntlet.steps.gates import deploy
from gauntlet.steps.backends.local.deploy import LABEL_DIR, find_labelled
from gauntlet.steps.backends.kubernetes import manifests as M
from gauntlet.steps.runner import run_step

UID = "7c3e1a90-aaaa-bbbb-cccc-ddddeeeeffff"
KIMI = load_profile("kimi-k3-h20")

# What Argo's controller makes of one failed node: json.Marshal, then strconv.Quote.
ARGO_ONE_FAILURE = ('"[{\\"displayName\\":\\"preflight-0\\",\\"message\\":\\"Error (exit code 1)\\",'
                    '\\"templateName\\":\\"preflight-0\\",\\"phase\\":\\"Failed\\",'
                    '\\"podName\\":\\"gauntlet-kimi-k3-h20-x7k2p-preflight-0-1234567890\\",'
                    '\\"finishedAt\\":\\"2026-12-03T10:00:00Z\\"}]"')
HOSTILE_FAILURES = ["", "garbage", "{\"a\": 1}", "[1, 2]", "\"[not json\"", "\"\\q\"", "[{\"displayName\": 3",
                    "'null'", "\x00\x1b", "\"" * 5]
HOSTILE_STATUS = ["", "Running", "{{workflow.status}}", "\"Failed\" ; rm -rf /"]


# ------------------------------------------------------------------ the arguments, judged

@pytest.mark.parametrize("text", ["null", '"null"', "", "  null\n", "[]", '"[]"'])
def test_nothing_failed_in_every_form(text):
    assert cleanup.parse_failures(text) == ([], None)


def test_argo_quoted_failures_list_is_read():
    failures, problem = cleanup.parse_failures(ARGO_ONE_FAILURE)
    assert problem is None
    assert failures == [{"displayName": "preflight-0", "message": "Error (exit code 1)", "templateName": "preflight-0",
                         "phase": "Failed", "podName": "gauntlet-kimi-k3-h20-x7k2p-preflight-0-1234567890",
                         "finishedAt": "2026-12-03T10:00:00Z"}]


def test_bare_json_list_is_read_too():
    assert cleanup.parse_failures('[{"displayName": "smoke"}]') == ([{"displayName": "smoke"}], None)


def test_go_escapes_json_lacks_are_read():
    # strconv.Quote writes a non-printable rune above U+FFFF as \U........, which JSON has no escape for
    text = '"[{\\"displayName\\":\\"a\\",\\"message\\":\\"tag \\U000e0001 and \\x7f\\"}]"'
    failures, problem = cleanup.parse_failures(text)
    assert problem is None and failures[0]["message"] == "tag \U000e0001 and \x7f"


@pytest.mark.parametrize("text", HOSTILE_FAILURES)
def test_hostile_failures_never_raise_and_name_what_arrived(text):
    failures, problem = cleanup.parse_failures(text)
    if text.strip() in ("",):
        assert problem is None
        return
    assert problem and problem.startswith("--failures:"), (text, problem)
    assert all(isinstance(f, dict) for f in failures)


@pytest.mark.parametrize("text", HOSTILE_STATUS)
def test_hostile_status_is_named_not_fatal(text):
    status, problem = cleanup.parse_status(text)
    assert problem and "--workflow-status" in problem and isinstance(status, str)


def test_quoted_status_is_accepted():
    assert cleanup.parse_status('"Failed"') == ("Failed", None)
    assert cleanup.parse_status("Succeeded") == ("Succeeded", None)


# ------------------------------------------------------------------ local back end

@pytest.fixture
def labelled_engine(tmp_path):
    """A stand-in engine: its own session, labelled with the run dir as deploy labels it."""
    run_dir = (tmp_path / "run").resolve()
    (run_dir / "vllm").mkdir(parents=True)
    env = {**os.environ, LABEL_DIR: str(run_dir / "vllm"), "GAUNTLET_ENGINE_PORT": "1"}
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=env,
                            start_new_session=True)
    deadline = time.monotonic() + 10
    while proc.pid not in find_labelled(run_dir) and time.monotonic() < deadline:
        time.sleep(0.05)
    yield run_dir, proc
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def local_args(where: Path, **kw) -> argparse.Namespace:
    base = dict(profile_ref="local-cpu", out=str(where / "cleanup"), workflow_status="Failed", failures="null",
                backend=None, run_id=None, run_dir=str(where))
    return argparse.Namespace(**{**base, **kw})


@pytest.mark.parametrize("kw", [
    {"failures": "garbage{"}, {"workflow_status": ""}, {"profile_ref": "does-not-exist"},
    {"profile_ref": None, "backend": "local"}, {"failures": ARGO_ONE_FAILURE, "workflow_status": "Error"},
])
def test_local_releases_whatever_the_arguments(labelled_engine, kw):
    run_dir, proc = labelled_engine
    rc = run_step(cleanup, local_args(run_dir, **kw))
    assert proc.wait(timeout=30) is not None                       # released first
    v = json.loads((run_dir / "cleanup" / "verdict.json").read_text())
    checks = {c["name"]: c for c in v["checks"]}
    assert rc == 0, v
    assert checks["engines-stopped"]["status"] == "pass" and "0 running" in checks["engines-stopped"]["detail"]
    assert not find_labelled(run_dir)
    bad = [c for c in v["checks"] if c["name"] == "arguments"]
    if kw.get("failures") == ARGO_ONE_FAILURE:
        assert not bad and v["metrics"]["failures"][0]["displayName"] == "preflight-0"
    else:
        assert bad and bad[0]["status"] == "fail" and v["status"] == "fail"


def test_local_cleanup_cli_with_hostile_args_exits_zero(labelled_engine):
    run_dir, proc = labelled_engine
    r = subprocess.run([sys.executable, "-m", "gauntlet.workflows.cli", "step", "cleanup", "--profile", "/nonexistent.yaml",
                        "--out", str(run_dir / "cleanup"), "--workflow-status", "", "--failures", "\"[broken",
                        "--backend", "local", "--run-dir", str(run_dir)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert proc.wait(timeout=30) is not None
    assert "Traceback" not in r.stderr + r.stdout
    problems = json.loads((run_dir / "cleanup" / "verdict.json").read_text())["metrics"]["problems"]
    assert any(p.startswith("profile did not load") for p in problems), problems     # --profile read, recorded


def test_local_root_run_dir_is_recorded_not_raised(tmp_path):
    rc = run_step(cleanup, local_args(tmp_path, run_dir="/", backend="local", profile_ref=None,
                                      out=str(tmp_path / "c")))
    v = json.loads((tmp_path / "c" / "verdict.json").read_text())
    assert rc == 0 and any(c["name"] == "release-error" and "filesystem root" in c["detail"] for c in v["checks"])


# ------------------------------------------------------------------ Kubernetes back end (API double)

ARGO_POD = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "gauntlet-kimi-k3-h20-x7k2p-cleanup-1", "namespace": "gauntlet",
                         "labels": {"gauntlet.dev/run": UID, "workflows.argoproj.io/workflow": "gauntlet-kimi-k3-h20-x7k2p"}},
            "spec": {"containers": [{"name": "main", "image": "steps"}]}, "status": {"phase": "Running"}}


@pytest.fixture
def cluster(monkeypatch, tmp_path):
    with K8sDouble() as d, FakeEngine() as eng:
        monkeypatch.setenv("GAUNTLET_KUBE_API", d.url)
        monkeypatch.setenv("GAUNTLET_READY_URL", eng.url)
        monkeypatch.setenv("GAUNTLET_RUN_ID", UID)
        monkeypatch.setattr(_deploy_k8s, "POLL_S", 0.02)
        monkeypatch.setattr(_cleanup_k8s, "POLL_S", 0.02)
        monkeypatch.setattr(_cleanup_k8s, "WAIT_S", 1)
        for engine in ("sglang", "vllm"):
            a = deploy.Options(profile=KIMI, engine=engine, run_id=UID)
            _deploy_k8s.deploy(a, tmp_path / f"deploy-{engine}")
        foreign = M.engine_objects(KIMI, "vllm", "0badc0de-0000-1111-2222-333344445555", load_images()["vllm"].ref)
        for o in foreign:
            d.add(o)
        d.add(ARGO_POD)
        yield d


def ours(d: K8sDouble) -> list[tuple[str, str, str]]:
    return [k for k, o in d.objects.items() if (o["metadata"].get("labels") or {}).get("gauntlet.dev/run") == UID
            and "workflows.argoproj.io/workflow" not in o["metadata"]["labels"]]


def k8s_args(tmp_path: Path, **kw) -> argparse.Namespace:
    base = dict(profile_ref="kimi-k3-h20", out=str(tmp_path / "cleanup"), workflow_status="Failed", failures="null",
                backend="kubernetes", run_id=None, run_dir=str(tmp_path))
    return argparse.Namespace(**{**base, **kw})


def read_verdict(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "cleanup" / "verdict.json").read_text())


@pytest.mark.parametrize("kw", [
    {"failures": "[{\"displayName\": 3"}, {"workflow_status": "{{workflow.status}}"},
    {"profile_ref": "/nonexistent/profile.yaml"}, {"profile_ref": None},
    {"failures": '"null"', "workflow_status": "Succeeded"}, {"failures": ARGO_ONE_FAILURE},
])
def test_k8s_releases_whatever_the_arguments(cluster, tmp_path, kw):
    d = cluster
    assert ours(d)
    foreign = {k: json.dumps(o, sort_keys=True) for k, o in d.objects.items() if k not in ours(d)}
    rc = run_step(cleanup, k8s_args(tmp_path, **kw))
    v = read_verdict(tmp_path)
    assert rc == 0, v
    assert ours(d) == []
    # another run's objects and Argo's own step pod: untouched, byte for byte
    assert {k: json.dumps(o, sort_keys=True) for k, o in d.objects.items() if k in foreign} == foreign
    released = {c["name"]: c for c in v["checks"]}["released"]
    assert released["status"] == "pass"
    assert released["observed"]["StatefulSet/g-sglang-7c3e1a90"] == "deleted"
    assert "StatefulSet/g-vllm-7c3e1a90 deleted" in released["detail"]
    problems = [c for c in v["checks"] if c["name"] == "arguments"]
    assert bool(problems) == (kw.get("failures") not in ('"null"', ARGO_ONE_FAILURE)), problems


def test_k8s_api_error_on_one_object_releases_the_others_and_is_retried(cluster, tmp_path):
    d = cluster
    real = d.dispatch

    def flaky(method, path, q, ctype, raw):
        if "g-sglang-7c3e1a90" in path and method in ("PATCH", "DELETE") and "/statefulsets/" in path:
            return d._status(503, "ServiceUnavailable", "etcd leader changed")
        return real(method, path, q, ctype, raw)
    d.dispatch = flaky
    rc = run_step(cleanup, k8s_args(tmp_path))
    v = read_verdict(tmp_path)
    assert rc == 75, v                                                  # held after a transient error: Argo retries
    left = ours(d)
    assert ("statefulsets", "gauntlet", "g-sglang-7c3e1a90") in left
    assert not [k for k in left if "vllm" in k[2]]                      # the others were released anyway
    released = {c["name"]: c for c in v["checks"]}["released"]
    assert released["status"] == "fail" and released["observed"]["StatefulSet/g-sglang-7c3e1a90"] == 2
    assert "StatefulSet/g-sglang-7c3e1a90" in released["detail"]
    assert any(c["name"] == "api-error" and "etcd leader changed" in c["detail"] for c in v["checks"])
    # the retry, with the API healthy again, releases it and exits 0
    d.dispatch = real
    assert run_step(cleanup, k8s_args(tmp_path)) == 0 and ours(d) == []


def test_k8s_forbidden_is_held_and_exits_one(cluster, tmp_path):
    d = cluster
    real = d.dispatch
    d.dispatch = lambda m, p, q, c, r: (d._status(403, "Forbidden", "no") if m in ("PATCH", "DELETE")
                                        else real(m, p, q, c, r))
    rc = run_step(cleanup, k8s_args(tmp_path))
    assert rc == 1
    assert any(c["name"] == "api-error" and "403" in c["detail"] for c in read_verdict(tmp_path)["checks"])


def test_k8s_no_run_id_is_held_unknown(cluster, tmp_path, monkeypatch):
    monkeypatch.delenv("GAUNTLET_RUN_ID")
    rc = run_step(cleanup, k8s_args(tmp_path))
    v = read_verdict(tmp_path)
    assert rc == 1 and "no run id" in {c["name"]: c for c in v["checks"]}["released"]["detail"]


def test_k8s_api_unreachable_is_transient(tmp_path, monkeypatch):
    monkeypatch.setenv("GAUNTLET_KUBE_API", "http://127.0.0.1:9")     # nothing listens on discard
    monkeypatch.setenv("GAUNTLET_RUN_ID", UID)
    rc = run_step(cleanup, k8s_args(tmp_path))
    assert rc == 75, read_verdict(tmp_path)


def test_argo_step_pods_are_neither_waited_for_nor_touched(cluster, tmp_path, monkeypatch):
    d = cluster
    monkeypatch.setattr(_cleanup_k8s, "WAIT_S", 30)
    t0 = time.monotonic()
    assert run_step(cleanup, k8s_args(tmp_path)) == 0
    assert time.monotonic() - t0 < 15
    assert d.get("pods", "gauntlet", ARGO_POD["metadata"]["name"])["status"]["phase"] == "Running"
