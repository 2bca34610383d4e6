"""Gate 1's pull (steps/gates/pull.py): the step that runs in an engine's image pinned to one pool node.

What it is for, the pull itself, is the kubelet's (no image is pulled on this machine); the rendered template's
test (tests/test_render.py) shows every node gets such a pod of every engine image before deploy. Here: what
the step checks once its pod runs, and its one-line errors.
"""

from __future__ import annotations

import pytest

from gauntlet.contract import UsageError, Verdict
from gauntlet.params import load_images, load_profile
from gauntlet.steps.gates import pull
from gauntlet.workflows.cli import main

KIMI = load_profile("kimi-k3-h20")
VLLM_REF = load_images()[KIMI.engines["vllm"].image].ref


def _step(tmp_path, monkeypatch, node_name: str | None, *args: str) -> tuple[int, Verdict]:
    if node_name is None:
        monkeypatch.delenv("NODE_NAME", raising=False)
    else:
        monkeypatch.setenv("NODE_NAME", node_name)
    rc = main(["step", "pull", "--profile", "kimi-k3-h20", "--out", str(tmp_path), *args])
    return rc, Verdict.read(tmp_path)


def test_the_pod_on_its_node_passes_naming_the_image(tmp_path, monkeypatch):
    rc, v = _step(tmp_path, monkeypatch, "h20-node-02", "--engine", "vllm", "--node", "h20-node-02")
    assert rc == 0 and [(c.name, c.status) for c in v.checks] == [("node", "pass")]
    assert v.checks[0].detail == f"h20-node-02 holds {VLLM_REF} (this pod runs in it)"
    assert v.metrics == {"engine": "vllm", "node": "h20-node-02", "image": VLLM_REF}


@pytest.mark.parametrize("running_on, detail", [
    ("h20-node-01", f"pinned to h20-node-02 but running on h20-node-01: h20-node-02 may not hold {VLLM_REF}"),
    (None, "NODE_NAME is unset"),
])
def test_a_pod_elsewhere_or_nowhere_known_fails(tmp_path, monkeypatch, running_on, detail):
    rc, v = _step(tmp_path, monkeypatch, running_on, "--engine", "vllm", "--node", "h20-node-02")
    assert rc == 1 and v.checks[0].status == "fail" and detail in v.checks[0].detail


@pytest.mark.parametrize("kw, needle", [
    ({"engine": "vllm", "node": "h20-node-09"}, "--node h20-node-09: not a node of profile kimi-k3-h20 "
                                                "(has h20-node-01, h20-node-02)"),
    ({"engine": "llamacpp", "node": "h20-node-01"}, "--engine llamacpp"),
])
def test_bad_options_are_one_line_naming_the_flag(kw, needle):
    with pytest.raises(UsageError) as exc:
        pull.Options(profile=KIMI, **kw)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_bad_options_exit_2_on_the_command_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("NODE_NAME", "h20-node-01")
    rc = main(["step", "pull", "--profile", "kimi-k3-h20", "--out", str(tmp_path), "--engine", "vllm",
               "--node", "nowhere"])
    assert rc == 2 and "--node nowhere: not a node of profile kimi-k3-h20" in capsys.readouterr().err
