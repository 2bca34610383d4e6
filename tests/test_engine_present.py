"""A gate that judges the engine first makes sure it is there (Argo's RETRY after the exit handler released it).

Through the real step runner and the Kubernetes back end against the API double: deploy records its request,
teardown releases the engine as the exit handler does, and the next gate redeploys it under the same names and
endpoint, or refuses to run when it must not (absent on its own, another run's deploy, another endpoint).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from gauntlet.contract import Check
from gauntlet.params import load_profile
from gauntlet.steps import Needs
from gauntlet.steps.backends.kubernetes import deploy as _deploy_k8s
from gauntlet.steps.gates import deploy
from gauntlet.steps.gates import teardown
from gauntlet.steps.gates.engine_present import REQUEST
from gauntlet.steps.options import GateOptions, option
from gauntlet.steps.runner import run_step

UID = "9e0d4c2a-1111-2222-3333-444455556666"
KIMI = load_profile("kimi-k3-h20")


class _Gate:
    NAME = "smoke"
    HELP = "test"
    NEEDS = Needs(engine_ranks=True, api="manage")
    ran: list[str] = []

    @dataclass(frozen=True, kw_only=True)
    class Options(GateOptions):
        engine: str | None = option(None, help="engine")
        endpoint: str = option(help="endpoint")

    @classmethod
    def run(cls, opts, out):
        cls.ran.append(str(out))
        return [Check("did", "pass", None, None, "ran")], {}


@pytest.fixture
def cluster(api_double, monkeypatch, tmp_path):
    """The API double, the run's deploy done (its request recorded); yields (double, run dir, endpoint)."""
    _Gate.ran = []
    d, eng = api_double
    monkeypatch.setenv("GAUNTLET_RUN_ID", UID)
    run = tmp_path / UID
    checks, metrics = deploy.run(deploy.Options(profile=KIMI, engine="sglang", nccl_env='{"h20-node-01": '
                                                '{"NCCL_IB_HCA": "mlx5_0"}}'), run / "sglang" / "deploy")
    assert {c.name: c.status for c in checks}["ready"] == "pass"
    yield d, run, metrics["outputs"]["endpoint"]


def _release(run: Path, exit_handler: bool = True) -> None:
    teardown.run(teardown.Options(profile=KIMI, engine="sglang", run_id=UID), run / "cleanup-teardown")
    assert _deploy_k8s.deployed(KIMI, "sglang", UID) is None
    if exit_handler:
        (run / "cleanup").mkdir()
        (run / "cleanup" / "verdict.json").write_text(json.dumps({"gate": "cleanup", "status": "pass"}))


def _gate(run: Path, endpoint: str) -> tuple[int, dict | None]:
    out = run / "sglang" / "smoke"
    code = run_step(_Gate, argparse.Namespace(profile="kimi-k3-h20", out=str(out), engine="sglang",
                                              endpoint=endpoint))
    v = out / "verdict.json"
    return code, json.loads(v.read_text()) if v.is_file() else None


def _checks(v: dict) -> dict[str, dict]:
    return {c["name"]: c for c in v["checks"]}


def test_deploy_records_what_a_redeploy_repeats(cluster):
    _, run, _ = cluster
    req = json.loads((run / "sglang" / "deploy" / REQUEST).read_text())
    assert req["engine"] == "sglang" and req["run_id"] == UID and "mlx5_0" in req["nccl_env"]


def test_a_live_engine_is_left_alone(cluster):
    _, run, endpoint = cluster
    code, v = _gate(run, endpoint)
    assert code == 0 and "engine_present" not in _checks(v) and _Gate.ran
    assert not (run / "sglang" / "smoke" / "redeploy").exists()


