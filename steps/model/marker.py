"""The completion marker (``.aik8s-complete``) and its manifest.

Format (JSON, written last and atomically by whoever finished the directory)::

    {"revision": "<commit or null>", "files": {"<relpath>": <size in bytes>, ...}, "created": "<ISO 8601>"}

``files`` lists every regular file under the model directory except the marker
itself and the sync tool's checksum files (evidence, not model). A marker that
is empty or plain text (an older sync tool) means "complete, no manifest".
"""

from __future__ import annotations

import json
import posixpath
from pathlib import Path
from typing import Any

from gauntlet.contract import now_iso, write_json_atomic
from gauntlet.params.models import DEFAULT_MARKER
from gauntlet.steps.model.shards import PARTIAL_SUFFIX, walk_entries

__all__ = ["DEFAULT_MARKER", "CHECKSUM_FILES", "CHECKSUM_SUFFIXES", "is_checksum_file", "build_manifest",
           "write_marker", "parse_marker"]

# object-level checksum files a sync tool may leave beside the model; attached as evidence, never recomputed
CHECKSUM_FILES = (".aik8s-checksums.json", "checksums.json", "MD5SUMS", "SHA256SUMS", "md5sum.txt")
CHECKSUM_SUFFIXES = (".md5", ".sha256")


def is_checksum_file(relpath: str) -> bool:
    name = relpath.rsplit("/", 1)[-1]
    return name in CHECKSUM_FILES or name.endswith(CHECKSUM_SUFFIXES)


def build_manifest(model_dir: Path, marker: str = DEFAULT_MARKER) -> dict[str, int]:
    """{relpath: size} of the regular files the marker vouches for."""
    entries, errors = walk_entries(Path(model_dir))
    if errors:
        raise OSError(f"cannot list {model_dir}: {errors[0]}")
    return {rel: e["size"] for rel, e in sorted(entries.items())
            if e["type"] == "file" and rel != marker and not is_checksum_file(rel)
            and not rel.endswith(PARTIAL_SUFFIX)}


def write_marker(model_dir: Path, revision: str | None = None, marker: str = DEFAULT_MARKER) -> Path:
    """Write the marker with a manifest of the directory as it is now; atomic (temp + rename)."""
    model_dir = Path(model_dir)
    data = {"revision": revision, "files": build_manifest(model_dir, marker), "created": now_iso()}
    return write_json_atomic(model_dir / marker, data)


def _manifest(raw: Any) -> dict[str, int] | None:
    """{name: size} from a mapping or a list of {name|path, size}; None when it is neither."""
    if isinstance(raw, dict):
        items = list(raw.items())
    elif isinstance(raw, list) and all(isinstance(x, dict) for x in raw):
        items = [(x.get("name", x.get("path")), x.get("size")) for x in raw]
    else:
        return None
    out = {}
    for name, size in items:
        if not isinstance(name, str) or not isinstance(size, int) or isinstance(size, bool):
            return None
        out[posixpath.normpath(name)] = size
    return out


def parse_marker(text: str) -> tuple[dict[str, Any] | None, str | None]:
    """(data, error): data is {} for an empty/plain-text marker, the JSON object otherwise.

    The manifest is read from ``files`` (ours) or ``shards`` (a sync tool that lists only shards), as a
    ``{name: size}`` mapping or a list of ``{name|path, size}``, and normalized into ``data["files"]``.
    """
    stripped = text.strip()
    if not stripped.startswith("{"):
        return {"text": stripped[:200]} if stripped else {}, None
    try:
        data = json.loads(stripped)
    except ValueError as exc:
        return None, f"marker looks like JSON but does not parse: {exc}"
    if not isinstance(data, dict):
        return None, "marker JSON is not an object"
    for key in ("files", "shards"):
        if data.get(key) is not None:
            files = _manifest(data[key])
            if files is None:
                return None, f"marker {key!r} is not a {{name: size}} mapping or a list of {{name, size}}"
            return {**data, "files": files}, None
    return data, None
