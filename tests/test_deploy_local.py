"""Gate 2, local back end, against the real vLLM CPU engine through `gauntlet step deploy/teardown`.

Each test runs the step as a subprocess (as the runner and Argo do) on a private copy of
the local-cpu profile with a free port, and checks afterwards that no process of the
engine's group is left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from gauntlet.params import profile_path
from gauntlet.steps.backends.local.deploy import find_labelled, state_path
from gauntlet.steps.engines.local_vllm import free_port, group_members, port_open

from conftest import REPO, require_vllm

@pytest.fixture
def profile_file(tmp_path: Path, local_model: Path):
    require_vllm()

    def make(**engine_edits) -> tuple[Path, int]:
        doc = yaml.safe_load(profile_path("local-cpu").read_text())
        port = free_port()
        doc["model"]["mount_path"] = str(local_model)
        doc["engines"]["vllm"]["port"] = port
        for k, v in engine_edits.items():
            if k == "extra":
                doc["engines"]["vllm"]["args"]["extra"].update(v)
            else:
                doc["engines"]["vllm"][k] = v
        p = tmp_path / "profile.yaml"
        p.write_text(yaml.safe_dump(doc, sort_keys=False))
        return p, port
    return make


def step(*argv: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gauntlet.workflows.cli", "step", *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def verdict(out: Path) -> dict:
    return json.loads((out / "verdict.json").read_text())


@pytest.mark.engine
def test_deploy_outlives_the_step_then_teardown_stops_it(tmp_path: Path, profile_file) -> None:
    prof, port = profile_file()
    seq = tmp_path / "run" / "vllm"
    r = step("deploy", "--profile", str(prof), "--out", str(seq / "deploy"), "--engine", "vllm")
    v = verdict(seq / "deploy")
    try:
        assert r.returncode == 0, (v, r.stderr[-2000:])
        m = v["metrics"]
        assert (seq / "deploy" / "outputs" / "endpoint").read_text() == f"http://127.0.0.1:{port}"
        assert m["command"][0] == str(Path(sys.executable).parent / "vllm") and m["command"][1] == "serve"
        assert "--enforce-eager" in m["command"] and "--headless" not in m["command"]
        assert m["env"]["VLLM_CPU_KVCACHE_SPACE"] and m["env"]["GAUNTLET_ENGINE_DIR"] == str(seq.resolve())
        assert 1 < m["startup_s"] < 600 and m["peak_rss_bytes"] > 300 << 20
        assert "Starting vLLM" in (seq / "deploy" / "engine.log").read_text()
        state = json.loads(state_path(seq.resolve(), "vllm").read_text())
        assert state["port"] == port and group_members(state["pgid"])
        # the deploy process is gone, the engine answers for the next gates
        resp = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=120, json={
            "model": "smollm2-135m", "temperature": 0, "max_tokens": 16,
            "messages": [{"role": "user", "content": "What is 2+3? Answer with just the number."}]})
        assert "5" in resp.json()["choices"][0]["message"]["content"]
    finally:
        t = step("teardown", "--profile", str(prof), "--out", str(seq / "teardown"), "--engine", "vllm")
    tv = verdict(seq / "teardown")
    assert t.returncode == 0, tv
    assert {c["name"]: c["status"] for c in tv["checks"]} == {"engine-stopped": "pass", "port-released": "pass"}
    assert group_members(state["pgid"]) == [] and not port_open("127.0.0.1", port)
    assert find_labelled(seq) == {}


@pytest.mark.engine
def test_engine_that_dies_fails_the_gate_fast(tmp_path: Path, profile_file) -> None:
    prof, port = profile_file(extra={"no-such-engine-flag": True})
    out = tmp_path / "run" / "vllm" / "deploy"
    t0 = time.monotonic()
    r = step("deploy", "--profile", str(prof), "--out", str(out), "--engine", "vllm")
    v = verdict(out)
    assert r.returncode == 1 and v["status"] == "fail"
    ready = next(c for c in v["checks"] if c["name"] == "engine-ready")
    assert ready["observed"] == "exit code 2" and "no-such-engine-flag" in ready["detail"]
    assert time.monotonic() - t0 < 300
    assert find_labelled(out.parent) == {} and not state_path(out.parent.resolve(), "vllm").exists()


@pytest.mark.engine
def test_readiness_timeout_fails_and_leaves_nothing(tmp_path: Path, profile_file) -> None:
    prof, port = profile_file(startup_timeout_s=8)
    out = tmp_path / "run" / "vllm" / "deploy"
    r = step("deploy", "--profile", str(prof), "--out", str(out), "--engine", "vllm")
    v = verdict(out)
    assert r.returncode == 1
    ready = next(c for c in v["checks"] if c["name"] == "engine-ready")
    assert ready["status"] == "fail" and "not ready within 8s" in ready["detail"]
    assert find_labelled(out.parent) == {} and not port_open("127.0.0.1", port)


@pytest.mark.engine
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_deploy_leaves_nothing(tmp_path: Path, profile_file, sig: signal.Signals) -> None:
    prof, port = profile_file()
    seq = tmp_path / "run" / "vllm"
    proc = subprocess.Popen([sys.executable, "-m", "gauntlet.workflows.cli", "step", "deploy", "--profile", str(prof),
                             "--out", str(seq / "deploy"), "--engine", "vllm"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    state = state_path(seq.resolve(), "vllm")
    deadline = time.monotonic() + 120
    while not state.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
        time.sleep(0.2)
    pgid = json.loads(state.read_text())["pgid"]
    deadline = time.monotonic() + 60
    while len(group_members(pgid)) < 2 and time.monotonic() < deadline:   # API server + engine core
        time.sleep(0.2)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    assert group_members(pgid) == [] and find_labelled(seq) == {}
    assert not state.exists()
    assert verdict(seq / "deploy")["checks"][0]["name"] == "interrupted"
    assert os.path.getsize(seq / "deploy" / "engine.log") > 0


# ---- no engine needed: the gate fails (or refuses) before starting anything

def _profile_doc(tmp_path: Path, **model) -> tuple[Path, int]:
    doc = yaml.safe_load(profile_path("local-cpu").read_text())
    port = free_port()
    doc["engines"]["vllm"]["port"] = port
    doc["model"].update(model)
    p = tmp_path / "profile.yaml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return p, port


def test_missing_model_fails_with_the_fix(tmp_path: Path) -> None:
    prof, _ = _profile_doc(tmp_path, mount_path=str(tmp_path / "nowhere"))
    out = tmp_path / "run" / "vllm" / "deploy"
    r = step("deploy", "--profile", str(prof), "--out", str(out), "--engine", "vllm", timeout=120)
    v = verdict(out)
    assert r.returncode == 1 and v["checks"][0]["name"] == "model-dir"
    assert "gauntlet model prepare smollm2" in v["checks"][0]["detail"]


def test_foreign_listener_on_the_port_fails_the_gate(tmp_path: Path) -> None:
    import socket
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        doc = yaml.safe_load(profile_path("local-cpu").read_text())
        doc["engines"]["vllm"]["port"] = port
        doc["model"]["mount_path"] = str(model)
        prof = tmp_path / "profile.yaml"
        prof.write_text(yaml.safe_dump(doc, sort_keys=False))
        out = tmp_path / "run" / "vllm" / "deploy"
        r = step("deploy", "--profile", str(prof), "--out", str(out), "--engine", "vllm", timeout=120)
    v = verdict(out)
    assert r.returncode == 1
    port_check = next(c for c in v["checks"] if c["name"] == "port-free")
    assert port_check["status"] == "fail" and "did not start" in port_check["detail"]


def test_unknown_variant_is_a_usage_error(tmp_path: Path) -> None:
    r = step("deploy", "--profile", "local-cpu", "--out", str(tmp_path / "d"), "--engine", "vllm",
             "--variant", "nope", timeout=120)
    assert r.returncode == 2 and "--variant nope: not in profile local-cpu (has prefix-cache)" in r.stderr


def test_variant_spec_changes_one_flag() -> None:
    from gauntlet.params import load_profile
    from gauntlet.steps.gates import deploy
    prof = load_profile("local-cpu")
    spec = deploy.Options(profile=prof, engine="vllm", variant="prefix-cache").engine_spec()
    assert spec.args.prefix_cache is True
    assert spec.args.model_dump(exclude={"prefix_cache"}) == prof.engines["vllm"].args.model_dump(
        exclude={"prefix_cache"})


def test_teardown_with_nothing_running_passes(tmp_path: Path) -> None:
    out = tmp_path / "run" / "vllm" / "teardown"
    r = step("teardown", "--profile", "local-cpu", "--out", str(out), "--engine", "vllm", timeout=120)
    v = verdict(out)
    assert r.returncode == 0 and v["checks"][0]["detail"] == "no engine of this run was running"


def test_options_refuse_an_unknown_engine_or_variant_up_front() -> None:
    from gauntlet.contract import UsageError
    from gauntlet.params import load_profile
    from gauntlet.steps.gates import deploy
    from gauntlet.steps.gates import teardown
    prof = load_profile("local-cpu")
    with pytest.raises(UsageError, match=r"^--engine trtllm: .*not in profile local-cpu"):
        deploy.Options(profile=prof, engine="trtllm")
    with pytest.raises(UsageError, match=r"^--variant nope: not in profile local-cpu \(has prefix-cache\)"):
        deploy.Options(profile=prof, engine="vllm", variant="nope")
    with pytest.raises(UsageError, match=r"^--engine trtllm"):
        teardown.Options(profile=prof, engine="trtllm")


def test_the_sequences_teardown_after_a_failure_releases_then_fails(tmp_path: Path) -> None:
    """The sequence's last teardown runs whatever happened before it (workflows/graph.py): given the phase of each
    task before it, it stops the engine first and then fails naming what did not pass (the sequence's leaf: Argo
    judges the DAG by it). Before: it was Omitted after a failure and the engine waited for the exit handler."""
    from gauntlet.params import load_profile
    from gauntlet.steps.gates import teardown
    from gauntlet.steps.backends.local.deploy import LABEL_DIR, LABEL_PORT

    seq = (tmp_path / "run" / "vllm").resolve()
    seq.mkdir(parents=True)
    base = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True,
                            env={**os.environ, LABEL_DIR: str(seq), LABEL_PORT: "1"})
    try:
        deadline = time.monotonic() + 10
        while not find_labelled(seq) and time.monotonic() < deadline:
            time.sleep(0.05)
        opts = teardown.Options(profile=load_profile("local-cpu"), engine="vllm", backend="local",
                                upstream=("deploy=Succeeded", "smoke=Failed", "perf=Omitted", "confirm=Skipped"))
        checks, metrics = teardown.run(opts, seq / "teardown")
        assert base.wait(timeout=30) is not None                      # released before it judged anything
        by = {c.name: c for c in checks}
        assert by["engine-stopped"].status == "pass" and by["upstream"].status == "fail"
        assert by["upstream"].observed == {"smoke": "Failed", "perf": "Omitted"}
        assert by["upstream"].detail.startswith("before this task: smoke Failed; not run (Omitted): perf.")
        assert metrics["upstream"]["confirm"] == "Skipped"
    finally:
        if base.poll() is None:
            base.kill()
            base.wait()


def test_teardown_stops_only_the_baseline_or_only_the_variant(tmp_path: Path) -> None:
    """Gate 6 on the local back end: two labelled process groups of one sequence, the baseline's (no variant
    label) and a variant's; `--variant` stops the variant only, no `--variant` the baseline only."""
    from gauntlet.params import load_profile
    from gauntlet.steps.gates import teardown
    from gauntlet.steps.backends.local.deploy import LABEL_DIR, LABEL_PORT, LABEL_VARIANT

    seq = (tmp_path / "run" / "vllm").resolve()
    seq.mkdir(parents=True)

    def start(variant: str | None) -> subprocess.Popen:
        env = {**os.environ, LABEL_DIR: str(seq), LABEL_PORT: "1", **({LABEL_VARIANT: variant} if variant else {})}
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=env, start_new_session=True)

    base, var = start(None), start("prefix-cache")
    try:
        deadline = time.monotonic() + 10
        while len(find_labelled(seq)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        prof = load_profile("local-cpu")
        checks, _ = teardown.run(teardown.Options(profile=prof, engine="vllm", backend="local", variant="prefix-cache"),
                                 seq / "exp-teardown")
        assert checks[0].status == "pass" and var.wait(timeout=30) is not None and base.poll() is None
        checks, _ = teardown.run(teardown.Options(profile=prof, engine="vllm", backend="local"), seq / "release-baseline")
        assert checks[0].status == "pass" and base.wait(timeout=30) is not None
    finally:
        for p in (base, var):
            if p.poll() is None:
                p.kill()
                p.wait()
