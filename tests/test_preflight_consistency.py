"""Gate 0 judges a checkpoint against itself from the shard headers alone (steps/model/tensor_checks.py).

Each injected inconsistency rewrites a real safetensors shard of a synthetic checkpoint (the header with
the injected dtype, shape or name; the data region a hole, `synth.write_sparse_shard`, which safe_open
accepts), runs the real `gauntlet step preflight`, and expects exit 1 with the named check failing and its
detail naming the shard, the tensor and what disagrees. The profile leaves the dtypes unknown where the
issue says so: these checks need no expectation. The clean synthetic layouts and the real SmolLM2 pass.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from gauntlet.contract import Check, Verdict
from gauntlet.params import load_profile
from gauntlet.params.models import Architecture, Profile, QuantSpec
from gauntlet.steps.model.marker import write_marker
from gauntlet.steps.model.tensor_checks import consistency_checks
from gauntlet.steps.model.synth import profile_of, synth_from_profile, write_sparse_shard
from gauntlet.workflows.cli import main

KIMI = load_profile("kimi-k3-h20")
LOCAL = load_profile("local-cpu")
INDEX = "model.safetensors.index.json"
T = "language_model.model."
CHECKS = ("tensor-unique", "tensor-dtypes", "tensor-shapes", "tensor-layers")


def _with(profile: Profile, **model: object) -> Profile:
    return profile.model_copy(update={"model": profile.model.model_copy(update=model)})


def _unknown_dtypes(profile: Profile) -> Profile:
    """The profile with the quantized dtypes unknown (null in the profile): the issue's case. A test profile, so
    Gate 0 reports the unknown instead of failing it (steps/model/expectations.py)."""
    arch = profile.model.architecture
    q = arch.quantization.model_copy(update={"weight_dtypes": [], "scale_dtypes": []})
    return _with(profile, architecture=arch.model_copy(update={"quantization": q})).model_copy(
        update={"purpose": "test"})


def _total(d: Path) -> int:
    return sum((d / n).stat().st_size for n in set(_index(d).values()))


def _index(d: Path) -> dict[str, str]:
    return json.loads((d / INDEX).read_text())["weight_map"]


@pytest.fixture(scope="module")
def kimi_template(tmp_path_factory) -> Path:
    return synth_from_profile(KIMI, tmp_path_factory.mktemp("kimi") / "kimi")


@pytest.fixture(scope="module")
def llama_template(tmp_path_factory) -> Path:
    return synth_from_profile(LOCAL, tmp_path_factory.mktemp("llama") / "llama")


@pytest.fixture(scope="module")
def experts_template(tmp_path_factory) -> Path:
    return synth_from_profile(KIMI, tmp_path_factory.mktemp("experts") / "experts", per_expert=True)


def _copy(template: Path, tmp_path: Path) -> Path:
    d = tmp_path / "model"
    shutil.copytree(template, d)
    return d


@pytest.fixture
def kimi(tmp_path, kimi_template):
    return _copy(kimi_template, tmp_path), _unknown_dtypes(profile_of(KIMI, kimi_template))


@pytest.fixture
def llama(tmp_path, llama_template):
    return _copy(llama_template, tmp_path), _with(LOCAL, weight_bytes=_total(llama_template))


@pytest.fixture
def experts(tmp_path, experts_template):
    return _copy(experts_template, tmp_path), _unknown_dtypes(profile_of(KIMI, experts_template))


def run_preflight(tmp_path: Path, model: Path, profile: Profile) -> tuple[int, Verdict]:
    pf = tmp_path / "profile.yaml"
    pf.write_text(yaml.safe_dump(profile.model_dump(mode="json")))
    out = tmp_path / "out"
    shutil.rmtree(out, ignore_errors=True)
    rc = main(["step", "preflight", "--profile", str(pf), "--model-path", str(model), "--out", str(out)])
    assert not (out / "traceback.txt").exists(), (out / "traceback.txt").read_text()
    return rc, Verdict.read(out)


def assert_fails(tmp_path: Path, model: Path, profile: Profile, check: str, *words: str,
                 also: tuple[str, ...] = ()) -> str:
    """``check`` (and only it, with ``also``) fails. The injection is made consistent everywhere else first, as
    a sync of a corrupt upstream would leave it: the marker's manifest and the profile's byte total follow."""
    write_marker(model, revision=profile.model.revision or "synthetic", marker=profile.model.marker)
    rc, v = run_preflight(tmp_path, model, _with(profile, weight_bytes=_total(model)))
    bad = {c.name: c.detail for c in v.checks if c.status == "fail"}
    assert rc == 1 and v.status == "fail" and set(bad) == {check, *also}, f"{check} did not fail alone: {bad}"
    for w in words:
        assert w in bad[check], f"{w!r} not in {bad[check]!r}"
    return bad[check]


# ---------------------------------------------------------------- rewriting one real shard

def _entries(path: Path) -> list[tuple[str, str, tuple[int, ...]]]:
    with open(path, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        head = json.loads(fh.read(n))
    head.pop("__metadata__", None)
    return [(k, v["dtype"], tuple(v["shape"])) for k, v in sorted(head.items(), key=lambda kv: kv[1]["data_offsets"])]


def _shard_of(model: Path, tensor: str) -> str:
    return _index(model)[tensor]


def _edit_index(model: Path, fn) -> None:
    idx = json.loads((model / INDEX).read_text())
    fn(idx["weight_map"])
    (model / INDEX).write_text(json.dumps(idx))


def _rewrite(model: Path, tensor: str, *, dtype: str | None = None, shape: tuple[int, ...] | None = None,
             rename: str | None = None) -> str:
    """Rewrite the shard holding ``tensor`` with its dtype, shape or name changed (the index follows a rename)."""
    shard = _shard_of(model, tensor)
    entries = [(rename or n, dtype or d, shape or s) if n == tensor else (n, d, s)
               for n, d, s in _entries(model / shard)]
    write_sparse_shard(model / shard, entries)
    if rename:
        _edit_index(model, lambda wm: wm.__setitem__(rename, wm.pop(tensor)))
    return shard


def _drop(model: Path, pred) -> None:
    """Remove every tensor ``pred`` selects from the headers and the index (consistently, as a careful forger)."""
    wm = _index(model)
    for shard in sorted({s for t, s in wm.items() if pred(t)}):
        write_sparse_shard(model / shard, [e for e in _entries(model / shard) if not pred(e[0])])
    _edit_index(model, lambda m: [m.pop(t) for t in [t for t in m if pred(t)]])


# ---------------------------------------------------------------- the clean layouts pass

def _statuses(v: Verdict) -> dict[str, str]:
    return {c.name: c.status for c in v.checks}


@pytest.mark.parametrize("which", ["kimi", "llama", "experts"])
def test_clean_synthetic_layouts_pass_every_consistency_check(tmp_path, which, request):
    model, profile = request.getfixturevalue(which)
    rc, v = run_preflight(tmp_path, model, profile)
    assert rc == 0, {c.name: c.detail for c in v.checks if c.status == "fail"}
    assert {n: _statuses(v)[n] for n in CHECKS} == dict.fromkeys(CHECKS, "pass")


def test_real_smollm2_passes_every_consistency_check(tmp_path, local_model):
    """The real prepared SmolLM2 (the session's ``local_model``: built once, then from .cache/models)."""
    rc, v = run_preflight(tmp_path, local_model, LOCAL)
    assert rc == 0, {c.name: c.detail for c in v.checks if c.status == "fail"}
    checks = {c.name: c for c in v.checks}
    assert all(checks[n].status == "pass" for n in CHECKS)
    assert checks["tensor-shapes"].observed == 272      # every tensor of SmolLM2 has a shape the config states
    assert "layers 0-29" in checks["tensor-layers"].detail


# ---------------------------------------------------------------- dtypes

def test_matrix_in_another_half_precision_than_the_config_declares(tmp_path, kimi):
    model, profile = kimi
    t = f"{T}layers.5.self_attn.o_proj.weight"
    shard = _rewrite(model, t, dtype="F16")   # same bytes: safetensors itself accepts it
    assert_fails(tmp_path, model, profile, "tensor-dtypes", f"shard {shard}: {t} is F16",
                 "config.json text_config.torch_dtype = 'bfloat16' (BF16)")


def test_vector_whose_dtype_differs_from_its_family_in_the_other_shards(tmp_path, kimi):
    model, profile = kimi
    t = f"{T}layers.7.input_layernorm.weight"
    shard = _rewrite(model, t, dtype="F32")   # F32 vectors are allowed; not one unlike its siblings
    siblings = profile.model.architecture.num_hidden_layers - 1
    assert_fails(tmp_path, model, profile, "tensor-dtypes", f"{T}layers.*.input_layernorm.weight is BF16 in {siblings}",
                 f"{t} in shard {shard} is F32")


def test_packed_expert_dtype_unlike_its_family_with_the_dtypes_unknown(tmp_path, kimi):
    model, profile = kimi
    assert profile.model.architecture.quantization.weight_dtypes == []   # quant-dtypes skips: unknown expectation
    t = f"{T}layers.9.mlp.experts.gate_up_proj_blocks"
    shard = _rewrite(model, t, dtype="I8")
    assert_fails(tmp_path, model, profile, "tensor-dtypes", f"{T}layers.*.mlp.experts.gate_up_proj_blocks is U8",
                 f"{t} in shard {shard} is I8")


def test_quantized_storage_in_a_module_the_quantization_config_leaves_unconverted(tmp_path, kimi):
    model, profile = kimi   # quantization_config.modules_to_not_convert names self_attn
    t = f"{T}layers.3.self_attn.o_proj.weight"
    shard = _rewrite(model, t, dtype="U8", shape=(64, 128))
    assert_fails(tmp_path, model, profile, "tensor-dtypes", f"shard {shard}: {t} is U8 [64,128]")


def test_unquantized_checkpoint_matrix_in_f32(tmp_path, llama):
    model, profile = llama
    t = "model.embed_tokens.weight"   # one of a kind: no family to disagree with, only the declared dtype
    shard = _rewrite(model, t, dtype="F32")
    assert_fails(tmp_path, model, profile, "tensor-dtypes", f"shard {shard}: {t} is F32 [512,64]",
                 "config.json torch_dtype = 'bfloat16' (BF16)")


# ---------------------------------------------------------------- shapes

@pytest.mark.parametrize("tensor,shape,words", [
    (f"{T}layers.3.input_layernorm.weight", (65,), ("[65]", "text_config.hidden_size 64", "make it [64]")),
    (f"{T}embed_tokens.weight", (511, 64), ("[511, 64]", "vocab_size 512", "[512, 64]")),
    ("language_model.lm_head.weight", (512, 63), ("[512, 63]", "hidden_size 64")),
    (f"{T}layers.4.mlp.gate.weight", (9, 64), ("[9, 64]", "text_config.n_routed_experts 8", "[8, 64]")),
    (f"{T}layers.4.mlp.experts.down_proj_blocks", (7, 64, 1, 16), ("[7, 64, 1, 16]", "text_config.n_routed_experts 8", "[8, ...]")),
    (f"{T}layers.6.self_attn.o_proj.weight", (60, 64), ("[60, 64]", "hidden_size 64", "[64, *]")),
])
def test_shape_against_the_config_dimensions(tmp_path, kimi, tensor, shape, words):
    model, profile = kimi
    shard = _rewrite(model, tensor, shape=shape)
    assert_fails(tmp_path, model, profile, "tensor-shapes", f"shard {shard}: {tensor} is", *words)


def test_dense_mlp_against_intermediate_size(tmp_path, llama):
    model, profile = llama
    t = "model.layers.12.mlp.down_proj.weight"
    shard = _rewrite(model, t, shape=(64, 256))
    assert_fails(tmp_path, model, profile, "tensor-shapes", f"shard {shard}: {t} is BF16 [64, 256]",
                 "intermediate_size 128", "[64, 128]")


def test_config_dimension_that_is_not_a_positive_integer(tmp_path, llama):
    model, profile = llama
    cfg = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(cfg | {"hidden_size": "64"}))
    assert_fails(tmp_path, model, profile, "tensor-shapes", "config.json hidden_size is '64', not a positive integer")


