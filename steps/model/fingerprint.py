"""The model fingerprint: what "same model on every node" means, without hashing 1.56 TB.

sha256 over the bytes of the config, index, tokenizer and processor files plus
each shard's (name, size, sha256 of its header bytes). The header names every
tensor with its dtype, shape and byte offsets, so a different, re-quantized or
re-sharded model changes it; a flipped bit inside the data region does not
(that is what the sync tool's object checksums are for).

Components are kept apart so a mismatch can say *what* differs.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

__all__ = ["COMPONENTS", "component_of", "fingerprint", "fingerprint_diff", "extract_fingerprint"]

CONFIG_FILES = ("config.json", "generation_config.json")
INDEX_FILES = ("model.safetensors.index.json",)
TOKENIZER_HINTS = ("tokenizer", "tiktoken", "special_tokens_map.json", "chat_template", "vocab", "merges.txt")
PROCESSOR_HINTS = ("preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json")
COMPONENTS = ("config", "index", "tokenizer", "processor")


def component_of(name: str) -> str | None:
    """Which fingerprint component a small file belongs to (None: not fingerprinted)."""
    base = name.rsplit("/", 1)[-1]
    if base in CONFIG_FILES:
        return "config"
    if base in INDEX_FILES:
        return "index"
    if base in PROCESSOR_HINTS:
        return "processor"
    if any(base.startswith(h) or base == h for h in TOKENIZER_HINTS):
        return "tokenizer"
    return None


def _h(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def fingerprint(files: dict[str, dict[str, Any]], shards: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Pure: files {name: {sha256}} and shards {name: {size, header_sha256}} -> the fingerprint record."""
    parts: dict[str, dict[str, str | None]] = {c: {} for c in COMPONENTS}
    for name, f in sorted(files.items()):
        comp = component_of(name)
        if comp is not None and f.get("sha256"):
            parts[comp][name] = f["sha256"]
    components = {c: _h(v) if v else None for c, v in parts.items()}
    shard_part = {n: {"size": s.get("size"), "header_sha256": s.get("header_sha256")} for n, s in sorted(shards.items())}
    components["shards"] = _h(shard_part)
    return {"sha256": _h({"components": components}), "components": components,
            "files": {c: dict(v) for c, v in parts.items()}, "shards": shard_part}


def extract_fingerprint(doc: Any) -> dict[str, Any] | None:
    """The fingerprint from a preflight verdict.json, a metrics dict, or a bare fingerprint JSON."""
    if not isinstance(doc, dict):
        return None
    if isinstance(doc.get("metrics"), dict):
        doc = doc["metrics"]
    if isinstance(doc.get("fingerprint"), dict):
        doc = doc["fingerprint"]
    if isinstance(doc.get("sha256"), str) and isinstance(doc.get("components"), dict):
        return doc
    return None


def fingerprint_diff(a: dict[str, Any], b: dict[str, Any], limit: int = 5) -> list[str]:
    """Pure: what differs between two fingerprints, most specific first ("shard X header differs")."""
    if a.get("sha256") == b.get("sha256"):
        return []
    out: list[str] = []
    ca, cb = a.get("components", {}), b.get("components", {})
    for comp in COMPONENTS:
        if ca.get(comp) != cb.get(comp):
            fa, fb = a.get("files", {}).get(comp, {}), b.get("files", {}).get(comp, {})
            names = sorted(n for n in set(fa) | set(fb) if fa.get(n) != fb.get(n))
            out.append(f"{comp} differs" + (f" ({', '.join(names[:limit])})" if names else ""))
    sa, sb = a.get("shards", {}), b.get("shards", {})
    if ca.get("shards") != cb.get("shards") or sa != sb:
        diffs = []
        for n in sorted(set(sa) | set(sb)):
            x, y = sa.get(n), sb.get(n)
            if x == y:
                continue
            if x is None or y is None:
                diffs.append(f"shard {n} only on one side")
            elif x.get("size") != y.get("size"):
                diffs.append(f"shard {n} size {x.get('size')} vs {y.get('size')}")
            else:
                diffs.append(f"shard {n} header differs")
        more = f" and {len(diffs) - limit} more" if len(diffs) > limit else ""
        out.append("; ".join(diffs[:limit]) + more if diffs else "shards differ")
    return out or ["fingerprint differs"]
