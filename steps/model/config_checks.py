"""config.json against the profile's :class:`gauntlet.params.models.Architecture`: pure functions.

Fields are looked up under each of ``config_prefixes`` in order (``""`` is the
top level, ``"text_config."`` the language model of a multimodal config); the
first prefix that has the field wins.

How ``layer_kinds`` is read (the first source found under a prefix):

1. ``layer_types``: one string per layer (Qwen3-Next, gpt-oss, Gemma style);
   the kinds are the strings, counted.
2. ``linear_attn_config``: every ``<kind>_layers`` list in it (Kimi-Linear style
   ``{kda_layers: [...], full_attn_layers: [...]}``) gives kind ``<kind>`` with
   ``len(list)`` layers; the lists must be disjoint and, when
   ``num_hidden_layers`` is known, cover exactly that many layers.

Raw kind names then go through ``architecture.layer_kind_aliases`` (e.g.
``full_attn: mla``), so the profile states kinds in its own words.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from gauntlet.params.models import Architecture
from gauntlet.contract import Check
from gauntlet.steps.model.expectations import unknown

__all__ = ["lookup", "read_layer_kinds", "read_quantization", "config_checks", "MOE_KEYS"]

# config spellings of the MoE numbers, first match wins
MOE_KEYS = {
    "n_routed_experts": ("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts"),
    "n_shared_experts": ("n_shared_experts", "num_shared_experts"),
    "num_experts_per_tok": ("num_experts_per_tok", "num_experts_per_token", "experts_per_token", "moe_topk"),
}
_FORMAT_METHODS = ("mxfp4", "nvfp4", "fp8", "mxfp8")
_MISSING = object()


def _sub(config: dict[str, Any], prefix: str) -> Any:
    node: Any = config
    for part in [p for p in prefix.split(".") if p]:
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node if isinstance(node, dict) else _MISSING


def lookup(config: dict[str, Any], keys: tuple[str, ...] | str, prefixes: list[str]) -> tuple[Any, str | None]:
    """(value, "prefix.key") of the first key found under the first prefix that has one; (None, None) if absent."""
    keys = (keys,) if isinstance(keys, str) else keys
    for prefix in prefixes:
        node = _sub(config, prefix)
        if node is _MISSING:
            continue
        for k in keys:
            if k in node:
                return node[k], f"{prefix}{k}"
    return None, None


def read_layer_kinds(config: dict[str, Any], arch: Architecture) -> tuple[dict[str, int] | None, str | None, str | None]:
    """(kind counts, where, problem). counts None when no per-layer field exists."""
    aliases = arch.layer_kind_aliases
    n_layers, _ = lookup(config, "num_hidden_layers", arch.config_prefixes)
    for prefix in arch.config_prefixes:
        node = _sub(config, prefix)
        if node is _MISSING:
            continue
        types = node.get("layer_types")
        if isinstance(types, list):
            counts = Counter(aliases.get(str(t), str(t)) for t in types)
            problem = None
            if isinstance(n_layers, int) and len(types) != n_layers:
                problem = f"{prefix}layer_types has {len(types)} entries for {n_layers} layers"
            return dict(sorted(counts.items())), f"{prefix}layer_types", problem
        lac = node.get("linear_attn_config")
        if isinstance(lac, dict):
            lists = {k[: -len("_layers")]: v for k, v in lac.items() if k.endswith("_layers") and isinstance(v, list)}
            if not lists:
                continue
            counts = Counter[str]()
            seen: Counter[Any] = Counter()
            for kind, idx in lists.items():
                counts[aliases.get(kind, kind)] += len(idx)
                seen.update(idx)
            problem = None
            dup = sorted(i for i, c in seen.items() if c > 1)
            if dup:
                problem = f"{prefix}linear_attn_config lists layers {dup[:5]} under more than one kind"
            elif isinstance(n_layers, int) and len(seen) != n_layers:
                problem = f"{prefix}linear_attn_config covers {len(seen)} layers of {n_layers}"
            return dict(sorted(counts.items())), f"{prefix}linear_attn_config", problem
    return None, None, None


def read_quantization(config: dict[str, Any], arch: Architecture) -> tuple[dict[str, Any] | None, str | None]:
    """({quant_method, fmt}, where) from quantization_config; fmt falls back to config_groups' format,
    then to a quant_method that is itself a format name (gpt-oss style ``quant_method: mxfp4``)."""
    qc, where = lookup(config, "quantization_config", arch.config_prefixes)
    if not isinstance(qc, dict):
        return None, where
    method = qc.get("quant_method")
    fmt = qc.get("format") or qc.get("fmt")
    if fmt is None and isinstance(qc.get("config_groups"), dict):
        fmts = {g.get("format") for g in qc["config_groups"].values() if isinstance(g, dict) and g.get("format")}
        fmt = fmts.pop() if len(fmts) == 1 else (sorted(fmts) if fmts else None)
    if fmt is None and isinstance(method, str) and method.lower() in _FORMAT_METHODS:
        fmt = method
    return {"quant_method": method, "fmt": fmt}, where


def _unknown(name: str, observed: Any, where: str | None) -> Check:
    """A null expectation (steps/model/expectations.py decides what it becomes for the run)."""
    return unknown(name, observed, f" from the released config (config.json {where} = {observed!r})" if where
                   else " from the released config")


def _judge(name: str, field: str, expected: Any, observed: Any, where: str | None, prefixes: list[str],
           *, norm=lambda v: v, missing_hint: str = "") -> Check:
    if expected is None:
        return _unknown(name, observed, where)
    if where is None:
        looked = ", ".join(repr(p) for p in prefixes)
        return Check(name, "fail", expected, None,
                     f"config.json has no {missing_hint or field.rsplit('.', 1)[-1]} (looked under {looked})")
    if norm(expected) == norm(observed):
        return Check(name, "pass", expected, observed, f"config.json {where} = {observed!r}")
    return Check(name, "fail", expected, observed,
                 f"config.json {where} is {observed!r}, profile model.architecture.{field} expects {expected!r}")


def _lower(v: Any) -> Any:
    if isinstance(v, str):
        return v.lower()
    if isinstance(v, list):
        return sorted(_lower(x) for x in v)
    return v


def config_checks(config: dict[str, Any], arch: Architecture) -> list[Check]:
    """One check per expectation: pass, fail (naming the config field) or skip (unknown expectation)."""
    p = arch.config_prefixes
    checks: list[Check] = []
    for field in ("architectures", "model_type", "num_hidden_layers", "max_position_embeddings"):
        value, where = lookup(config, field, p)
        norm = (lambda v: sorted(v) if isinstance(v, list) else v) if field == "architectures" else (lambda v: v)
        checks.append(_judge(f"config.{field}", field, getattr(arch, field), value, where, p, norm=norm))

    kinds, where, problem = read_layer_kinds(config, arch)
    if problem:         # the config contradicts itself: whatever the profile expects (nothing to discover either)
        checks.append(Check("config.layer_kinds", "fail", arch.layer_kinds, kinds, problem))
    elif arch.layer_kinds is None:
        checks.append(_unknown("config.layer_kinds", kinds, where))
    elif kinds is None:
        checks.append(Check("config.layer_kinds", "fail", arch.layer_kinds, None,
                            "config.json has no per-layer kind field (looked for layer_types and "
                            f"linear_attn_config.<kind>_layers under {', '.join(repr(x) for x in p)})"))
    else:
        checks.append(_judge("config.layer_kinds", "layer_kinds", arch.layer_kinds, kinds, where, p))

    for field, keys in MOE_KEYS.items():
        value, where = lookup(config, keys, p)
        checks.append(_judge(f"config.moe.{field}", f"moe.{field}", getattr(arch.moe, field), value, where, p,
                             missing_hint=" or ".join(keys)))

    q, qwhere = read_quantization(config, arch)
    for field in ("quant_method", "fmt"):
        expected = getattr(arch.quantization, field)
        observed = q.get(field) if q else None
        where = f"{qwhere}.{'format' if field == 'fmt' else field}" if q and observed is not None else None
        hint = "quantization_config" if q is None else f"quantization_config.{'format' if field == 'fmt' else field}"
        checks.append(_judge(f"config.quantization.{field}", f"quantization.{field}", expected, observed, where, p,
                             norm=_lower, missing_hint=hint))
    return checks