def test_released_by_the_exit_handler_is_redeployed_before_the_gate(cluster):
    d, run, endpoint = cluster
    _release(run)
    code, v = _gate(run, endpoint)
    c = _checks(v)
    assert code == 0 and _Gate.ran, v
    assert c["engine_present"]["status"] == "pass"
    assert c["engine_present"]["detail"].startswith(
        "engine absent at the start of smoke (released by the exit handler of an earlier attempt): redeployed, "
        "ready in ")
    # the same StatefulSet again, with the per-node NCCL env deploy had, and the rank watch saw its ranks
    assert _deploy_k8s.deployed(KIMI, "sglang", UID)["replicas"] == 2
    assert c["engine_ranks"]["status"] == "pass", c["engine_ranks"]
    manifests = (run / "sglang" / "smoke" / "redeploy" / "manifests.json").read_text()
    assert "mlx5_0" in manifests
    assert v["metrics"]["engine_redeployed"]["endpoint"] == endpoint


def test_absent_without_a_release_fails_and_the_gate_never_runs(cluster):
    _, run, endpoint = cluster
    _release(run, exit_handler=False)
    code, v = _gate(run, endpoint)
    assert code == 1 and v["status"] == "fail" and not _Gate.ran
    assert "it stopped on its own; not redeployed" in _checks(v)["engine_present"]["detail"]
    assert _deploy_k8s.deployed(KIMI, "sglang", UID) is None


def test_another_endpoint_than_the_redeployed_one_fails(cluster):
    _, run, endpoint = cluster
    _release(run)
    code, v = _gate(run, "http://other-run-engine.gauntlet.svc.cluster.local:30000")
    assert code == 1 and not _Gate.ran
    assert "not the same engine" in _checks(v)["engine_present"]["detail"]


def test_a_memoized_resubmission_is_refused_in_one_line(cluster, capsys):
    """``argo resubmit --memoized``: a new run id and run dir, deploy not re-run there, the old endpoint."""
    _, _, endpoint = cluster
    new_run = cluster[1].parent / "new-uid"
    (new_run / "sglang").mkdir(parents=True)
    code, v = _gate(new_run, endpoint)
    err = capsys.readouterr().err.strip()
    assert code == 2 and v is None and not _Gate.ran
    assert len(err.splitlines()) == 1 and "resubmit without --memoized" in err


def test_a_gate_run_by_hand_locally_is_left_alone(tmp_path, monkeypatch):
    """No deploy request, not in a cluster: an engine gauntlet did not start; nothing is deployed."""
    from gauntlet.steps.gates.engine_present import ensure
    monkeypatch.delenv("GAUNTLET_RUN_ID", raising=False)
    opts = _Gate.Options(profile=load_profile("local-cpu"), engine="vllm", endpoint="http://127.0.0.1:1")
    assert ensure("smoke", opts.the_profile, opts, tmp_path / "run" / "vllm" / "smoke") == (None, {})


def test_locally_a_released_engine_is_not_redeployed_for_a_gate_run_by_hand(tmp_path, monkeypatch):
    """The local runner has no retry; a lone gate re-run after the exit handler fails instead of leaking an engine."""
    monkeypatch.delenv("GAUNTLET_RUN_ID", raising=False)
    monkeypatch.delenv("GAUNTLET_RUN_DIR", raising=False)
    run = tmp_path / "run"
    (run / "vllm" / "deploy").mkdir(parents=True)
    (run / "vllm" / "deploy" / REQUEST).write_text(json.dumps({"engine": "vllm", "run_id": None}))
    (run / "cleanup").mkdir()
    (run / "cleanup" / "verdict.json").write_text("{}")
    _Gate.ran = []
    out = run / "vllm" / "smoke"
    code = run_step(_Gate, argparse.Namespace(profile="local-cpu", out=str(out), engine="vllm",
                                              endpoint="http://127.0.0.1:1"))
    v = json.loads((out / "verdict.json").read_text())
    assert code == 1 and not _Gate.ran
    assert "the local back end does not redeploy" in _checks(v)["engine_present"]["detail"]
