"""Gate 0: a DSpark variant planned without a draft path finds its draft in the checkpoint, as SGLang 0.5.23 would.

SGLang's own decision (``_handle_dspark``, sglang/srt/arg_groups/speculative_hook.py) is two functions: the draft is
bundled when ``dspark_config.checkpoint_bundles_dspark_draft(hf_config)`` holds, else it is the checkpoint's
``dspark/`` subfolder when ``_target_checkpoint_dspark_subfolder(model_path, revision, cache_dir)`` finds it,
else the engine refuses to start. Both are called here on the same configs and directories as ours.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gauntlet.params import load_profile
from gauntlet.params.models import Variant
from gauntlet.steps.engines import engine
from gauntlet.steps.model.draft_checks import draft_checks, find_draft
from conftest import require_sglang

KIMI = load_profile("kimi-k3-h20")
RULE = engine("sglang").checkpoint_draft

# (name, config.json, files: relative path -> "file" | "dir" | "link" (to a file) | "dangling")
CASES = [
    ("nothing", {"model_type": "kimi_k3"}, {}),
    ("block size key", {"model_type": "kimi_k3", "dspark_block_size": 7}, {}),
    ("target layers key", {"dspark_target_layer_ids": [1, 2, 3]}, {}),
    ("a key set to null", {"dspark_markov_rank": None}, {}),
    ("a key only in text_config", {"text_config": {"dspark_block_size": 7}}, {}),
    ("dspark/ with its config", {}, {"dspark/config.json": "file"}),
    ("dspark/ without a config", {}, {"dspark/model.safetensors": "file"}),
    ("dspark/config.json a directory", {}, {"dspark/config.json": "dir"}),
    ("dspark/config.json a link to a file", {}, {"dspark/config.json": "link"}),
    ("dspark/config.json a dangling link", {}, {"dspark/config.json": "dangling"}),
]


@pytest.fixture(scope="module")
def sglang_hook():
    """SGLang 0.5.23's two functions (.ci/install-sglang.sh installs it; under CI its absence fails)."""
    require_sglang()
    from sglang.srt.arg_groups.speculative_hook import _target_checkpoint_dspark_subfolder
    from sglang.srt.speculative.dspark_components.dspark_config import checkpoint_bundles_dspark_draft
    return checkpoint_bundles_dspark_draft, _target_checkpoint_dspark_subfolder


def _model_dir(root: Path, config: dict, files: dict[str, str]) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(config))
    (root / "elsewhere.json").write_text("{}")
    for rel, kind in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if kind == "file":
            p.write_text("{}")
        elif kind == "dir":
            p.mkdir()
        elif kind == "link":
            p.symlink_to(root / "elsewhere.json")
        else:
            p.symlink_to(root / "gone.json")
    return root


@pytest.mark.parametrize("name,config,files", CASES, ids=[c[0] for c in CASES])
def test_the_draft_is_found_exactly_where_sglang_finds_it(tmp_path, sglang_hook, name, config, files):
    bundled, subfolder = sglang_hook
    d = _model_dir(tmp_path / "m", config, files)
    theirs = bundled(config) or subfolder(str(d), None, None) is not None
    assert RULE is not None
    ours, detail = find_draft(RULE, config, lambda rel: (d / rel).is_file())
    assert ours == theirs, detail


def test_our_rule_names_sglangs_keys_folder_and_refusal(sglang_hook):
    """The keys, the folder and the refusal are SGLang's own: the tuple of keys its
    ``checkpoint_bundles_dspark_draft`` tests (a constant of its code), its ``_DSPARK_DRAFT_SUBFOLDER``, and the
    message ``_handle_dspark`` raises; an SGLang that adds a key or renames the folder fails here."""
    import inspect

    from sglang.srt.arg_groups import speculative_hook

    bundled, _ = sglang_hook
    keys = [c for c in bundled.__code__.co_consts if isinstance(c, tuple) and all(isinstance(k, str) for k in c)]
    assert RULE is not None and keys == [RULE.config_keys]
    assert all(bundled({k: 0}) for k in RULE.config_keys) and not bundled({"dspark": 1})
    assert RULE.subfolder_config == f"{speculative_hook._DSPARK_DRAFT_SUBFOLDER}/config.json"
    src = " ".join(inspect.getsource(speculative_hook._handle_dspark).split())
    assert RULE.refusal.replace('" "', "") in src.replace('" "', "")
    assert RULE.methods == ("DSPARK",) and '"DSPARK"' in inspect.getsource(speculative_hook)