# ---------------------------------------------------------------- layer and expert indices

def test_layer_beyond_num_hidden_layers(tmp_path, kimi):
    model, profile = kimi
    n = profile.model.architecture.num_hidden_layers      # Kimi K3's 93: layers 0-92
    t = f"{T}layers.{n - 1}.post_attention_layernorm.weight"
    shard = _rewrite(model, t, rename=f"{T}layers.{n}.post_attention_layernorm.weight")
    assert_fails(tmp_path, model, profile, "tensor-layers", f"shard {shard} holds layer {n}",
                 f"num_hidden_layers {n}", f"ends at layer {n - 1}")


def test_layer_missing_from_every_shard_and_the_index(tmp_path, llama):
    model, profile = llama
    _drop(model, lambda t: t.startswith("model.layers.17."))
    assert_fails(tmp_path, model, profile, "tensor-layers", "no shard holds layer 17", "30 config.json")


def test_expert_index_beyond_the_expert_count(tmp_path, experts):
    model, profile = experts
    old, new = f"{T}layers.2.mlp.experts.7.up_proj.weight_packed", f"{T}layers.2.mlp.experts.8.up_proj.weight_packed"
    _rewrite(model, old, rename=new)
    detail = assert_fails(tmp_path, model, profile, "tensor-layers", "layer 2 has expert 8", "text_config.n_routed_experts is 8 (experts 0-7)")
    assert "lacks" not in detail   # expert 7's other tensors are still there


