"""A synthetic model directory with a profile's *structure*, so Gate 0 is tested without real weights.

Writes real safetensors shards, the index, config.json, tokenizer_config.json
(with a chat template), the profile's other tokenizer/processor files and the
completion marker with its manifest.

- A quantized MoE profile (``architecture.quantization.fmt`` set, e.g. Kimi K3)
  gets MoE layers whose routed experts are MXFP4-style packed ``U8`` blocks
  (``mlp.experts.gate_up_proj_blocks``, ``down_proj_blocks``: two FP4 values a
  byte, 32-value blocks) with ``U8`` E8M0 scales (``..._scales``), and BF16
  everything else (attention, shared experts, router, norms, embeddings, a
  small vision tower). Other profiles get a dense Llama-style BF16 model.
- Every non-null expectation of the profile is written as the profile says;
  null ones get plausible *synthetic* values, listed in config.json under
  ``_synthetic`` (they are not Kimi K3's real numbers). One exception keeps the
  default (dense) directory small: more routed experts than ``DENSE_MAX_EXPERTS``
  (Kimi K3's 896 would write 300 MB a copy) are written as that many, and the
  experts per token at most as many, listed under ``_synthetic.scaled``;
  :func:`profile_of` gives the profile such a directory meets.
- ``sparse=True``: the profile's shard count (96 for Kimi) with full-size
  declared tensors whose data region is a hole (ftruncate), so the directory
  declares exactly ``model.weight_bytes`` (1,560,936,091,448 bytes for Kimi)
  while using a few MB of disk. The header is written here (the library would
  need the data in memory) and each shard is checked with ``safe_open`` after
  writing. A ``_synthetic.padding.<k>`` U8 tensor per shard makes the total exact.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from gauntlet.params.models import Profile
from gauntlet.contract import write_json_atomic
from gauntlet.steps.model.marker import write_marker

__all__ = ["synth_from_profile", "plan_layout", "write_sparse_shard", "header_bytes", "profile_of",
           "DENSE_MAX_EXPERTS"]

DENSE_MAX_EXPERTS = 8       # what a null expert count gets, and the most a dense directory writes

DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "U8": 1, "I8": 1}
_NP_NAME = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "U8": "uint8", "I8": "int8"}
CHAT_TEMPLATE = (
    "{%- for m in messages -%}<|im_{{ m['role'] }}|>{{ m['content'] }}<|im_end|>{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>{%- endif -%}")

Tensor = tuple[str, str, tuple[int, ...]]   # name, dtype, shape


def _nbytes(dtype: str, shape: tuple[int, ...]) -> int:
    return DTYPE_BYTES[dtype] * math.prod(shape)


# ---------------------------------------------------------------- structure

def _layer_plan(profile: Profile) -> tuple[int, list[str], dict[str, Any], list[str]]:
    """(n_layers, kind per layer, config fields for the kinds, synthetic field names)."""
    arch = profile.model.architecture
    synthetic: list[str] = []
    kinds = dict(arch.layer_kinds) if arch.layer_kinds else None
    n = arch.num_hidden_layers
    if n is None:
        n = sum(kinds.values()) if kinds else (64 if arch.quantization.fmt else 4)
        synthetic.append("num_hidden_layers")
    if kinds is None:
        if arch.quantization.fmt:
            full = n // 4
            kinds = {"kda": n - full, "mla": full}
        else:
            kinds = {"full_attention": n}
        synthetic.append("layer_kinds")
    if sum(kinds.values()) != n:
        raise ValueError(f"profile layer_kinds {kinds} sum to {sum(kinds.values())}, not num_hidden_layers {n}")
    per_layer: list[str] = []
    # interleave: every kind spread evenly (Kimi-Linear puts a full-attention layer every 4th)
    order = sorted(kinds, key=lambda k: -kinds[k])
    left = dict(kinds)
    for _ in range(n):
        k = max(order, key=lambda k: (left[k] / kinds[k] if kinds[k] else -1, -order.index(k)))
        per_layer.append(k)
        left[k] -= 1
    reverse = {v: k for k, v in arch.layer_kind_aliases.items()}
    raw = {k: reverse.get(k, k) for k in kinds}
    if set(raw.values()) <= {"kda", "full_attn"} and "kda" in raw.values():
        lac = {f"{raw[k]}_layers": [i + 1 for i, kk in enumerate(per_layer) if kk == k] for k in kinds}
        fields: dict[str, Any] = {"linear_attn_config": {**lac, "head_dim": 128, "num_heads": 64, "short_conv_kernel_size": 4}}
    else:
        fields = {"layer_types": [raw[k] for k in per_layer]}
    return n, per_layer, fields, synthetic


def _moe_tensors(p: str, kind: str, h: int, inter: int, e: int, shared: int, attn: int,
                 per_expert: bool = False) -> list[Tensor]:
    t: list[Tensor] = [(f"{p}input_layernorm.weight", "BF16", (h,)),
                       (f"{p}post_attention_layernorm.weight", "BF16", (h,))]
    if kind in ("kda", "linear_attention"):
        for name in ("q_proj", "k_proj", "v_proj", "g_proj", "o_proj"):
            t.append((f"{p}self_attn.{name}.weight", "BF16", (attn, h) if name != "o_proj" else (h, attn)))
        t += [(f"{p}self_attn.f_a_proj.weight", "BF16", (128, h)), (f"{p}self_attn.b_proj.weight", "BF16", (64, h)),
              (f"{p}self_attn.A_log", "F32", (64,)), (f"{p}self_attn.dt_bias", "F32", (attn,))]
    else:
        t += [(f"{p}self_attn.q_a_proj.weight", "BF16", (1536, h)),
              (f"{p}self_attn.q_b_proj.weight", "BF16", (attn, 1536)),
              (f"{p}self_attn.kv_a_proj_with_mqa.weight", "BF16", (576, h)),
              (f"{p}self_attn.kv_b_proj.weight", "BF16", (attn * 2, 512)),
              (f"{p}self_attn.o_proj.weight", "BF16", (h, attn)),
              (f"{p}self_attn.q_a_layernorm.weight", "BF16", (1536,)),
              (f"{p}self_attn.kv_a_layernorm.weight", "BF16", (512,))]
    t.append((f"{p}mlp.gate.weight", "BF16", (e, h)))
    t.append((f"{p}mlp.gate.e_score_correction_bias", "F32", (e,)))
    si = inter * shared
    t += [(f"{p}mlp.shared_experts.gate_proj.weight", "BF16", (si, h)),
          (f"{p}mlp.shared_experts.up_proj.weight", "BF16", (si, h)),
          (f"{p}mlp.shared_experts.down_proj.weight", "BF16", (h, si))]
    if per_expert:  # compressed-tensors style, one tensor pair per expert and projection (Kimi K2's layout)
        for j in range(e):
            q = f"{p}mlp.experts.{j}."
            t += [(f"{q}gate_proj.weight_packed", "U8", (inter, h // 2)),
                  (f"{q}gate_proj.weight_scale", "U8", (inter, h // 32)),
                  (f"{q}up_proj.weight_packed", "U8", (inter, h // 2)),
                  (f"{q}up_proj.weight_scale", "U8", (inter, h // 32)),
                  (f"{q}down_proj.weight_packed", "U8", (h, inter // 2)),
                  (f"{q}down_proj.weight_scale", "U8", (h, inter // 32))]
        return t
    # MXFP4: 32-value blocks, 16 bytes each (two FP4 a byte), one E8M0 scale byte per block
    t += [(f"{p}mlp.experts.gate_up_proj_blocks", "U8", (e, 2 * inter, h // 32, 16)),
          (f"{p}mlp.experts.gate_up_proj_scales", "U8", (e, 2 * inter, h // 32)),
          (f"{p}mlp.experts.down_proj_blocks", "U8", (e, h, inter // 32, 16)),
          (f"{p}mlp.experts.down_proj_scales", "U8", (e, h, inter // 32))]
    return t


def _expert_bytes(h: int, inter: int) -> int:
    return 2 * inter * (h // 32) * 17 + h * (inter // 32) * 17


def plan_layout(profile: Profile, sparse: bool, per_expert: bool = False,
                max_experts: int | None = None) -> tuple[dict[str, Any], list[Tensor]]:
    """(config.json, tensors in file order) for the profile; pure.

    ``per_expert``: one tensor pair per expert (384 experts when the profile leaves the count null, as Kimi
    K2), about 150k tensors at full size; the default fuses each layer's experts (gpt-oss style blocks).
    ``max_experts``: write at most that many routed experts (and experts per token), listed in
    ``_synthetic.scaled``.
    """
    arch, model = profile.model.architecture, profile.model
    n, per_layer, kind_fields, synthetic = _layer_plan(profile)
    quantized = bool(arch.quantization.fmt or arch.quantization.weight_dtypes)
    if quantized:
        h, inter, vocab, attn = (7168, 2048, 163840, 8192) if sparse else (64, 32, 512, 64)
    else:
        h, inter, vocab, attn = (4096, 11008, 128256, 4096) if sparse else (64, 128, 512, 64)
    tensors: list[Tensor] = []
    scaled: dict[str, int] = {}         # profile field under model.architecture. -> the smaller value written
    text = "language_model.model." if model.multimodal else "model."
    moe = arch.moe
    e = moe.n_routed_experts
    shared = moe.n_shared_experts if moe.n_shared_experts is not None else 1
    topk = moe.num_experts_per_tok if moe.num_experts_per_tok is not None else 8
    if quantized:
        if e is None:
            synthetic.append("moe.n_routed_experts")
            e = 8
            if per_expert and sparse:
                e = 384
            elif sparse and model.weight_bytes:
                # as many experts (a multiple of 32) as fit 98% of the declared bytes: a plausible size
                base = sum(_nbytes(d, s) for _, d, s in _moe_tensors("", per_layer[0], h, inter, 0, shared, attn))
                one_expert = _expert_bytes(h, inter) + 2 * h + 4   # (not per_expert: that is the layout flag)
                budget = 0.98 * model.weight_bytes - 2 * vocab * h * 2 - n * base
                e = max(32, int(budget / (n * one_expert)) // 32 * 32)
        synthetic += [f"moe.{f}" for f, v in (("n_shared_experts", moe.n_shared_experts),
                                             ("num_experts_per_tok", moe.num_experts_per_tok)) if v is None]
        if max_experts is not None and e is not None and e > max_experts:
            scaled["moe.n_routed_experts"] = e = max_experts
        if e is not None and topk > e:
            topk = e
            if moe.num_experts_per_tok is not None:
                scaled["moe.num_experts_per_tok"] = topk
    tensors.append((f"{text}embed_tokens.weight", "BF16", (vocab, h)))
    for i, kind in enumerate(per_layer):
        p = f"{text}layers.{i}."
        if quantized and e is not None:      # e is always set above for a quantized model
            tensors += _moe_tensors(p, kind, h, inter, e, shared, attn, per_expert)
        else:
            tensors += [(f"{p}input_layernorm.weight", "BF16", (h,)),
                        (f"{p}post_attention_layernorm.weight", "BF16", (h,))]
            tensors += [(f"{p}self_attn.{x}_proj.weight", "BF16", (h, h)) for x in ("q", "k", "v", "o")]
            tensors += [(f"{p}mlp.{x}_proj.weight", "BF16", (inter, h) if x != "down" else (h, inter))
                        for x in ("gate", "up", "down")]
    tensors.append((f"{text}norm.weight", "BF16", (h,)))
    tensors.append(("language_model.lm_head.weight" if model.multimodal else "lm_head.weight", "BF16", (vocab, h)))
    if model.multimodal:
        vh = 1152 if sparse else 32
        for j in range(4):
            tensors += [(f"vision_tower.blocks.{j}.attn.qkv.weight", "BF16", (3 * vh, vh)),
                        (f"vision_tower.blocks.{j}.mlp.fc1.weight", "BF16", (4 * vh, vh))]
        tensors += [("vision_tower.patch_embed.proj.weight", "BF16", (vh, 3 * 14 * 14)),
                    ("multi_modal_projector.linear_1.weight", "BF16", (h, vh))]

    def pick(value: Any, name: str, default: Any) -> Any:
        if value is None:
            synthetic.append(name)
            return default
        return value

    text_cfg: dict[str, Any] = {
        "model_type": "kimi_k3_text" if quantized else pick(arch.model_type, "model_type", "llama"),
        "hidden_size": h, "intermediate_size": inter, "vocab_size": vocab,
        "num_hidden_layers": n, **kind_fields,
        "max_position_embeddings": pick(arch.max_position_embeddings, "max_position_embeddings",
                                        1048576 if quantized else 8192),
        "torch_dtype": "bfloat16",
    }
    if quantized:
        text_cfg |= {"n_routed_experts": e, "n_shared_experts": shared, "num_experts_per_tok": topk,
                     "moe_intermediate_size": inter, "kv_lora_rank": 512, "q_lora_rank": 1536}
    q = arch.quantization
    top: dict[str, Any] = {
        "architectures": pick(arch.architectures, "architectures",
                              ["KimiK3ForConditionalGeneration"] if quantized else ["LlamaForCausalLM"]),
        "model_type": pick(arch.model_type, "model_type", "kimi_k3") if quantized else text_cfg["model_type"],
    }
    if quantized:
        top["quantization_config"] = {"quant_method": pick(q.quant_method, "quantization.quant_method", "mxfp4"),
                                      "format": q.fmt or "mxfp4",
                                      "modules_to_not_convert": ["lm_head", "vision_tower", "self_attn", "shared_experts"]}
    if model.multimodal:
        top |= {"text_config": text_cfg, "vision_config": {"model_type": "moonvit", "hidden_size": 1152,
                                                            "patch_size": 14}}
    else:
        top |= text_cfg
    marks = _bundled_drafts(profile)      # the draft a planned variant takes from the checkpoint: bundled here
    top |= marks
    synthetic += sorted(marks)
    top["_synthetic"] = {"note": "written by gauntlet model synth: structure only, not the real model's numbers",
                         "fields": sorted(set(synthetic)), **({"scaled": scaled} if scaled else {})}
    return top, tensors


def _bundled_drafts(profile: Profile) -> dict[str, Any]:
    """config.json keys that mark a draft bundled in the checkpoint (the first of its engine's
    ``checkpoint_draft.config_keys``, set to the variant's tokens per step), one per planned variant that takes its
    draft from the checkpoint, so the checkpoint is what the profile plans on (Gate 0's variant-draft check)."""
    from gauntlet.steps.engines import engine as engine_of
    marks: dict[str, Any] = {}
    for v in profile.experiments:
        for name in [v.engine] if v.engine else profile.engine_order():
            rule = engine_of(name).checkpoint_draft
            args = profile.engines[name].args.with_change(v.change)
            if rule is not None and rule.needed(args) and args.speculative is not None:
                marks.setdefault(rule.config_keys[0], args.speculative.num_speculative_tokens)
    return marks


# ---------------------------------------------------------------- files

def header_bytes(entries: list[tuple[str, str, tuple[int, ...], int, int]], metadata: dict[str, str]) -> bytes:
    """The safetensors header for (name, dtype, shape, begin, end) entries, padded to 8 bytes like the library."""
    head: dict[str, Any] = {"__metadata__": metadata}
    for name, dtype, shape, b, e in entries:
        head[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [b, e]}
    raw = json.dumps(head, separators=(",", ":")).encode()
    return raw + b" " * (-len(raw) % 8)


def _entries(tensors: list[Tensor]) -> tuple[list[tuple[str, str, tuple[int, ...], int, int]], int]:
    out, off = [], 0
    for name, dtype, shape in tensors:
        nb = _nbytes(dtype, shape)
        out.append((name, dtype, shape, off, off + nb))
        off += nb
    return out, off


def _file_size(tensors: list[Tensor]) -> int:
    entries, data = _entries(tensors)
    return 8 + len(header_bytes(entries, {"format": "pt"})) + data


def _pad_to(tensors: list[Tensor], size: int, name: str) -> list[Tensor]:
    """tensors + a U8 padding tensor so the file is exactly ``size`` bytes (header length is a fixed point)."""
    pad = size - _file_size(tensors) - 64
    for _ in range(8):
        cand = tensors + [(name, "U8", (max(pad, 0),))]
        diff = size - _file_size(cand)
        if diff == 0:
            return cand
        pad += diff
    # header padding to 8 bytes can oscillate; nudge the name length instead
    return _pad_to(tensors, size, name + "_")


def write_sparse_shard(path: Path, tensors: list[Tensor]) -> int:
    """Header written, data region a hole; returns the file size."""
    entries, data = _entries(tensors)
    head = header_bytes(entries, {"format": "pt"})
    size = 8 + len(head) + data
    with open(path, "wb") as fh:
        fh.write(len(head).to_bytes(8, "little"))
        fh.write(head)
        fh.truncate(size)
    return size


def _write_dense_shard(path: Path, tensors: list[Tensor], rng: np.random.Generator) -> None:
    from safetensors import TensorSpec, serialize_file
    keep = []
    specs = {}
    for name, dtype, shape in tensors:
        nb = _nbytes(dtype, shape)
        buf = np.frombuffer(rng.bytes(nb), dtype=np.uint8) if nb else np.zeros(0, np.uint8)
        keep.append(buf)
        specs[name] = TensorSpec(dtype=_NP_NAME[dtype], shape=shape, data_ptr=buf.ctypes.data, data_len=nb)
    serialize_file(specs, str(path), metadata={"format": "pt"})


def _assign(tensors: list[Tensor], n: int) -> list[list[Tensor]]:
    """Contiguous groups, balanced by bytes; never an empty shard."""
    if len(tensors) < n:
        raise ValueError(f"{len(tensors)} tensors cannot fill {n} shards")
    sizes = [_nbytes(d, s) for _, d, s in tensors]
    total = sum(sizes) or 1
    groups: list[list[Tensor]] = [[] for _ in range(n)]
    cum = 0
    for t, nb in zip(tensors, sizes, strict=True):
        groups[min(n - 1, int(cum * n / total))].append(t)
        cum += nb
    if any(not g for g in groups):  # a tensor wider than a shard's share: fall back to counts
        per = len(tensors) / n
        groups = [tensors[round(i * per):round((i + 1) * per)] for i in range(n)]
    return groups


def synth_from_profile(profile: Profile, out: Path, sparse: bool = False, *, total_bytes: int | None = None,
                       seed: int = 0, per_expert: bool = False) -> Path:
    """Write the synthetic model directory at ``out`` and return it.

    ``total_bytes`` (dense mode) pads the shards with random bytes up to about that many bytes in all
    (benchmarks); in sparse mode the total is exactly the profile's ``model.weight_bytes`` when set.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model = profile.model
    target = model.weight_bytes if sparse else total_bytes
    config, tensors = plan_layout(profile, sparse, per_expert, None if sparse else DENSE_MAX_EXPERTS)
    if sparse and target and sum(_nbytes(d, s) for _, d, s in tensors) > target * 0.99:
        config, tensors = plan_layout(profile, False, per_expert)  # a small declared total: small dims, padded up
    n = model.shards or (96 if sparse else 4)
    groups = _assign(tensors, n)
    names = [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    if target:
        sizes = [_file_size(g) for g in groups]
        extra = target - sum(sizes)
        if extra < 256 * n:
            raise ValueError(f"the synthetic structure ({sum(sizes):,} bytes) leaves no room for {target:,} bytes")
        share = extra // n
        for i, g in enumerate(groups):
            want = sizes[i] + share + (extra - share * n if i == n - 1 else 0)
            groups[i] = _pad_to(g, want, f"_synthetic.padding.{i + 1}")
    rng = np.random.default_rng(seed)
    weight_map: dict[str, str] = {}
    data_bytes = 0
    for name, group in zip(names, groups, strict=True):
        path = out / name
        if sparse:
            write_sparse_shard(path, group)
        else:
            _write_dense_shard(path, group, rng)
        for t, d, s in group:
            weight_map[t] = name
            data_bytes += _nbytes(d, s)
    if sparse:
        from safetensors import safe_open
        for name in names:
            with safe_open(str(out / name), framework="numpy"):
                pass
    write_json_atomic(out / "model.safetensors.index.json",
                      {"metadata": {"total_size": data_bytes}, "weight_map": dict(sorted(weight_map.items()))})
    write_json_atomic(out / "config.json", config)
    write_json_atomic(out / "generation_config.json", {"max_new_tokens": 1024, "temperature": 1.0})
    for f in ("tokenizer_config.json", *model.tokenizer_files, *model.processor_files):
        _write_aux(out / f, model.reasoning)
    write_marker(out, revision=model.revision or "synthetic", marker=model.marker)
    return out


def profile_of(profile: Profile, model_dir: Path) -> Profile:
    """The profile the synthetic directory at ``model_dir`` meets: ``profile`` with model.weight_bytes the bytes
    its shards hold (a dense directory is never the declared size) and each field it scaled down (config.json
    ``_synthetic.scaled``) as written, so Gate 0 judges everything else against the profile as it is."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    index = json.loads((Path(model_dir) / "model.safetensors.index.json").read_text())
    model = profile.model.model_dump()
    model["weight_bytes"] = sum((Path(model_dir) / n).stat().st_size for n in set(index["weight_map"].values()))
    for field, value in config.get("_synthetic", {}).get("scaled", {}).items():
        node = model["architecture"]
        *parents, leaf = field.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = value
    return profile.model_copy(update={"model": type(profile.model).model_validate(model)})


def _write_aux(path: Path, reasoning: bool) -> None:
    name = path.name
    if name == "tokenizer_config.json":
        data: Any = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|bos|>", "eos_token": "<|im_end|>",
                     "model_max_length": 1048576, "chat_template": CHAT_TEMPLATE,
                     "added_tokens_decoder": {"0": {"content": "<|bos|>", "special": True}}}
        if reasoning:
            data["think_tokens"] = ["<think>", "</think>"]
    elif name == "tokenizer.json":
        data = {"version": "1.0", "added_tokens": [], "normalizer": None, "pre_tokenizer": None,
                "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []}}
    elif name in ("preprocessor_config.json", "processor_config.json"):
        data = {"image_processor_type": "KimiK3ImageProcessor", "patch_size": 14, "merge_kernel_size": [2, 2],
                "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "in_token_limit": 16384}
    elif name.endswith(".json"):
        data = {"synthetic": True}
    else:
        path.write_text("synthetic\n")
        return
    os.makedirs(path.parent, exist_ok=True)
    write_json_atomic(path, data)
