"""Gate 0's expectations a profile may leave null, and what a null one becomes: pure.

Each check below compares the model directory with one profile field. Left null, the field is checked by
nobody, so what its check says depends on the run:

- a test profile (``purpose: test``): a skip, "unknown expectation: fill <field>" with what the directory holds;
- a cluster profile (``purpose: cluster``, the default): a failure naming the field. A real cluster's run must
  not pass Gate 0 while checking nothing: fill the field from the released config, or
- a discovery run (``gauntlet step preflight --discover``): a pass, "discovered: <field> = <value>", with the
  value the directory holds; :func:`snippet` writes every discovered value as the YAML to paste into the
  profile (preflight's ``discovered.yaml``).

On either, a field the checkpoint does not have (no MoE numbers in a dense model's config.json, no
quantization_config, no per-layer kinds, no packed tensors) is a skip saying so: null is then the right
value, and nothing is left unchecked. The revision, the shard count and the bytes every checkpoint has: a
cluster profile states them, and a revision the directory does not record fails even a discovery run.

:func:`unknown` makes the check of a null field (the judges in ``config_checks.py`` and ``checks.py`` call it);
:func:`settle` decides it for the run.
"""

from __future__ import annotations

from typing import Any, Literal

import yaml

from gauntlet.contract import Check
from gauntlet.params.models import ModelSpec

__all__ = ["FIELDS", "UNKNOWN", "Handling", "handling", "unknown", "settle", "snippet"]

UNKNOWN = "unknown expectation"
Handling = Literal["report", "require", "discover"]
_EVERY_CHECKPOINT = ("revision", "shard-count", "weight-bytes")     # no checkpoint lacks these

# Gate 0 check -> the profile field (under model.) it compares the directory with
FIELDS: dict[str, str] = {
    "config.architectures": "architecture.architectures",
    "config.model_type": "architecture.model_type",
    "config.num_hidden_layers": "architecture.num_hidden_layers",
    "config.max_position_embeddings": "architecture.max_position_embeddings",
    "config.layer_kinds": "architecture.layer_kinds",
    "config.moe.n_routed_experts": "architecture.moe.n_routed_experts",
    "config.moe.n_shared_experts": "architecture.moe.n_shared_experts",
    "config.moe.num_experts_per_tok": "architecture.moe.num_experts_per_tok",
    "config.quantization.quant_method": "architecture.quantization.quant_method",
    "config.quantization.fmt": "architecture.quantization.fmt",
    "quant-dtypes.weight": "architecture.quantization.weight_dtypes",
    "quant-dtypes.scale": "architecture.quantization.scale_dtypes",
    "shard-count": "shards",
    "weight-bytes": "weight_bytes",
    "revision": "revision",
}


def handling(purpose: str, discover: bool) -> Handling:
    """What a null expectation becomes: discovered on a discovery run, a failure on a cluster profile, else
    reported."""
    if discover:
        return "discover"
    return "require" if purpose == "cluster" else "report"


def unknown(name: str, observed: Any, seen: str = "") -> Check:
    """The check of a null expectation, until :func:`settle` decides it (``seen``: what the directory says)."""
    return Check(name, "skip", None, observed, f"{UNKNOWN}: fill model.{FIELDS[name]}{seen}")


def _value(spec: ModelSpec, path: str) -> Any:
    node: Any = spec
    for part in path.split("."):
        node = getattr(node, part)
    return node


def _found(name: str, observed: Any) -> Any:
    """The profile value the directory holds for ``name``'s field (``observed`` is not empty), or None when it is
    not one value."""
    if name.startswith("quant-dtypes."):          # observed: {dtype: count} of the packed/scale tensors
        return sorted(observed) if isinstance(observed, dict) and observed else None
    if name == "config.quantization.fmt" and not isinstance(observed, str):
        return None                                # several formats in config_groups: not one value
    return observed


def settle(checks: list[Check], spec: ModelSpec, how: Handling) -> tuple[list[Check], dict[str, Any]]:
    """Decide every check whose profile field is null (pure): kept as reported, failed, or discovered.
    Returns the checks and {field under model.: the value discovered}."""
    out: list[Check] = []
    discovered: dict[str, Any] = {}
    for c in checks:
        field = FIELDS.get(c.name)
        if field is None or c.status != "skip" or _value(spec, field) not in (None, []) or how == "report":
            out.append(c)
            continue
        hint = c.detail.split(f"fill model.{field}", 1)[-1]       # where the directory says it (unknown())
        if c.observed in (None, [], {}, "") and c.name not in _EVERY_CHECKPOINT:
            out.append(Check(c.name, "skip", None, c.observed,
                             f"model.{field} is null and the model directory states none either: not a field "
                             "of this checkpoint, nothing to check"))
            continue
        if how == "require":
            out.append(Check(c.name, "fail", f"model.{field}", c.observed,
                             f"model.{field} is null: a cluster profile leaves no Gate 0 expectation unknown; fill "
                             f"it{hint}, or run Gate 0 with --discover to record what this model directory holds"))
            continue
        value = _found(c.name, c.observed)
        if value is None:      # a revision recorded nowhere; several quantization formats
            out.append(Check(c.name, "fail", f"model.{field}", c.observed,
                             f"model.{field} is null and --discover found no one value to record: fill it{hint}"))
            continue
        discovered[field] = value
        out.append(Check(c.name, "pass", None, value,
                         f"discovered: model.{field} = {value!r}, as this model directory holds it "
                         "(discovered.yaml carries it for the profile)"))
    return out, discovered


def snippet(discovered: dict[str, Any], profile: str, where: str) -> str:
    """The YAML to paste under the profile's ``model:``, each field nested as the profile nests it."""
    tree: dict[str, Any] = {}
    for field in sorted(discovered, key=list(FIELDS.values()).index):
        node = tree
        *parents, leaf = field.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = discovered[field]
    head = (f"# Gate 0 preflight --discover read these from {where}: the expectations profile {profile} leaves\n"
            "# null. Check each against the release, then merge them into the profile's model: section.\n")
    return head + yaml.safe_dump({"model": tree}, sort_keys=False, default_flow_style=False)