def test_expert_missing_from_a_layer(tmp_path, experts):
    model, profile = experts
    _drop(model, lambda t: t.startswith(f"{T}layers.11.mlp.experts.3."))
    assert_fails(tmp_path, model, profile, "tensor-layers", "layer 11 lacks expert 3 of the 8 config.json text_config.n_routed_experts")


# ---------------------------------------------------------------- each tensor once

def test_tensor_in_two_shards(tmp_path, kimi):
    model, profile = kimi
    t = f"{T}layers.20.mlp.gate.weight"
    home = _shard_of(model, t)
    other = next(s for s in sorted(set(_index(model).values())) if s != home)
    entry = next(e for e in _entries(model / home) if e[0] == t)
    write_sparse_shard(model / other, [*_entries(model / other), entry])
    detail = assert_fails(tmp_path, model, profile, "tensor-unique", f"{t} is in the headers of 2 shards",
                          f"the index maps it to {home}", also=("index-tensors",))
    assert home in detail and other in detail
    assert_fails(tmp_path, model, profile, "index-tensors", f"shard {other}", "maps to another shard", home,
                 also=("tensor-unique",))


def test_index_naming_a_tensor_twice(tmp_path, kimi):
    model, profile = kimi
    t = f"{T}layers.1.mlp.gate.weight"
    home = _shard_of(model, t)
    text = (model / INDEX).read_text()
    dup = json.dumps(t) + ": " + json.dumps("model-00001-of-00096.safetensors") + ", "
    (model / INDEX).write_text(text.replace('"weight_map": {', '"weight_map": {' + dup, 1))
    assert_fails(tmp_path, model, profile, "tensor-unique", "model.safetensors.index.json repeats key",
                 f"{t!r} twice ('model-00001-of-00096.safetensors', then {home!r}")