def _profile(variant_change: dict, **kw):
    v = Variant(name="dspark", engine="sglang", change=variant_change, **kw)
    return KIMI.model_copy(update={"experiments": [v]})


DSPARK = {"speculative": {"method": "dspark", "num_speculative_tokens": 7}}


def test_a_checkpoint_without_the_draft_fails_naming_the_fix(tmp_path):
    d = _model_dir(tmp_path / "m", {"model_type": "kimi_k3"}, {})
    (c,) = draft_checks(_profile(DSPARK), {"model_type": "kimi_k3"}, lambda rel: (d / rel).is_file())
    assert c.name == "variant-draft/dspark" and c.status == "fail"
    assert "requires setting --speculative-draft-model-path" in c.detail and "speculative.draft_model" in c.detail


def test_no_check_where_the_draft_is_given_or_the_method_takes_none_from_the_checkpoint():
    given = {"speculative": {"method": "dspark", "num_speculative_tokens": 7, "draft_model": "/models/draft"}}
    assert draft_checks(_profile(given), {}, lambda rel: False) == []
    assert draft_checks(_profile({"speculative": {"method": "eagle", "num_speculative_tokens": 3}}), {},
                        lambda rel: False) == []
    # vLLM has no such rule: a variant for every engine is checked on SGLang only
    both = KIMI.model_copy(update={"experiments": [Variant(name="d", change=DSPARK)]})
    assert [c.name for c in draft_checks(both, {}, lambda rel: False)] == ["variant-draft/d/sglang"]


def test_preflight_fails_the_shipped_kimi_plan_on_a_checkpoint_without_its_draft(tmp_path):
    """The shipped profile plans DSpark without a draft path: the synthetic checkpoint bundles it (as the plan
    assumes, gauntlet model synth) and Gate 0 passes; the same checkpoint without the key fails Gate 0 before any
    GPU, and with a dspark/ subfolder instead passes again."""
    from gauntlet.contract import Verdict
    from gauntlet.steps.model.synth import synth_from_profile
    from gauntlet.workflows.cli import main

    model = synth_from_profile(KIMI, tmp_path / "kimi")
    idx = json.loads((model / "model.safetensors.index.json").read_text())
    total = sum((model / n).stat().st_size for n in set(idx["weight_map"].values()))
    prof = tmp_path / "kimi.yaml"
    import yaml
    doc = KIMI.model_copy(update={"model": KIMI.model.model_copy(update={"weight_bytes": total})})
    prof.write_text(yaml.safe_dump(doc.model_dump(mode="json")))

    def preflight() -> dict:
        out = tmp_path / "out"
        shutil.rmtree(out, ignore_errors=True)
        main(["step", "preflight", "--profile", str(prof), "--model-path", str(model), "--out", str(out)])
        return {c.name: c for c in Verdict.read(out).checks}

    assert preflight()["variant-draft/dspark"].status == "pass"
    cfg = json.loads((model / "config.json").read_text())
    assert cfg.pop("dspark_block_size") == 7
    (model / "config.json").write_text(json.dumps(cfg))
    c = preflight()["variant-draft/dspark"]
    assert c.status == "fail" and "dspark/config.json" in c.detail
    (model / "dspark").mkdir()
    (model / "dspark" / "config.json").write_text("{}")
    assert preflight()["variant-draft/dspark"].status == "pass"
