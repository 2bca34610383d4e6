"""The pure parts of Gate 0: config expectations, layer kinds, fingerprint diffs (table-driven)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gauntlet.params.models import Architecture, MoESpec, QuantSpec
from gauntlet.steps.model.config_checks import config_checks, read_layer_kinds, read_quantization
from gauntlet.steps.model.fingerprint import fingerprint, fingerprint_diff
from gauntlet.steps.model.shards import index_path_problem, read_header

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "vllm-0.32.0-cpu"


def by_name(checks):
    return {c.name: c for c in checks}


KIMI_LINEAR = {
    "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear", "num_hidden_layers": 8,
    "linear_attn_config": {"kda_layers": [1, 2, 3, 5, 6, 7], "full_attn_layers": [4, 8], "head_dim": 128},
    "num_experts": 256, "num_shared_experts": 1, "num_experts_per_token": 8,
}


@pytest.mark.parametrize("config,arch,want,problem", [
    ({"num_hidden_layers": 4, "layer_types": ["linear_attention", "linear_attention", "linear_attention",
                                              "full_attention"]},
     Architecture(), {"full_attention": 1, "linear_attention": 3}, None),
    ({"text_config": {"num_hidden_layers": 3, "layer_types": ["a", "b", "a"]}},
     Architecture(layer_kind_aliases={"a": "kda", "b": "mla"}), {"kda": 2, "mla": 1}, None),
    (KIMI_LINEAR, Architecture(layer_kind_aliases={"full_attn": "mla"}), {"kda": 6, "mla": 2}, None),
    ({**KIMI_LINEAR, "linear_attn_config": {"kda_layers": [1, 2, 3, 4], "full_attn_layers": [4, 8]}},
     Architecture(), {"full_attn": 2, "kda": 4}, "more than one kind"),
    ({**KIMI_LINEAR, "linear_attn_config": {"kda_layers": [1, 2], "full_attn_layers": [4]}},
     Architecture(), {"full_attn": 1, "kda": 2}, "covers 3 layers of 8"),
    ({"num_hidden_layers": 3, "layer_types": ["x", "x"]}, Architecture(), {"x": 2}, "2 entries for 3 layers"),
])
def test_layer_kinds_are_read_from_config(config, arch, want, problem):
    kinds, where, prob = read_layer_kinds(config, arch)
    assert kinds == want
    assert (prob is None) if problem is None else (problem in prob)


def test_layer_kinds_expectation_against_kimi_linear_style_config():
    arch = Architecture(layer_kinds={"kda": 6, "mla": 2}, layer_kind_aliases={"full_attn": "mla"})
    assert by_name(config_checks(KIMI_LINEAR, arch))["config.layer_kinds"].status == "pass"
    arch = Architecture(layer_kinds={"kda": 5, "mla": 3}, layer_kind_aliases={"full_attn": "mla"})
    c = by_name(config_checks(KIMI_LINEAR, arch))["config.layer_kinds"]
    assert c.status == "fail" and c.observed == {"kda": 6, "mla": 2}


def test_layer_kinds_that_contradict_the_config_fail_even_when_the_profile_leaves_them_null():
    """Nothing to expect and nothing to discover: a layer in two kinds is the checkpoint's own error."""
    cfg = {**KIMI_LINEAR, "linear_attn_config": {"kda_layers": [1, 2, 3, 4], "full_attn_layers": [4, 8]}}
    c = by_name(config_checks(cfg, Architecture()))["config.layer_kinds"]
    assert c.status == "fail" and "more than one kind" in c.detail


def test_layer_kinds_expected_but_config_has_no_per_layer_field():
    c = by_name(config_checks({"num_hidden_layers": 2}, Architecture(layer_kinds={"mla": 2})))["config.layer_kinds"]
    assert c.status == "fail" and "layer_types" in c.detail and "linear_attn_config" in c.detail


def test_moe_spellings_and_unknown_expectations():
    arch = Architecture(moe=MoESpec(n_routed_experts=256, num_experts_per_tok=8))
    checks = by_name(config_checks(KIMI_LINEAR, arch))
    assert checks["config.moe.n_routed_experts"].status == "pass"         # num_experts
    assert checks["config.moe.num_experts_per_tok"].status == "pass"      # Kimi-Linear's num_experts_per_token
    assert checks["config.moe.num_experts_per_tok"].observed == 8
    skip = checks["config.moe.n_shared_experts"]
    assert skip.status == "skip" and "unknown expectation: fill model.architecture.moe.n_shared_experts" in skip.detail


