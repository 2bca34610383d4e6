"""A checkpoint against itself, from the shard headers alone: Gate 0 checks that need no profile expectation.

Pure. Input: preflight's facts (each shard's header as ``tensors`` {name: dtype} and ``shapes``
{name: "d0,d1,..."}, the index's weight_map and its repeated keys), the parsed config.json (or None) and the
profile's :class:`Architecture` (where config fields live; the quantized tensor suffixes). Four checks:

- ``tensor-unique``: every tensor named once in the index's weight_map, once in its shard's header and in
  no other shard's header.
- ``tensor-dtypes``: every tensor against the dtype config.json declares (``dtype`` / ``torch_dtype``) and
  against its *family* (the same name with the layer and expert numbers taken out) in every shard.
  Allowed besides the declared dtype: F32 and integer dtypes for vectors and scalars (at most one
  dimension over 1: norms, biases, router corrections, buffers, kept in full precision by real releases);
  when config.json has a quantization_config, any dtype for packed and scale tensors (the profile's
  ``quantization.*_tensor_suffixes`` and the usual scale/zero-point names) and a quantized storage dtype
  for the other tensors, except in the modules the quantization config leaves unconverted
  (``modules_to_not_convert``, ``ignore``, ...: a plain name matches as a substring, like transformers;
  ``re:`` a regex from the start of the module name; a ``*`` a glob over the module or one it is inside).
- ``tensor-shapes``: the tensors whose dimensions config.json states: ``embed_tokens``/``lm_head``
  [vocab_size, hidden_size]; the final and per-layer norms [hidden_size]; attention projections' input or
  output hidden_size; the dense MLP [intermediate_size, hidden_size]; per-expert projections
  [moe_intermediate_size (else intermediate_size), hidden_size]; the router [experts, hidden_size]; a fused
  experts tensor's first dimension = the expert count. Only float tensors (packed integer tensors have
  other shapes), except the fused experts' first dimension.
- ``tensor-layers``: layer indices under ``<text>layers.N.`` (``<text>`` is where ``embed_tokens.weight``
  lives) within num_hidden_layers (+ num_nextn_predict_layers MTP layers) with every layer present; expert
  indices ``experts.J.`` within the expert count, every MoE layer holding all of them.

A config field that is absent skips its rules (the detail says which were checked); one that is present
but not a positive integer fails. At 150k tensors the per-tensor work is kept to C-level string and
regex passes over each shard's joined names.
"""

from __future__ import annotations

import fnmatch
import operator
import re
from collections import Counter, defaultdict
from itertools import compress, repeat
from typing import Any

from gauntlet.contract import Check
from gauntlet.params.models import Architecture
from gauntlet.steps.model.config_checks import MOE_KEYS, lookup

__all__ = ["consistency_checks", "TORCH_DTYPES"]

