"""Typed options of the gates that act on the model, the nodes and the run's resources: the command line each
builds is the one the rendered templates pass (names, defaults, required-ness, choices), and bad input is a
one-line UsageError naming the flag before anything runs."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from gauntlet.contract import UsageError
from gauntlet.params import load_profile
from gauntlet.steps.engines import ENGINES
from gauntlet.steps.gates import cleanup
from gauntlet.steps.gates import deploy
from gauntlet.steps.gates import engine_check
from gauntlet.steps.gates import janitor
from gauntlet.steps.gates import network
from gauntlet.steps.gates import nodes
from gauntlet.steps.gates import preflight
from gauntlet.steps.gates import preflight_compare
from gauntlet.steps.gates import prewarm
from gauntlet.steps.gates import teardown
from gauntlet.steps.backends import BACKENDS, backend_for, capability, require
from gauntlet.steps.backends.protocol import Access, RunnerGuard
from gauntlet.steps.options import add_options

KIMI = load_profile("kimi-k3-h20")
LOCAL = load_profile("local-cpu")

# gate -> {flag: (default, required, choices)}: the command line before the gates had typed options
FLAGS = {
    deploy: {"--engine": (None, True, None), "--backend": (None, False, {"local", "kubernetes"}),
             "--run-id": (None, False, None), "--variant": (None, False, None),
             # Gate 5's restart at a longer context, into the sequence's directory
             "--context-length": (None, False, None), "--run-dir": (None, False, None),
             # Gate 1's per-node NCCL/GLOO env (network's nccl_env output, issue 20)
             "--nccl-env": (None, False, None)},
    teardown: {"--engine": (None, True, None), "--backend": (None, False, {"local", "kubernetes"}),
               "--run-id": (None, False, None), "--variant": (None, False, None),
               # the phase of each task of its sequence before it (it runs whatever happened: issue 25 break 6)
               "--upstream": ((), False, None)},
    cleanup: {"--profile": (None, False, None), "--workflow-status": ("Unknown", False, None),
              "--failures": ("null", False, None), "--backend": (None, False, {"local", "kubernetes"}),
              "--run-id": (None, False, None), "--run-dir": (None, False, None)},
    janitor: {"--grace": ("10m", False, None), "--namespace": (None, False, None),
              "--backend": (None, False, {"local", "kubernetes"}),
              "--runs-dir": ("runs", False, None)},
    network: {"--engine": (None, False, None), "--run-id": (None, False, None), "--inputs": (None, False, None),
              "--backend": (None, False, {"kubernetes", "local"}), "--nproc": (None, False, None),
              "--sizes": (None, False, None), "--nccl-env": (None, False, None)},
    nodes: {"--node": (None, False, None), "--run-id": (None, False, None), "--root": ("/", False, None),
            "--cache-path": (None, False, None), "--no-probe": (False, False, None), "--no-api": (False, False, None)},
    prewarm: {"--src": (None, False, None), "--dst": (None, False, None), "--streams": (4, False, None),
              "--allow-unmarked-src": (False, False, None), "--delete-extras": (False, False, None)},
    preflight: {"--model-path": (None, False, None), "--pin": (None, False, None), "--discover": (False, False, None)},
    preflight_compare: {"--inputs": (None, True, None)},
    # the engine choices are the registry's (tests/test_engine_registry.py ties it to the params layer's list)
    engine_check: {"--engine": (None, True, set(ENGINES)), "--model-path": (None, False, None)},
}


@pytest.mark.parametrize("gate", list(FLAGS), ids=lambda m: m.NAME)
def test_the_command_line_is_unchanged(gate):
    p = argparse.ArgumentParser()
    add_options(gate.Options, p)
    got = {a.option_strings[0]: (a.default, a.required, set(a.choices) if a.choices else None)
           for a in p._actions if a.option_strings and a.dest != "help"}
    assert got == FLAGS[gate]
    assert not hasattr(gate, "add_arguments")


def test_flag_shapes_the_templates_rely_on():
    p = argparse.ArgumentParser()
    add_options(network.Options, p)
    assert p.parse_args(["--inputs"]).inputs == [] and p.parse_args([]).inputs is None
    p = argparse.ArgumentParser()
    add_options(preflight_compare.Options, p)
    assert p.parse_args(["--inputs", "a", "b"]).inputs == ["a", "b"]
    with pytest.raises(SystemExit):
        p.parse_args(["--inputs"])                          # nargs="+"
    p = argparse.ArgumentParser()
    add_options(cleanup.Options, p)
    assert p.parse_args(["--profile", "x.yaml"]).profile_ref == "x.yaml"


@pytest.mark.parametrize("build,flag", [
    (lambda: deploy.Options(profile=LOCAL, engine="sglang"), "--engine sglang"),
    (lambda: deploy.Options(profile=LOCAL, engine="vllm", variant="nope"), "--variant nope"),
    (lambda: teardown.Options(profile=LOCAL, engine="trtllm"), "--engine trtllm"),
    (lambda: network.Options(profile=KIMI, engine="trtllm"), "--engine trtllm"),
    (lambda: network.Options(profile=KIMI, sizes="1M"), "--sizes"),
    (lambda: engine_check.Options(profile=LOCAL, engine="sglang"), "--engine sglang"),
    (lambda: nodes.Options(profile=KIMI, node="elsewhere"), "--node elsewhere"),
    (lambda: prewarm.Options(profile=LOCAL, streams=0), "--streams"),
    (lambda: prewarm.Options(profile=KIMI.model_copy(update={"model": KIMI.model.model_copy(
        update={"source_path": None})})), "no --src"),
    (lambda: preflight_compare.Options(profile=KIMI, inputs=()), "--inputs"),
    (lambda: janitor.Options(grace="soon"), "--grace"),
])
def test_bad_input_is_refused_up_front_naming_the_flag(build, flag):
    with pytest.raises(UsageError) as exc:
        build()
    assert flag in str(exc.value) and "\n" not in str(exc.value)


def test_cleanup_never_refuses():
    opts = cleanup.Options(profile_ref="/does/not/exist.yaml", workflow_status="", failures="[broken")
    assert opts.profile is None and opts.profile_ref == "/does/not/exist.yaml"


def test_one_back_end_chooser(monkeypatch):
    assert set(BACKENDS) == {"local", "kubernetes"}
    assert backend_for(KIMI).name == "kubernetes" and backend_for(LOCAL).name == "local"
    assert backend_for(KIMI, "local").name == "local"                  # --backend wins
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("GAUNTLET_KUBE_API", raising=False)
    assert backend_for(None).name == "local"                           # cleanup without a profile
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    assert backend_for(None).name == "kubernetes"
    with pytest.raises(UsageError):
        backend_for(KIMI, "slurm")
    # what only one back end does, only that one claims: local grants no accounts, kubernetes marks no runner
    assert capability(BACKENDS["local"], Access) is None and capability(BACKENDS["kubernetes"], RunnerGuard) is None
    assert BACKENDS["local"].stop_all(Path(os.getcwd()) / "x") == []
    k8s = require(BACKENDS["kubernetes"], Access, "render")
    kinds = [d["kind"] for d in k8s.access_manifests(KIMI)]
    # one account per API role (manage, nodes, janitor, admission, none: steps/backends/kubernetes/rbac.py ROLES)
    assert kinds.count("Role") == 5 and k8s.janitor_account == "gauntlet-janitor"
    assert k8s.account(KIMI, "manage") == "gauntlet-manager"
    with pytest.raises(UsageError, match="the local back end does not do Access"):
        require(BACKENDS["local"], Access, "render")
