"""The synthetic model generator: real safetensors with the profile's structure."""

from __future__ import annotations

import json

from safetensors import safe_open

from gauntlet.params import load_profile
from gauntlet.steps.model.synth import synth_from_profile
from gauntlet.workflows.cli import main

KIMI = load_profile("kimi-k3-h20")


def test_sparse_kimi_layout_declares_exactly_the_profile_bytes_on_little_disk(tmp_path):
    d = synth_from_profile(KIMI, tmp_path / "k", sparse=True)
    idx = json.loads((d / "model.safetensors.index.json").read_text())
    shards = sorted(set(idx["weight_map"].values()))
    assert len(shards) == 96 and shards[0] == "model-00001-of-00096.safetensors"
    sizes = [(d / s).stat().st_size for s in shards]
    assert sum(sizes) == KIMI.model.weight_bytes == 1_560_936_091_448
    assert sum((d / s).stat().st_blocks * 512 for s in shards) < 64 << 20  # holes, not data
    with safe_open(str(d / shards[10]), framework="numpy") as f:
        keys = list(f.keys())
    assert keys and all(idx["weight_map"][k] == shards[10] for k in keys)
    assert sum(sizes) - sum(8 + int.from_bytes((d / s).open("rb").read(8), "little") for s in shards) \
        == idx["metadata"]["total_size"]


def test_kimi_structure_packed_experts_config_and_aux_files(tmp_path):
    d = synth_from_profile(KIMI, tmp_path / "k")
    idx = json.loads((d / "model.safetensors.index.json").read_text())
    shard = idx["weight_map"]["language_model.model.layers.0.mlp.experts.gate_up_proj_blocks"]
    with safe_open(str(d / shard), "numpy") as f:
        assert f.get_tensor("language_model.model.layers.0.mlp.experts.gate_up_proj_blocks").dtype.name == "uint8"
    with safe_open(str(d / idx["weight_map"]["language_model.model.layers.0.input_layernorm.weight"]), "numpy") as f:
        assert f.get_slice("language_model.model.layers.0.input_layernorm.weight").get_dtype() == "BF16"
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["quantization_config"]["format"] == KIMI.model.architecture.quantization.fmt == "mxfp4-pack-quantized"
    assert cfg["text_config"]["max_position_embeddings"] == KIMI.model.architecture.max_position_embeddings
    lac = cfg["text_config"]["linear_attn_config"]
    assert len(lac["kda_layers"]) + len(lac["full_attn_layers"]) == cfg["text_config"]["num_hidden_layers"]
    assert cfg["text_config"]["num_hidden_layers"] == 93                 # the profile's value
    assert "num_hidden_layers" not in cfg["_synthetic"]["fields"]
    # 896 experts a layer would be 300 MB a copy: the dense directory writes 8, and says so
    assert cfg["_synthetic"]["scaled"] == {"moe.n_routed_experts": 8, "moe.num_experts_per_tok": 8}
    assert cfg["text_config"]["n_routed_experts"] == 8 and cfg["text_config"]["n_shared_experts"] == 2
    assert "chat_template" in json.loads((d / "tokenizer_config.json").read_text())
    assert (d / "preprocessor_config.json").is_file()
    marker = json.loads((d / ".aik8s-complete").read_text())
    assert marker["files"]["config.json"] == (d / "config.json").stat().st_size
    assert set(marker) == {"revision", "files", "created"}


def test_filled_expectations_are_written_as_the_profile_says(tmp_path):
    arch = KIMI.model.architecture.model_copy(update={"num_hidden_layers": 8, "layer_kinds": {"kda": 6, "mla": 2},
                                                      "architectures": ["KimiK3ForCausalLM"]})
    prof = KIMI.model_copy(update={"model": KIMI.model.model_copy(update={"architecture": arch, "shards": 4})})
    d = synth_from_profile(prof, tmp_path / "k")
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["architectures"] == ["KimiK3ForCausalLM"]
    assert len(cfg["text_config"]["linear_attn_config"]["full_attn_layers"]) == 2  # mla written back as full_attn


def test_cli_model_synth_for_the_local_profile(tmp_path, capsys):
    assert main(["model", "synth", "--profile", "local-cpu", "--out", str(tmp_path / "m")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["num_hidden_layers"] == 30
    assert len(list((tmp_path / "m").glob("*.safetensors"))) == 3