def test_shard_header_naming_a_tensor_twice(tmp_path, kimi):
    model, profile = kimi
    t = f"{T}layers.2.mlp.gate.weight"
    shard = _shard_of(model, t)
    p = model / shard
    raw = p.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    head = raw[8:8 + n].rstrip()
    i = head.index(json.dumps(t).encode() + b":")
    j = head.index(b"}", i) + 1
    head = head[:j] + b"," + head[i:j] + head[j:]   # the same entry again: safetensors accepts the repeat
    head += b" " * (-len(head) % 8)
    p.write_bytes(len(head).to_bytes(8, "little") + head + raw[8 + n:])
    assert_fails(tmp_path, model, profile, "tensor-unique", f"shard {shard}: its header names {t!r} more than once")


def test_config_json_repeating_a_key(tmp_path, llama):
    model, profile = llama
    text = (model / "config.json").read_text()
    (model / "config.json").write_text(text.replace('"hidden_size": 64', '"hidden_size": 64, "hidden_size": 65', 1))
    assert_fails(tmp_path, model, profile, "config-json", "config.json repeats key 'hidden_size' twice (64, then 65",
                 also=("tensor-shapes",))   # and the 65 that json.loads kept disagrees with every shape


# ---------------------------------------------------------------- real releases' exceptions (pure, no files)