# config.json's torch dtype name -> the safetensors header's
TORCH_DTYPES = {"bfloat16": "BF16", "float16": "F16", "half": "F16", "float32": "F32", "float": "F32",
                "float64": "F64", "double": "F64", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2"}
_FLOATS = {"BF16", "F16", "F32", "F64", "F8_E4M3", "F8_E5M2"}
_INTS = {"BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64"}
# what quantized weights are stored as (packed integers, FP8/FP4/FP6 codes, E8M0 scales)
_QUANT_STORAGE = {"U8", "I8", "U16", "I16", "U32", "I32", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4", "F6_E2M3",
                  "F6_E3M2"}
# last name component of a packed or scale tensor in the quantization formats we know (besides the profile's)
_QUANT_PART = re.compile(r"scale|zero|absmax|quant_map|quant_state|blocks$|packed|^qweight$|^g_idx$|^weight_shape$")
_NOT_CONVERTED_KEYS = ("modules_to_not_convert", "ignore", "ignored_layers", "llm_int8_skip_modules",
                       "exclude_modules")
_SHOW = 5
_DIGITS = b"0123456789"
_NUM = re.compile(r"(?<=\.)\d+(?=\.|$)")


def _some(items: list[str], n: int = _SHOW) -> str:
    more = f" and {len(items) - n} more" if len(items) > n else ""
    return "; ".join(items[:n]) + more


def _dims(shape: str) -> list[int]:
    return [int(x) for x in shape.split(",") if x]


def _is_vector(shape: str | None) -> bool:
    return shape is not None and sum(1 for d in _dims(shape) if d > 1) <= 1


def _family(name: str) -> str:
    return _NUM.sub("*", name)


class _Shard:
    """One readable shard header, grouped by dtype once (C-level passes: these run over every tensor)."""

    def __init__(self, name: str, tensors: dict[str, str], shapes: dict[str, str]) -> None:
        self.name, self.tensors, self.shapes = name, tensors, shapes
        names, dts = tuple(tensors), tuple(tensors.values())
        self.groups: dict[str, list[str]] = (
            {dts[0]: list(names)} if len(set(dts)) == 1 else
            {dt: list(compress(names, map(dt.__eq__, dts))) for dt in set(dts)}) if names else {}
        # families with every digit taken out (bytes: translate is C-fast there): a coarse screen (w1 and w3
        # fall together), confirmed by _family
        self.joined = {dt: ("\n" + "\n".join(ns)).encode() for dt, ns in self.groups.items()}
        self.families = {dt: set(j.translate(None, _DIGITS).split(b"\n")[1:]) for dt, j in self.joined.items()}


def _headers(facts: dict[str, Any]) -> list[_Shard]:
    return [_Shard(n, s["tensors"], s.get("shapes") or {}) for n, s in sorted(facts["shards"].items())
            if s.get("tensors") is not None]


# ---------------------------------------------------------------- each tensor once

def _unique(facts: dict[str, Any], shards: list[_Shard]) -> Check:
    probs: list[str] = []
    for dup in (facts.get("index_duplicates") or [])[:_SHOW]:
        probs.append(f"model.safetensors.index.json repeats key {dup}")
    for n, s in sorted(facts["shards"].items()):
        for t in (s.get("duplicate_tensors") or [])[:_SHOW]:
            probs.append(f"shard {n}: its header names {t!r} more than once")
    total = sum(len(s.tensors) for s in shards)
    wm = facts.get("weight_map") or {}
    if len(shards) > 1 and total != len(set().union(*(s.tensors.keys() for s in shards))):
        where: dict[str, list[str]] = defaultdict(list)
        for s in shards:
            for t in s.tensors:
                where[t].append(s.name)
        for t, names in sorted(where.items()):
            if len(names) > 1:
                mapped = f"the index maps it to {wm[t]}" if t in wm else "the index does not name it"
                probs.append(f"{t} is in the headers of {len(names)} shards, {', '.join(names)} ({mapped})")
    if probs:
        return Check("tensor-unique", "fail", "each tensor in exactly one shard", len(probs), _some(probs))
    return Check("tensor-unique", "pass", "each tensor in exactly one shard", total,
                 f"{total:,} tensors, each named once in the index and in exactly one shard header")


# ---------------------------------------------------------------- dtypes

def _declared(config: dict[str, Any] | None, arch: Architecture) -> tuple[str | None, str]:
    """(the safetensors dtype config.json declares or None, where it says so / why none)."""
    if config is None:
        return None, "config.json unreadable"
    value, where = lookup(config, ("dtype", "torch_dtype"), arch.config_prefixes)
    if where is None:
        return None, "config.json declares no dtype (dtype / torch_dtype)"
    st = TORCH_DTYPES.get(value.removeprefix("torch.")) if isinstance(value, str) else None
    if st is None:
        return None, f"config.json {where} = {value!r} names no stored dtype"
    return st, f"config.json {where} = {value!r}"


def _not_converted(qc: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for key in _NOT_CONVERTED_KEYS:
        items = qc.get(key)
        for item in items if isinstance(items, list) else []:
            if not isinstance(item, str) or not item:
                continue
            if item.startswith("re:"):
                out.append(("re", item[3:]))
            elif any(c in item for c in "*?["):
                out.append(("glob", item))
            else:
                out.append(("sub", item))
    return out


def _unconverted(tensor: str, rules: list[tuple[str, str]]) -> bool:
    module = tensor.rsplit(".", 1)[0]
    for kind, pat in rules:
        try:
            if (kind == "sub" and pat in tensor) or (kind == "re" and re.match(pat, module)) or (
                    kind == "glob" and (fnmatch.fnmatchcase(module, pat) or fnmatch.fnmatchcase(module, pat + ".*"))):
                return True
        except re.error:  # a pattern Python cannot read: not ours to judge here
            continue
    return False


def _family_conflicts(shards: list[_Shard], quantized: bool, rules: list[tuple[str, str]]) -> list[str]:
    seen: dict[str, set[bytes]] = defaultdict(set)     # dtype -> tensor name families (bytes, as read)
    for s in shards:
        for dt, fams in s.families.items():
            seen[dt] |= fams
    if len(seen) < 2:
        return []
    counts = Counter(f for fams in seen.values() for f in fams)
    coarse = {f for f, c in counts.items() if c > 1}
    if not coarse:
        return []
    # confirm with the exact family (numbers as *), apart for tensors the quantization leaves unconverted
    members: dict[tuple[str, bool], dict[str, list[tuple[str, str]]]] = defaultdict(lambda: defaultdict(list))
    for s in shards:
        for t, dt in s.tensors.items():
            if t.encode().translate(None, _DIGITS) in coarse:
                members[(_family(t), quantized and _unconverted(t, rules))][dt].append((t, s.name))
    probs = []
    for (fam, _), by_dtype in sorted(members.items()):
        if len(by_dtype) > 1:
            common = max(sorted(by_dtype), key=lambda d: len(by_dtype[d]))
            odd = [f"{t} in shard {n} is {d}" for d, ts in sorted(by_dtype.items()) if d != common for t, n in ts]
            probs.append(f"tensor family {fam} is {common} in {len(by_dtype[common])} tensors, but {_some(odd, 3)}")
    return probs


def _dtypes(shards: list[_Shard], config: dict[str, Any] | None, arch: Architecture) -> Check:
    declared, why = _declared(config, arch)
    qc, _ = lookup(config, "quantization_config", arch.config_prefixes) if config is not None else (None, None)
    quantized = isinstance(qc, dict)
    rules = _not_converted(qc) if isinstance(qc, dict) else []
    q = arch.quantization
    suffixes = tuple(q.packed_tensor_suffixes) + tuple(q.scale_tensor_suffixes)
    observed: Counter[str] = Counter()
    probs: list[str] = []
    for s in shards:
        for dt, names in sorted(s.groups.items()):
            observed[dt] += len(names)
            if declared is None or dt == declared:
                continue
            if quantized:  # packed and scale tensors: any dtype (quant-dtypes judges them against the profile)
                names = list(compress(names, map(operator.not_, map(str.endswith, names, repeat(suffixes)))))
                names = [t for t in names if not _QUANT_PART.search(t.rsplit(".", 1)[-1])]
            for t in names:
                shape = s.shapes.get(t)
                if (dt == "F32" or dt in _INTS) and _is_vector(shape):
                    continue  # a vector or scalar kept in full precision, or a buffer
                if quantized and dt in _QUANT_STORAGE and not _unconverted(t, rules):
                    continue
                probs.append(f"shard {s.name}: {t} is {dt}{f' [{shape}]' if shape is not None else ''}, "
                             f"{why} ({declared})")
    probs += _family_conflicts(shards, quantized, rules)
    expected = declared or "one dtype per tensor family"
    if probs:
        return Check("tensor-dtypes", "fail", expected, dict(observed), _some(probs))
    detail = (f"every tensor {declared} as {why}, or an allowed exception" if declared
              else f"not judged against a declared dtype ({why})")
    return Check("tensor-dtypes", "pass", expected, dict(observed),
                 f"{detail}; every tensor family has one dtype across the {len(shards)} shards")


# ---------------------------------------------------------------- shapes

def _dim(config: dict[str, Any], keys: tuple[str, ...] | str, arch: Architecture, bad: list[str]
         ) -> tuple[int | None, str]:
    """(a positive integer config.json states or None, where: "text_config.hidden_size")."""
    value, where = lookup(config, keys, arch.config_prefixes)
    if where is None:
        return None, keys if isinstance(keys, str) else keys[0]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        bad.append(f"config.json {where} is {value!r}, not a positive integer")
        return None, where
    return value, where


def _text_prefix(shards: list[_Shard]) -> str | None:
    """Where the text model's tensors live: the shortest name ending embed_tokens.weight, less that."""
    end = "embed_tokens.weight"
    names = [t for s in shards for dt, fams in s.families.items() if any(f.endswith(end.encode()) for f in fams)
             for t in compress(s.groups[dt], map(str.endswith, s.groups[dt], repeat(end)))
             if t == end or t.endswith("." + end)]
    return min(names, key=len)[: -len(end)] if names else None


_ANY = "*"      # a dimension not judged
_REST = "..."   # the first dimension only, any rank from 2 up


# the names _shape_rules can match end so (a C-level screen before the regex); fused experts aside
_SHAPE_ENDS = ("embed_tokens.weight", "lm_head.weight", "norm.weight", "_proj.weight", ".w1.weight", ".w2.weight",
               ".w3.weight", "gate.weight", "router.weight", "e_score_correction_bias")
_FUSED = re.compile(r"\.experts\.[A-Za-z_]")
_FUSED_B = re.compile(_FUSED.pattern.encode())


def _shape_rules(p: str) -> tuple[re.Pattern[str], list[tuple[tuple[str, ...], bool]]]:
    """One regex, a named group per rule, and per rule (dimension names, float only)."""
    lp = re.escape(p) + r"layers\.\d+\."
    experts = r"(?:mlp|block_sparse_moe)\.experts\.\d+\."
    rules = (
        (re.escape(p) + r"embed_tokens\.weight", ("vocab_size", "hidden_size"), True),
        (r"(?:.*\.)?lm_head\.weight", ("vocab_size", "hidden_size"), True),
        (re.escape(p) + r"norm\.weight", ("hidden_size",), True),
        (lp + r"(?:input|post_attention)_layernorm\.weight", ("hidden_size",), True),
        (lp + r"self_attn\.[qkv]_proj\.weight", (_ANY, "hidden_size"), True),
        (lp + r"self_attn\.o_proj\.weight", ("hidden_size", _ANY), True),
        (lp + r"mlp\.(?:gate|up)_proj\.weight", ("intermediate_size", "hidden_size"), True),
        (lp + r"mlp\.down_proj\.weight", ("hidden_size", "intermediate_size"), True),
        (lp + experts + r"(?:gate_proj|up_proj|w1|w3)\.weight", ("expert_intermediate_size", "hidden_size"), True),
        (lp + experts + r"(?:down_proj|w2)\.weight", ("hidden_size", "expert_intermediate_size"), True),
        (lp + r"(?:mlp\.gate|block_sparse_moe\.gate|mlp\.router)\.weight", ("experts", "hidden_size"), True),
        (lp + r"mlp\.gate\.e_score_correction_bias", ("experts",), True),
        (lp + r"mlp\.experts\.[A-Za-z_][A-Za-z0-9_]*", ("experts", _REST), False),
    )
    rx = re.compile("|".join(f"(?P<r{i}>{pat})" for i, (pat, _, _) in enumerate(rules)))
    return rx, [(dims, fl) for _, dims, fl in rules]


def _judge_shape(t: str, dt: str, shape: str, dims: tuple[str, ...], d: dict[str, int | None],
                 where: dict[str, str]) -> str | None:
    got = _dims(shape)
    want = [d.get(x) for x in dims]
    if _REST in dims:
        if len(got) >= 2 and got[0] == want[0]:
            return None
        want_s = f"[{want[0]}, ...]"
    else:
        if len(got) == len(want) and all(w is None or w == g for w, g in zip(want, got, strict=True)):
            return None
        want_s = "[" + ", ".join("*" if w is None else str(w) for w in want) + "]"
    says = ", ".join(f"{where[x]} {d[x]}" for x in dict.fromkeys(dims) if d.get(x) is not None)
    return f"{t} is {dt} {got}, config.json {says} make it {want_s}"


def _shapes(shards: list[_Shard], p: str | None, d: dict[str, int | None], where: dict[str, str],
            bad: list[str]) -> Check:
    stated = {where[k]: v for k, v in d.items() if v is not None and k != "expert_intermediate_size"}
    if p is None:
        return Check("tensor-shapes", "fail" if bad else "skip", None, None, _some(bad) if bad else
                     "no <prefix>embed_tokens.weight: the text model's tensor names are not a layout these checks know")
    rx, rules = _shape_rules(p)
    probs = list(bad)
    checked = 0
    for s in shards:
        for dt, names in s.groups.items():
            is_float = dt in _FLOATS
            if is_float:
                cands = list(compress(names, map(str.endswith, names, repeat(_SHAPE_ENDS))))
            else:
                cands = []
            if any(_FUSED_B.search(f) for f in s.families[dt]):   # any dtype: only where one can match
                cands += [t for t in names if ".experts." in t and _FUSED.search(t)]
            for t in cands:
                m = rx.fullmatch(t)
                if m is None:
                    continue
                group = m.lastgroup            # r<i>: the rule whose pattern matched
                if group is None:
                    continue
                dims, float_only = rules[int(group[1:])]
                if (float_only and not is_float) or not any(d.get(x) is not None for x in dims):
                    continue
                checked += 1
                prob = _judge_shape(t, dt, s.shapes.get(t, ""), dims, d, where)
                if prob:
                    probs.append(f"shard {s.name}: {prob}")
    if probs:
        return Check("tensor-shapes", "fail", stated, len(probs), _some(probs))
    if not stated:
        return Check("tensor-shapes", "skip", None, None, "config.json states none of hidden_size, vocab_size, "
                     "intermediate_size, moe_intermediate_size, the expert count")
    return Check("tensor-shapes", "pass", stated, checked, f"{checked:,} tensor shapes agree with config.json "
                 + ", ".join(f"{k} {v}" for k, v in stated.items()))


# ---------------------------------------------------------------- layer and expert indices

def _ranges(xs: list[int]) -> str:
    out: list[str] = []
    start: int | None = xs[0]
    for a, b in zip(xs, [*xs[1:], None], strict=True):
        if b != a + 1:
            out.append(str(start) if start == a else f"{start}-{a}")
            start = b
    return ", ".join(out[:_SHOW]) + (f" and {len(out) - _SHOW} more ranges" if len(out) > _SHOW else "")


def _layers(shards: list[_Shard], p: str | None, layers: int | None, nextn: int, experts: int | None,
            experts_key: str) -> Check:
    expected = {"num_hidden_layers": layers, "experts": experts}
    if p is None:
        return Check("tensor-layers", "skip", expected, None, "no <prefix>embed_tokens.weight: layer names unknown")
    # one string per match ("5" or "5.mlp.experts.12"), deduplicated before Python looks at it: 150k tensors
    rx = re.compile(b"\n" + re.escape(p.encode()) + rb"layers\.(\d+(?:\.(?:mlp|block_sparse_moe)\.experts\.\d+)?)\.")
    where: dict[int, str] = {}
    per_layer: dict[int, set[int]] = defaultdict(set)
    for s in shards:
        for m in set().union(*(rx.findall(j) for j in s.joined.values())):
            layer, _, expert = m.partition(b".")
            where.setdefault(int(layer), s.name)
            if expert:
                per_layer[int(layer)].add(int(expert.rpartition(b".")[2]))
    if not where:
        return Check("tensor-layers", "skip", expected, None, f"no tensor under {p}layers.N.")
    probs: list[str] = []
    if layers is not None:
        limit = layers + nextn
        mtp = f" + num_nextn_predict_layers {nextn}" if nextn else ""
        probs += [f"shard {where[i]} holds layer {i} ({p}layers.{i}.*), config.json num_hidden_layers {layers}{mtp} "
                  f"ends at layer {limit - 1}" for i in sorted(where) if i >= limit]
        missing = [i for i in range(layers) if i not in where]
        if missing:
            probs.append(f"no shard holds layer{'s' if len(missing) > 1 else ''} {_ranges(missing)} "
                         f"({p}layers.N.*) of the {layers} config.json num_hidden_layers states")
    if experts is not None:
        for i, js in sorted(per_layer.items()):
            beyond = sorted(j for j in js if j >= experts)
            if beyond:
                probs.append(f"layer {i} has expert {_ranges(beyond)} ({p}layers.{i}.*.experts.{beyond[0]}.*), "
                             f"config.json {experts_key} is {experts} (experts 0-{experts - 1})")
            missing = [j for j in range(experts) if j not in js]
            if missing:
                probs.append(f"layer {i} lacks expert{'s' if len(missing) > 1 else ''} {_ranges(missing)} of the "
                             f"{experts} config.json {experts_key} states (no {p}layers.{i}.*.experts.{missing[0]}.* "
                             "tensor)")
    observed = {"layers": len(where), "moe_layers": len(per_layer)}
    if probs:
        return Check("tensor-layers", "fail", expected, observed, _some(probs))
    if layers is None and (experts is None or not per_layer):
        return Check("tensor-layers", "skip", expected, observed,
                     "config.json states neither num_hidden_layers nor an expert count")
    said = [f"layers 0-{max(where)}" + (f" (the last {nextn} MTP)" if layers is not None and max(where) >= layers
                                         else "")]
    if per_layer and experts is not None:
        said.append(f"{len(per_layer)} layers with experts 0-{experts - 1}")
    return Check("tensor-layers", "pass", expected, observed, f"{', '.join(said)}, as config.json states")


def consistency_checks(facts: dict[str, Any], config: dict[str, Any] | None, arch: Architecture) -> list[Check]:
    """tensor-unique, tensor-dtypes, tensor-shapes, tensor-layers: see the module docstring."""
    shards = _headers(facts)
    if not shards:
        return [Check(n, "skip", None, None, "no shard header could be read (see shard-headers)")
                for n in ("tensor-unique", "tensor-dtypes", "tensor-shapes", "tensor-layers")]
    checks = [_unique(facts, shards), _dtypes(shards, config, arch)]
    if config is None:
        return checks + [Check(n, "skip", None, None, "config.json unreadable: no dimensions to judge against")
                         for n in ("tensor-shapes", "tensor-layers")]
    bad: list[str] = []
    d: dict[str, int | None] = {}
    where: dict[str, str] = {}
    for k, keys in (("hidden_size", "hidden_size"), ("vocab_size", "vocab_size"),
                    ("intermediate_size", "intermediate_size"), ("moe_intermediate_size", "moe_intermediate_size"),
                    ("experts", MOE_KEYS["n_routed_experts"]), ("layers", "num_hidden_layers")):
        d[k], where[k] = _dim(config, keys, arch, bad)
    inter = "moe_intermediate_size" if d["moe_intermediate_size"] else "intermediate_size"
    d["expert_intermediate_size"], where["expert_intermediate_size"] = d[inter], where[inter]
    layers = d.pop("layers")
    nextn, _ = lookup(config, "num_nextn_predict_layers", arch.config_prefixes)
    nextn = nextn if isinstance(nextn, int) and not isinstance(nextn, bool) and nextn > 0 else 0
    p = _text_prefix(shards)
    return checks + [_shapes(shards, p, d, where, bad),
                     _layers(shards, p, layers, nextn, d["experts"], where["experts"])]
