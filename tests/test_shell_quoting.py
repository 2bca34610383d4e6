"""No value reaches a shell as code: the engine's launch script, the marker check, the NCCL probe's script and
`submit --dry-run`'s commands are run here, through a kubelet's ``$(VAR)`` expansion where Kubernetes would do
one (the box's model of it, tests/box/podplan.py), with hostile values in every field that reaches them. Each
tries to ``touch`` a file; stubs on PATH record the argv the real program would have received.

The profile models refuse most of these values (names are DNS labels, env names are checked): the objects
are built from ``model_copy`` (no validation), so the quoting is proven on its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from box.podplan import ImageRun, container_argv, resolve_env

from gauntlet.params import load_profile
from gauntlet.steps.backends.kubernetes import manifests as M
from gauntlet.workflows.submit import commands

KIMI = load_profile("kimi-k3-h20")
UID = "5b1c7a0e-3d2f-4e6a-9b8c-0123456789ab"


def _hostile(marker: Path) -> str:
    """A value that runs ``touch`` wherever it lands unquoted: bare, inside '...' or inside "..."."""
    return f"x'; touch {marker}; '\"; touch {marker}; \"$(touch {marker})`touch {marker}`"


def _stubs(tmp_path: Path, *names: str) -> tuple[Path, Path]:
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls.jsonl"
    bin_dir.mkdir(exist_ok=True)
    for name in names:
        stub = bin_dir / name
        stub.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                        f"open({str(calls)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
                        f"open({str(calls) + '.ifname'!r}, 'w').write(os.environ.get('NCCL_SOCKET_IFNAME', ''))\n")
        stub.chmod(0o755)
    return bin_dir, calls


def _calls(calls: Path) -> list[list[str]]:
    return [json.loads(x) for x in calls.read_text().splitlines()] if calls.exists() else []


def _run_container(container: dict, pod: dict, bin_dir: Path, secrets: dict | None = None) -> subprocess.CompletedProcess:
    """As a kubelet: resolve the env (fieldRefs, secretKeyRefs, $(VAR)), expand the command, run it."""
    env = resolve_env(container, pod, {"PATH": f"{bin_dir}:/usr/bin:/bin"}, lambda _name: None,
                      lambda name: (secrets or {}).get(name))
    argv = container_argv(container, ImageRun(), env)
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


def _pod(name: str, node: str = "h20-node-01") -> dict:
    return {"metadata": {"name": name, "namespace": "gauntlet"}, "spec": {"nodeName": node}}


def test_engine_launch_script_runs_no_injected_value(tmp_path):
    marker = tmp_path / "pwned"
    bad = _hostile(marker)
    # the pod's node exports "$(EVIL)" before the exec: a kubelet that expanded it would run EVIL's value
    nodes = [n.model_copy(update={"rdma_ifname": "$(EVIL)" if i == 0 else bad})
             for i, n in enumerate(KIMI.hardware.nodes)]
    spec = KIMI.engines["sglang"]
    args = spec.args.model_copy(update={"extra": {**spec.args.extra, "chat-template": bad,
                                                  "json-model-override-args": "$(EVIL)"}})
    spec = spec.model_copy(update={"args": args, "env": {**spec.env, "EVIL": bad}})
    p = KIMI.model_copy(update={
        "namespace": f"ns{bad}", "hardware": KIMI.hardware.model_copy(update={"nodes": nodes}),
        "model": KIMI.model.model_copy(update={"served_name": bad, "mount_path": f"/models/{bad}"})})
    sts = M.engine_statefulset(p, "sglang", UID, "img", spec)
    pod_spec = sts["spec"]["template"]["spec"]
    bin_dir, calls = _stubs(tmp_path, "python3")
    name = f"{sts['metadata']['name']}-0"
    r = _run_container(pod_spec["containers"][0], _pod(name), bin_dir)
    assert r.returncode == 0, r.stderr
    assert not marker.exists()
    # two python3 calls, in either order: the GPU sampler the launch script starts in the background beside the
    # engine (in the container that holds the GPUs), and the engine it execs
    calls_made = _calls(calls)
    sampler = [c for c in calls_made if "telemetry" in " ".join(c)]
    (argv,) = [c for c in calls_made if c not in sampler]
    assert len(sampler) == 1 and not marker.exists()
    leader = f"{sts['metadata']['name']}-0.{sts['spec']['serviceName']}.{p.namespace}.svc.cluster.local"
    assert argv == M.rank_argvs(p, "sglang", spec, leader)[0][1:]       # python3's own argv[0] aside
    assert argv[argv.index("--json-model-override-args") + 1] == "$(EVIL)"   # not the env's value
    assert argv[argv.index("--served-model-name") + 1] == bad
    assert (tmp_path / "calls.jsonl.ifname").read_text() == "$(EVIL)"
    assert "rank 0 on h20-node-01" in r.stdout


def test_gate5_reads_back_the_argv_the_statefulset_stores():
    from gauntlet.steps.backends.kubernetes import deploy as _deploy_k8s
    spec = KIMI.engines["sglang"]
    spec = spec.model_copy(update={"args": spec.args.model_copy(update={"extra": {"chat-template": "a$$b$(X)$"}})})
    sts = M.engine_statefulset(KIMI, "sglang", UID, "img", spec)
    stored = sts["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    leader = f"{sts['metadata']['name']}-0.{sts['spec']['serviceName']}.{KIMI.namespace}.svc.cluster.local"
    assert _deploy_k8s._rank0_argv(stored) == M.rank_argvs(KIMI, "sglang", spec, leader)[0]


def test_engine_env_values_are_literal_and_secrets_are_references(tmp_path):
    spec = KIMI.engines["vllm"]
    from gauntlet.params.models import SecretRef
    spec = spec.model_copy(update={"env": {**spec.env, "A": "$(HOST_IP)", "B": "$$x",
                                           "HF_TOKEN": SecretRef(secret="hf", key="token")}})
    sts = M.engine_statefulset(KIMI, "vllm", UID, "img", spec)
    c = sts["spec"]["template"]["spec"]["containers"][0]
    env = resolve_env(c, _pod("x-0"), {}, lambda _n: None, lambda n: {"token": "t0k"} if n == "hf" else None)
    assert env["A"] == "$(HOST_IP)" and env["B"] == "$$x"       # what the local back end passes too
    assert env["VLLM_HOST_IP"] == "127.0.0.1"                     # the one value meant to be expanded
    assert env["HF_TOKEN"] == "t0k"
    (ref,) = [e for e in c["env"] if e["name"] == "HF_TOKEN"]
    assert ref == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}


def test_marker_check_runs_no_injected_value(tmp_path):
    marker = tmp_path / "pwned"
    bad = _hostile(marker)
    p = KIMI.model_copy(update={"model": KIMI.model.model_copy(update={"mount_path": str(tmp_path / bad),
                                                                          "marker": bad})})
    init = M.engine_statefulset(p, "sglang", UID, "img")["spec"]["template"]["spec"]["initContainers"][0]
    r = _run_container(init, _pod("x-0"), tmp_path)
    assert r.returncode == 1 and "the model cache is incomplete" in r.stderr
    assert not marker.exists()
    present = tmp_path / bad / bad          # the value holds '/': a path several directories deep
    present.parent.mkdir(parents=True)
    present.write_text("")
    assert _run_container(init, _pod("x-0"), tmp_path).returncode == 0
    assert not marker.exists()


@pytest.mark.parametrize("phase", ["intra", "inter"])
def test_probe_script_runs_no_injected_value(tmp_path, phase):
    marker = tmp_path / "pwned"
    bad = _hostile(marker)
    p = KIMI.model_copy(update={"namespace": f"ns{bad}"})
    job = M.probe_job(p, phase, UID, "img", {"NCCL_DEBUG": bad}, f"print({bad!r})", ["--sizes", bad])
    c = job["spec"]["template"]["spec"]["containers"][0]
    probe_py = tmp_path / "probe.py"
    c["command"][2] = c["command"][2].replace("/tmp/gauntlet_probe.py", str(probe_py))   # keep /tmp clean
    bin_dir, calls = _stubs(tmp_path, "torchrun", "all_reduce_perf")
    pod = _pod("probe-0")
    r = subprocess.run(container_argv(c, ImageRun(), env := resolve_env(
        c, pod, {"PATH": f"{bin_dir}:/usr/bin:/bin", "JOB_COMPLETION_INDEX": "0"}, lambda _n: None, lambda _n: None)),
        env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert not marker.exists()
    assert probe_py.read_text() == f"print({bad!r})"
    argv = _calls(calls)[-1]
    assert argv[-3:] == [str(probe_py), "--sizes", bad]
    if phase == "inter":
        assert argv[argv.index("--master-addr") + 1] == f"{M.probe_names(phase, UID)['service']}.ns{bad}.svc.cluster.local"
        assert argv[argv.index("--node-rank") + 1] == "0"
    else:
        assert _calls(calls)[0][:2] == ["-b", "1M"]        # nccl-tests ran first, on the intra phase only


def test_submit_dry_run_commands_run_no_injected_value(tmp_path):
    marker = tmp_path / "pwned"
    bad = _hostile(marker)
    p = KIMI.model_copy(update={"name": bad})
    out = tmp_path / f"out{bad}"
    bin_dir, calls = _stubs(tmp_path, "argo", "kubectl")
    for line in commands(p, out, f"ns{bad}"):
        r = subprocess.run(["/bin/sh", "-c", line], env={"PATH": f"{bin_dir}:/usr/bin:/bin"}, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, (line, r.stderr)
    assert not marker.exists()
    got = _calls(calls)
    assert got[-1] == ["submit", "-n", f"ns{bad}", "--from", f"workflowtemplate/gauntlet-{bad}", "-p", "engines=both",
                       "--watch"]
    assert got[0][-4:] == ["-f", str(out / f"gauntlet-{bad}.rbac.yaml"), "-f", str(out / f"gauntlet-{bad}.profile.yaml")]
    assert got[1] == ["template", "create", "-n", f"ns{bad}", str(out / f"gauntlet-{bad}.workflowtemplate.yaml")]