def _facts(shards: dict[str, dict[str, tuple[str, tuple[int, ...]]]]) -> dict:
    return {"shards": {n: {"tensors": {t: d for t, (d, _) in ts.items()},
                           "shapes": {t: ",".join(map(str, s)) for t, (_, s) in ts.items()}}
                       for n, ts in shards.items()},
            "weight_map": {t: n for n, ts in shards.items() for t in ts}}


def _by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def test_deepseek_style_fp8_with_f32_scales_and_router_bias_passes():
    cfg = {"hidden_size": 16, "vocab_size": 32, "intermediate_size": 48, "moe_intermediate_size": 8,
           "n_routed_experts": 2, "num_hidden_layers": 2, "num_nextn_predict_layers": 1, "torch_dtype": "bfloat16",
           "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}}
    s0 = {"model.embed_tokens.weight": ("BF16", (32, 16)), "model.norm.weight": ("BF16", (16,)),
          "lm_head.weight": ("BF16", (32, 16))}
    for i in range(3):   # layer 2 is the MTP layer (num_nextn_predict_layers)
        p = f"model.layers.{i}."
        s0 |= {p + "input_layernorm.weight": ("BF16", (16,)), p + "self_attn.o_proj.weight": ("F8_E4M3", (16, 16)),
               p + "self_attn.o_proj.weight_scale_inv": ("F32", (1, 1)),
               p + "mlp.gate.weight": ("BF16", (2, 16)), p + "mlp.gate.e_score_correction_bias": ("F32", (2,))}
        for j in range(2):
            s0 |= {f"{p}mlp.experts.{j}.gate_proj.weight": ("F8_E4M3", (8, 16)),
                   f"{p}mlp.experts.{j}.down_proj.weight": ("F8_E4M3", (16, 8)),
                   f"{p}mlp.experts.{j}.down_proj.weight_scale_inv": ("F32", (1, 1))}
    checks = _by_name(consistency_checks(_facts({"a.safetensors": s0}), cfg, Architecture()))
    assert {n: checks[n].status for n in CHECKS} == dict.fromkeys(CHECKS, "pass"), checks
    assert "(the last 1 MTP)" in checks["tensor-layers"].detail


def test_gpt_oss_style_glob_not_converted_modules():
    qc = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "lm_head"]}
    cfg = {"hidden_size": 16, "vocab_size": 32, "num_local_experts": 4, "num_hidden_layers": 1,
           "torch_dtype": "bfloat16", "quantization_config": qc}
    tensors = {"model.embed_tokens.weight": ("BF16", (32, 16)), "model.layers.0.self_attn.sinks": ("BF16", (4,)),
               "model.layers.0.mlp.router.weight": ("BF16", (4, 16)),
               "model.layers.0.mlp.experts.gate_up_proj_blocks": ("U8", (4, 32, 1, 16)),
               "model.layers.0.mlp.experts.gate_up_proj_bias": ("BF16", (4, 32)),
               "model.layers.0.self_attn.q_proj.weight": ("BF16", (16, 16))}
    arch = Architecture(quantization=QuantSpec())
    assert _by_name(consistency_checks(_facts({"a": tensors}), cfg, arch))["tensor-dtypes"].status == "pass"
    tensors["model.layers.0.self_attn.q_proj.weight"] = ("U8", (16, 8))   # quantized where the config says not
    c = _by_name(consistency_checks(_facts({"a": tensors}), cfg, arch))["tensor-dtypes"]
    assert c.status == "fail" and "model.layers.0.self_attn.q_proj.weight is U8" in c.detail


def test_no_declared_dtype_still_judges_families():
    cfg = {"hidden_size": 4}
    shards = {"a": {"m.layers.0.w": ("BF16", (4, 4))}, "b": {"m.layers.1.w": ("F16", (4, 4))}}
    c = _by_name(consistency_checks(_facts(shards), cfg, Architecture()))["tensor-dtypes"]
    assert c.status == "fail" and "m.layers.*.w is" in c.detail and "declares no dtype" not in c.detail
    shards["b"]["m.layers.1.w"] = ("BF16", (4, 4))
    c = _by_name(consistency_checks(_facts(shards), cfg, Architecture()))["tensor-dtypes"]
    assert c.status == "pass" and "declares no dtype" in c.detail
