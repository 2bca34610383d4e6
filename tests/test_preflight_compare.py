"""preflight-compare on real per-node preflight evidence: same model passes, a drifted node is named."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import yaml
from safetensors import safe_open
from safetensors.numpy import save_file

from gauntlet.params import load_profile
from gauntlet.contract import Verdict
from gauntlet.steps.model.marker import write_marker
from gauntlet.steps.model.synth import profile_of, synth_from_profile
from gauntlet.workflows.cli import main

KIMI = load_profile("kimi-k3-h20")
SHARD3 = "model-00003-of-00096.safetensors"


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    """Preflight evidence of four 'nodes': a, b identical; c with another config; d with a rewritten shard."""
    root = tmp_path_factory.mktemp("nodes")
    base = synth_from_profile(KIMI, root / "model-a")
    for n in "bcd":
        shutil.copytree(base, root / f"model-{n}")
    cfg = json.loads((root / "model-c" / "config.json").read_text())
    cfg["text_config"]["max_position_embeddings"] = 1048576  # same value, different bytes
    (root / "model-c" / "config.json").write_text(json.dumps(cfg, indent=1))
    write_marker(root / "model-c", revision=KIMI.model.revision)
    p = root / "model-d" / SHARD3
    with safe_open(str(p), "numpy") as f:
        keys = list(f.keys())
    raw = p.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    u8 = {k: np.zeros(header[k]["shape"], np.uint8) for k in keys if header[k]["dtype"] == "U8"}
    if u8:  # rewrite the shard with its U8 tensors only: the index now disagrees, but so does the header hash
        save_file(u8, str(p), metadata={"format": "np"})
    else:   # the same length: metadata and one tensor's name (so the index names a tensor the shard lacks)
        head = raw[8:8 + n].replace(b'"pt"', b'"np"').replace(b'weight"', b'weighx"', 1)
        p.write_bytes(raw[:8] + head + raw[8 + n:])
    write_marker(root / "model-d", revision=KIMI.model.revision)
    prof = root / "profile.yaml"
    prof.write_text(yaml.safe_dump(profile_of(KIMI, base).model_dump(mode="json")))
    for n in "abcd":
        main(["step", "preflight", "--profile", str(prof), "--model-path", str(root / f"model-{n}"),
              "--out", str(root / f"preflight-{n}")])
    return root


def _compare(root, tmp_path, *names):
    out = tmp_path / "cmp"
    rc = main(["step", "preflight-compare", "--profile", "kimi-k3-h20", "--out", str(out),
               "--inputs", *(str(root / f"preflight-{n}") for n in names)])
    return rc, Verdict.read(out)


def test_same_model_on_both_nodes_passes(nodes, tmp_path):
    rc, v = _compare(nodes, tmp_path, "a", "b")
    assert rc == 0, [c.detail for c in v.checks if c.status != "pass"]
    assert v.metrics["outputs"]["fingerprint"] == Verdict.read(nodes / "preflight-a").metrics["fingerprint"]["sha256"]


def test_node_with_other_config_is_named_with_the_component(nodes, tmp_path):
    rc, v = _compare(nodes, tmp_path, "a", "b", "c")
    c = {c.name: c for c in v.checks}["fingerprints-match"]
    assert rc == 1 and c.status == "fail"
    assert "preflight-c" in c.detail and "config differs (config.json)" in c.detail
    assert "preflight-a" not in c.detail.split(" differs from ")[0]
    assert v.metrics["differing"] == ["preflight-c"]


def test_node_with_other_shard_names_the_shard(nodes, tmp_path):
    rc, v = _compare(nodes, tmp_path, "a", "b", "d")
    c = {c.name: c for c in v.checks}["fingerprints-match"]
    assert rc == 1 and "preflight-d" in c.detail and f"shard {SHARD3}" in c.detail
    # d's own preflight failed too (its index no longer matches the shard): reported, not hidden
    assert {c.name: c.status for c in v.checks}["preflight-verdicts"] == "fail"


def test_two_nodes_expected_by_the_profile(nodes, tmp_path):
    rc, v = _compare(nodes, tmp_path, "a")
    assert rc == 1 and {c.name: c.status for c in v.checks}["node-count"] == "fail"


def test_missing_or_broken_evidence_is_a_failed_check(nodes, tmp_path):
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "verdict.json").write_text("{")
    out = tmp_path / "cmp"
    rc = main(["step", "preflight-compare", "--profile", "kimi-k3-h20", "--out", str(out),
               "--inputs", str(nodes / "preflight-a"), str(tmp_path / "broken"), str(tmp_path / "absent")])
    v = Verdict.read(out)
    ev = {c.name: c for c in v.checks}["evidence"]
    assert rc == 1 and ev.status == "fail" and "invalid JSON" in ev.detail and "absent/verdict.json is missing" in ev.detail


def test_graph_fans_preflight_out_per_node_and_joins_with_compare():
    from gauntlet.steps import needs_of
    from gauntlet.workflows.graph import Need, build_graph
    main_dag = build_graph(KIMI, "argo").main
    pre = [t for t in main_dag.tasks if t.step == "preflight"]
    assert [t.node for t in pre] == [n.name for n in KIMI.hardware.nodes]
    assert not needs_of("preflight").node_gpus and needs_of("nodes").node_gpus   # Gate 0 never asks for a GPU
    cmp = main_dag.task("preflight-compare")
    assert cmp.depends == tuple(Need(t.name, ("Succeeded",)) for t in pre)
    assert [a.rsplit("/", 1)[-1] for a in cmp.args[1:]] == [t.name for t in pre]
    local = build_graph(load_profile("local-cpu"), "local").main
    # first the params step (every workflow parameter checked), then the local prewarm, which always runs
    assert local.tasks[0].name == "params" and local.tasks[1].name == "prewarm" and local.tasks[1].when is None
    assert local.task("prewarm").depends == (Need("params", ("Succeeded",)),)
    assert local.task("preflight").depends == (Need("prewarm", ("Succeeded",)),)
    # the argo graph's prewarm is per node and optional (the `prewarm` parameter); the local one always runs
    assert [t.name for t in main_dag.tasks if t.step == "prewarm"] == [f"prewarm-{i}" for i in range(len(pre))]
