"""Pure judgement of a model directory's facts (gathered by :func:`gauntlet.steps.gates.preflight.gather`).

Each function takes the facts dict (and the profile's :class:`ModelSpec`) and
returns :class:`Check` objects whose detail names the file and the cause.
"""

from __future__ import annotations

from collections import Counter
from itertools import compress, repeat
from typing import Any

from gauntlet.params.models import ModelSpec
from gauntlet.contract import Check
from gauntlet.steps.model.expectations import unknown
from gauntlet.steps.model.marker import is_checksum_file
from gauntlet.steps.model.shards import PARTIAL_SUFFIX

__all__ = ["INDEX_NAME", "layout_checks", "index_by_shard"]

INDEX_NAME = "model.safetensors.index.json"
_SHOW = 5


def _some(items: list[str], n: int = _SHOW) -> str:
    more = f" and {len(items) - n} more" if len(items) > n else ""
    return "; ".join(items[:n]) + more


def index_by_shard(weight_map: dict[str, Any]) -> dict[str, set[str]]:
    lists: dict[str, list[str]] = {}
    for tensor, shard in weight_map.items():  # lists, then sets: at 150k tensors set.add per item is slower
        got = lists.get(shard)
        if got is None:
            lists[shard] = got = []
        got.append(tensor)
    return {shard: set(ts) for shard, ts in lists.items()}


def _file_check(name: str, files: dict[str, dict[str, Any]], required: list[str], what: str) -> Check:
    bad = []
    for f in required:
        info = files.get(f) or {}
        if not info.get("present"):
            bad.append(f"{f} is missing")
        elif info.get("error"):
            bad.append(f"{f}: {info['error']}")
    if bad:
        return Check(name, "fail", required, [f for f in required if (files.get(f) or {}).get("present")],
                     _some(bad))
    return Check(name, "pass", required, required, f"{what} present and parse: {', '.join(required)}")


def _chat_template(facts: dict[str, Any], spec: ModelSpec) -> Check:
    files = facts["files"]
    sources = []
    problems = []
    for name in ("chat_template.jinja", "chat_template.json"):
        info = files.get(name) or {}
        if info.get("present"):
            if info.get("error"):
                problems.append(f"{name}: {info['error']}")
            elif not info.get("size"):
                problems.append(f"{name} is empty")
            else:
                sources.append(name)
    tc = (files.get("tokenizer_config.json") or {}).get("json")
    if isinstance(tc, dict):
        t = tc.get("chat_template")
        if (isinstance(t, str) and t.strip()) or (isinstance(t, list) and t):
            sources.append("tokenizer_config.json chat_template")
    syntax = facts.get("chat_template_syntax")
    if syntax:
        problems.append(syntax)
    if not spec.chat_template_required:
        return Check("chat-template", "skip", None, sources, "not required by the profile "
                     "(model.chat_template_required is false)")
    if problems:
        return Check("chat-template", "fail", "a chat template that parses", sources, _some(problems))
    if not sources:
        return Check("chat-template", "fail", "chat_template.jinja or tokenizer_config.json chat_template", None,
                     "no chat template: neither chat_template.jinja nor a chat_template in tokenizer_config.json")
    return Check("chat-template", "pass", "a chat template", sources, f"found in {', '.join(sources)}")


def _index_checks(facts: dict[str, Any]) -> list[Check]:
    idx = facts["files"].get(INDEX_NAME) or {}
    if facts.get("single_file"):
        return [Check("index-json", "pass", INDEX_NAME, "model.safetensors",
                      "single-file model (model.safetensors, no index)")]
    if not idx.get("present"):
        return [Check("index-json", "fail", INDEX_NAME, None, f"{INDEX_NAME} is missing")]
    if idx.get("error"):
        return [Check("index-json", "fail", INDEX_NAME, None, f"{INDEX_NAME}: {idx['error']}")]
    if facts.get("index_error"):
        return [Check("index-json", "fail", INDEX_NAME, None, f"{INDEX_NAME}: {facts['index_error']}")]
    n = len(facts["weight_map"])
    return [Check("index-json", "pass", INDEX_NAME, f"{n} tensors", f"weight_map names {n} tensors in "
                  f"{len(facts['shards'])} shards")]


def _header_kind(error: str) -> str:
    if "beyond what its header declares" in error:
        return "has trailing bytes"
    if "not fully covered" in error or "shorter than" in error:
        return "truncated"
    if error.startswith("cannot read"):
        return "unreadable"
    if "length prefix" in error or "too large" in error:
        return "has an absurd header length"
    return "has a corrupt header"