def test_expected_field_absent_from_config_fails_naming_where_it_looked():
    c = by_name(config_checks({}, Architecture(num_hidden_layers=61)))["config.num_hidden_layers"]
    assert c.status == "fail" and "'text_config.'" in c.detail


@pytest.mark.parametrize("qc,want", [
    ({"quant_method": "mxfp4"}, {"quant_method": "mxfp4", "fmt": "mxfp4"}),            # gpt-oss style
    ({"quant_method": "compressed-tensors", "config_groups": {"g0": {"format": "mxfp4-pack-quantized"}}},
     {"quant_method": "compressed-tensors", "fmt": "mxfp4-pack-quantized"}),
    ({"quant_method": "modelopt", "format": "nvfp4"}, {"quant_method": "modelopt", "fmt": "nvfp4"}),
])
def test_quantization_config_reading(qc, want):
    got, where = read_quantization({"quantization_config": qc}, Architecture())
    assert got == want and where == "quantization_config"


def test_quantization_expected_but_unquantized_config():
    arch = Architecture(quantization=QuantSpec(fmt="mxfp4"))
    c = by_name(config_checks({"num_hidden_layers": 1}, arch))["config.quantization.fmt"]
    assert c.status == "fail" and "quantization_config" in c.detail


def test_real_smollm2_config_passes_the_local_expectations():
    cfg = json.loads((FIXTURES / "smollm2-config.json").read_text())
    arch = Architecture(architectures=["LlamaForCausalLM"], model_type="llama", num_hidden_layers=30,
                        max_position_embeddings=8192)
    checks = by_name(config_checks(cfg, arch))
    assert all(checks[f"config.{f}"].status == "pass" for f in
               ("architectures", "model_type", "num_hidden_layers", "max_position_embeddings"))
    assert checks["config.quantization.fmt"].status == "skip"


@pytest.mark.parametrize("name,bad", [
    ("model-00001-of-00002.safetensors", False), ("sub/model.safetensors", False),
    ("../x.safetensors", True), ("/etc/passwd", True), ("a/../../x", True), ("a\\..\\x", True), ("", True),
])
def test_index_path_problem(name, bad):
    assert (index_path_problem(name) is not None) is bad


def test_fingerprint_diff_names_component_and_shard():
    files = {"config.json": {"sha256": "a"}, "tokenizer_config.json": {"sha256": "b"}}
    shards = {"s1.safetensors": {"size": 10, "header_sha256": "h1"}, "s2.safetensors": {"size": 20, "header_sha256": "h2"}}
    a = fingerprint(files, shards)
    assert fingerprint_diff(a, fingerprint(files, shards)) == []
    b = fingerprint({**files, "config.json": {"sha256": "z"}}, {**shards, "s2.safetensors": {"size": 20, "header_sha256": "x"}})
    diff = fingerprint_diff(a, b)
    assert "config differs (config.json)" in diff
    assert any("shard s2.safetensors header differs" in d for d in diff)
    assert not any("tokenizer" in d for d in diff)


def test_header_length_larger_than_file_is_refused_before_reading(tmp_path):
    p = tmp_path / "x.safetensors"
    p.write_bytes((10**18).to_bytes(8, "little") + b"{}")
    f = read_header(p)
    assert "larger than the 2 bytes after it" in f["error"] and f["header_sha256"] is None


@pytest.mark.parametrize("header,want", [
    ({"__metadata__": {"x": '"q":{"dtype":"U8","data_offsets":[0,1]}'}, 'a"b': {"dtype": "U8", "shape": [1],
      "data_offsets": [0, 1]}}, {'a"b': "U8"}),                                   # escapes: parsed in full
    ({"c": {"shape": [1], "dtype": "F32", "data_offsets": [1, 5]},
      "d": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}, {"c": "F32", "d": "U8"}),  # other key order
    ({"e": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}, {"e": "BF16"}),          # the fast path
])
def test_header_dtypes_fast_path_never_guesses(header, want):
    from gauntlet.steps.model.shards import tensor_table
    dtypes, shapes, dupes = tensor_table(json.dumps(header, separators=(",", ":")).encode())
    assert dtypes == want and dupes == []
    assert shapes == {k: ",".join(map(str, v["shape"])) for k, v in header.items() if k != "__metadata__"}


def test_header_naming_a_tensor_twice_is_reported_not_collapsed():
    from gauntlet.steps.model.shards import tensor_table
    raw = (b'{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},'
           b'"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[],"data_offsets":[4,5]}}')
    dtypes, shapes, dupes = tensor_table(raw)
    assert dupes == ["a"] and dtypes == {"a": "U8", "b": "U8"} and shapes["b"] == ""