def _shard_checks(facts: dict[str, Any]) -> list[Check]:
    shards: dict[str, dict[str, Any]] = facts["shards"]
    checks: list[Check] = []
    paths = [f"{n}: {s['path_problem']}" if not s["path_problem"].startswith(n) else s["path_problem"]
             for n, s in shards.items() if s.get("path_problem")]
    checks.append(Check("index-paths", "fail" if paths else "pass", "shard paths inside the model directory",
                        len(paths), _some(paths) if paths else "every shard path is a plain name inside the directory"))
    gone = []
    for n, s in shards.items():
        if s.get("path_problem"):
            continue
        if s.get("missing"):
            gone.append(f"shard {n} is missing")
        elif s.get("not_regular"):
            gone.append(f"shard {n} is a {s['not_regular']}, not a regular file")
        elif s.get("stat_error"):
            gone.append(f"shard {n}: {s['stat_error']}")
        elif s.get("size") == 0:
            gone.append(f"shard {n} is empty (0 bytes)")
    checks.append(Check("shards-exist", "fail" if gone else "pass", len(shards), len(shards) - len(gone),
                        _some(gone) if gone else f"all {len(shards)} shards are non-empty regular files"))
    strays = sorted(facts.get("strays", []))
    checks.append(Check("shard-set", "fail" if strays else "pass", sorted(shards)[:3] + (["..."] if len(shards) > 3 else []),
                        strays, ("files the index does not name: " + _some(strays)) if strays
                        else "the directory holds exactly the shards the index names"))
    bad = [f"shard {n} {_header_kind(s['error'])}: {s['error']}" for n, s in shards.items() if s.get("error")]
    checked = [n for n, s in shards.items() if s.get("tensors") is not None]
    checks.append(Check("shard-headers", "fail" if bad else "pass", len(shards), len(checked),
                        _some(bad) if bad else f"{len(checked)} headers open with safetensors.safe_open"))
    return checks


def _tensor_checks(facts: dict[str, Any]) -> list[Check]:
    if facts.get("weight_map") is None:
        return []
    wm = facts["weight_map"]
    by_shard = index_by_shard(wm)
    probs: list[str] = []
    for n, s in sorted(facts["shards"].items()):
        tensors = s.get("tensors")
        if tensors is None:
            continue
        want = by_shard.get(n, set())
        if tensors.keys() == want:
            continue
        missing = sorted(want.difference(tensors))
        extra = sorted(set(tensors).difference(want))
        if missing:
            probs.append(f"shard {n}: {len(missing)} tensor(s) the index maps to it are missing from its header, "
                         f"e.g. {missing[0]!r}")
        elsewhere = [t for t in extra if t in wm]
        if elsewhere:
            probs.append(f"shard {n}: {len(elsewhere)} tensor(s) in its header the index maps to another shard, "
                         f"e.g. {elsewhere[0]!r} (index: {wm[elsewhere[0]]})")
        extra = [t for t in extra if t not in wm]
        if extra:
            probs.append(f"shard {n}: {len(extra)} tensor(s) in its header are not in the index, e.g. {extra[0]!r}")
    return [Check("index-tensors", "fail" if probs else "pass", "index == shard headers", len(probs),
                  _some(probs) if probs else "every shard holds exactly the tensors the index maps to it")]


def _dtype_checks(facts: dict[str, Any], spec: ModelSpec) -> list[Check]:
    q = spec.architecture.quantization
    out = []
    for label, suffixes, want in (("weight", q.packed_tensor_suffixes, q.weight_dtypes),
                                  ("scale", q.scale_tensor_suffixes, q.scale_dtypes)):
        seen: Counter[str] = Counter()
        wrong: list[str] = []
        suf = tuple(suffixes)
        for n, s in sorted(facts["shards"].items()):
            tensors = s.get("tensors") or {}
            # C-level at 150k tensors: the dtypes of the names that end so, then names only where one is wrong
            here = Counter(compress(tensors.values(), map(str.endswith, tensors, repeat(suf))))
            seen.update(here)
            if want and len(wrong) < _SHOW and not set(here).issubset(want):
                wrong += [f"{t} in {n} is {dt}" for t, dt in tensors.items()
                          if dt not in want and t.endswith(suf)][:_SHOW - len(wrong)]
        name = f"quant-dtypes.{label}"
        observed = dict(seen)
        if not want:
            out.append(unknown(name, observed, f" from the released checkpoint (its {label} tensors: "
                                               f"{sorted(observed) or 'none'})"))
        elif not seen:
            out.append(Check(name, "fail", want, observed, f"no tensor ends with {' or '.join(suffixes)}: expected "
                             f"packed {label}s in {'/'.join(want)}"))
        elif wrong:
            out.append(Check(name, "fail", want, observed, f"{label} dtype not in {want}: {_some(wrong)}"))
        else:
            out.append(Check(name, "pass", want, observed, f"{sum(seen.values())} {label} tensors, dtypes {sorted(seen)}"))
    return out


def _marker_checks(facts: dict[str, Any], spec: ModelSpec) -> list[Check]:
    m = facts["marker"]
    if not m.get("present"):
        return [Check("marker", "fail", spec.marker, None,
                      f"completion marker {spec.marker} is missing: the copy may be incomplete; run prewarm")]
    if m.get("error"):
        return [Check("marker", "fail", spec.marker, None, f"{spec.marker}: {m['error']}")]
    checks = [Check("marker", "pass", spec.marker, spec.marker, f"{spec.marker} present")]
    manifest = (m.get("data") or {}).get("files")
    if manifest is None:
        checks.append(Check("marker-manifest", "skip", None, None, f"{spec.marker} carries no manifest"))
        return checks
    entries = facts["entries"]
    probs = []
    for rel, size in sorted(manifest.items()):
        e = entries.get(rel)
        if e is None:
            probs.append(f"{rel} is in the manifest but missing")
        elif e["type"] != "file":
            probs.append(f"{rel} is a {e['type']}, the manifest lists a file")
        elif e["size"] != size:
            probs.append(f"{rel} is {e['size']} bytes, the manifest says {size}")
    # a manifest of shards only (some sync tools) vouches for the shard set; a full one for every file
    shards_only = all(rel.endswith(".safetensors") for rel in manifest)
    extra = sorted(rel for rel, e in entries.items() if e["type"] == "file" and rel not in manifest
                   and rel != spec.marker and not is_checksum_file(rel) and not rel.endswith(PARTIAL_SUFFIX)
                   and (not shards_only or rel.endswith(".safetensors")))
    probs += [f"{rel} is not in the manifest" for rel in extra]
    checks.append(Check("marker-manifest", "fail" if probs else "pass", len(manifest), len(manifest) - len(probs),
                        _some(probs) if probs else f"all {len(manifest)} manifest files present with their sizes"))
    return checks


def _totals(facts: dict[str, Any], spec: ModelSpec) -> list[Check]:
    n = len(facts["shards"])
    total = sum(s.get("size") or 0 for s in facts["shards"].values() if not s.get("path_problem"))
    out = []
    for name, want, got, unit, field in (("shard-count", spec.shards, n, "shards", "shards"),
                                         ("weight-bytes", spec.weight_bytes, total, "bytes", "weight_bytes")):
        if want is None:
            out.append(unknown(name, got, f" (observed {got:,} {unit})"))
        elif want == got:
            out.append(Check(name, "pass", want, got, f"{got:,} {unit}"))
        else:
            out.append(Check(name, "fail", want, got, f"{got:,} {unit}, profile model.{field} expects {want:,} "
                             f"({got - want:+,})"))
    return out


def _revision(facts: dict[str, Any], spec: ModelSpec) -> Check:
    rev, src = facts.get("revision"), facts.get("revision_source")
    if spec.revision is None:
        return unknown("revision", rev, f" (observed {rev!r} from {src})" if rev else
                       " (none recorded in the model directory)")
    if rev is None:
        return Check("revision", "fail", spec.revision, None,
                     "no revision recorded (marker revision, .cache/huggingface metadata or config _commit_hash)")
    return Check.compare("revision", spec.revision, rev,
                         "" if rev != spec.revision else f"{rev} (from {src})")


def layout_checks(facts: dict[str, Any], spec: ModelSpec) -> list[Check]:
    """Index, shards, tensors, dtypes, tokenizer, processor, chat template, marker, totals, revision."""
    checks = _index_checks(facts)
    checks += _shard_checks(facts)
    checks += _tensor_checks(facts)
    checks += _dtype_checks(facts, spec)
    checks.append(_file_check("tokenizer-files", facts["files"], list(spec.tokenizer_files), "tokenizer files"))
    if spec.processor_files:
        checks.append(_file_check("processor-files", facts["files"], list(spec.processor_files), "processor files"))
    else:
        checks.append(Check("processor-files", "skip", [], None, "not required by the profile "
                            "(model.processor_files is empty)"))
    checks.append(_chat_template(facts, spec))
    checks += _marker_checks(facts, spec)
    checks += _totals(facts, spec)
    checks.append(_revision(facts, spec))
    return checks
