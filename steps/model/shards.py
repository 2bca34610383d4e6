"""Reading safetensors shard headers cheaply, and keeping paths inside the model directory.

A shard is judged from its header alone: the 8-byte length prefix, the JSON
header (hashed for the fingerprint) and :func:`safetensors.safe_open`, which
rejects truncation ("incomplete metadata, file not fully covered") and bad
headers without reading the data region. A length prefix larger than the file
is refused before anything is allocated for it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat as _stat
from collections import Counter
from pathlib import Path, PurePosixPath
from typing import Any

__all__ = ["MAX_HEADER_BYTES", "PARTIAL_SUFFIX", "read_header", "index_path_problem", "resolve_inside",
           "walk_entries"]

# safetensors' own limit (MAX_HEADER_SIZE); a longer prefix is corruption, not a header
MAX_HEADER_BYTES = 100_000_000
# prewarm's temporary names: `.<name><PARTIAL_SUFFIX>`; a leftover one is a stray
PARTIAL_SUFFIX = ".gauntlet-partial"


# the layout every safetensors writer we know emits: "name":{"dtype":"X","shape":[..],...}. Used only when it
# provably found every entry (one per "data_offsets" key, no escapes anywhere in the header); otherwise the
# header is parsed in full. At 150k tensors json.loads is the slow part of the whole gate.
_ENTRY_RE = re.compile(r'"([^"]*)":\{"dtype":"([^"]*)","shape":\[([0-9,]*)\]')


def tensor_table(raw: bytes) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """({name: dtype}, {name: "d0,d1,..."}, names the header holds more than once) from a header's JSON.

    Shapes stay strings (parsed only where a check needs one): at 150k tensors ints for all would cost."""
    text = raw.decode("utf-8", errors="replace")
    if "\\" not in text:
        found = _ENTRY_RE.findall(text)
        if len(found) == text.count('"data_offsets":'):
            dtypes = {n: d for n, d, _ in found}
            if len(dtypes) == len(found):
                return dtypes, {n: s for n, _, s in found}, []
    dupes: list[str] = []

    def once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        # called innermost first: what the last call (the top-level object) leaves is the tensor names
        d = dict(pairs)
        dupes[:] = sorted(k for k, n in Counter(k for k, _ in pairs).items() if n > 1) if len(d) < len(pairs) else []
        return d

    header = json.loads(text, object_pairs_hook=once)
    if not isinstance(header, dict) or not all(isinstance(v, dict) for v in header.values()):
        raise ValueError("not an object of tensor entries")
    header.pop("__metadata__", None)
    dupes = [k for k in dupes if k != "__metadata__"]
    shapes = {k: ",".join(str(x) for x in v.get("shape") or []) for k, v in header.items()}
    return {k: v.get("dtype") for k, v in header.items()}, shapes, dupes


def _declared_size(raw: bytes) -> int | None:
    try:
        header = json.loads(raw)
        ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
        return 8 + len(raw) + max(ends, default=0)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None


def _os_error(exc: OSError) -> str:
    if isinstance(exc, PermissionError):
        return "cannot read: permission denied"
    return f"cannot read: {exc.strerror or exc}"


def read_header(path: Path, *, tensors: bool = True) -> dict[str, Any]:
    """Facts about one shard: size, header length and sha256, tensors {name: dtype}, error (str or None).

    Never raises for a bad file: the error names the cause in a sentence a person can act on.
    """
    facts: dict[str, Any] = {"size": None, "header_len": None, "header_sha256": None, "tensors": None,
                             "data_bytes": None, "error": None}
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            facts["size"] = size
            if size < 8:
                facts["error"] = f"file is {size} bytes, shorter than the 8-byte safetensors length prefix"
                return facts
            n = int.from_bytes(fh.read(8), "little")
            facts["header_len"] = n
            # checked before reading: a corrupt prefix must not make us allocate petabytes
            if n > size - 8:
                facts["error"] = (f"header length prefix {n} is larger than the {size - 8} bytes after it "
                                  "(corrupt prefix or truncated file)")
                return facts
            if n > MAX_HEADER_BYTES:
                facts["error"] = f"header length prefix {n} exceeds safetensors' {MAX_HEADER_BYTES}-byte limit"
                return facts
            raw = fh.read(n)
    except OSError as exc:
        facts["error"] = _os_error(exc)
        return facts
    facts["header_sha256"] = hashlib.sha256(raw).hexdigest()
    try:
        from safetensors import safe_open
        with safe_open(str(path), framework="numpy"):
            pass
    except Exception as exc:  # SafetensorError and friends: the library's words are the cause
        msg = str(exc).removeprefix("Error while deserializing header: ")
        facts["error"] = f"safetensors says {msg!r}"
        if "not fully covered" in msg:  # say which way: short of what the header declares, or longer
            facts["declared_size"] = _declared_size(raw)
            if facts["declared_size"] is not None:
                diff = size - facts["declared_size"]
                facts["error"] += (f" ({-diff:,} bytes short of the {facts['declared_size']:,} its header declares)"
                                   if diff < 0 else f" ({diff:,} bytes beyond what its header declares)")
        return facts
    if tensors:
        try:
            facts["tensors"], facts["shapes"], dupes = tensor_table(raw)
        except (ValueError, AttributeError) as exc:  # safe_open accepted it, so unexpected; still no traceback
            facts["error"] = f"header is not JSON: {exc}"
            return facts
        if dupes:  # json keeps the last; safetensors accepts an exact repeat
            facts["duplicate_tensors"] = dupes
    facts["data_bytes"] = size - 8 - n
    return facts


def index_path_problem(name: str) -> str | None:
    """Why an index's shard name may not be used as a path inside the model dir, or None."""
    if not isinstance(name, str) or not name:
        return f"shard name {name!r} is not a non-empty string"
    if "\\" in name or "\x00" in name:
        return f"shard name {name!r} contains a backslash or NUL"
    p = PurePosixPath(name)
    if p.is_absolute():
        return f"shard name {name!r} is an absolute path"
    if ".." in p.parts:
        return f"shard name {name!r} climbs out with '..'"
    return None


def resolve_inside(root: Path, name: str) -> tuple[Path, str | None]:
    """The real path of ``root/name`` and why it is not usable (outside the root, a symlink loop), or None."""
    root_real = Path(os.path.realpath(root))
    p = root / name
    try:
        real = Path(os.path.realpath(p, strict=False))
    except (OSError, RuntimeError) as exc:
        return p, f"{name}: cannot resolve: {exc}"
    if real != root_real and root_real not in real.parents:
        return real, f"{name} resolves to {real}, outside the model directory"
    return real, None


def walk_entries(root: Path, *, skip_dirs: tuple[str, ...] = ()) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Every entry under root (not following symlinks): {relpath: {type, size}}, plus listing errors."""
    entries: dict[str, dict[str, Any]] = {}
    errors: list[str] = []

    def onerror(exc: OSError) -> None:
        errors.append(f"{exc.filename}: {_os_error(exc)}")

    for dirpath, dirnames, filenames in os.walk(root, onerror=onerror):
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir != "." and rel_dir.split(os.sep)[0] in skip_dirs:
            dirnames[:] = []
            continue
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            try:
                st = os.lstat(full)
            except OSError as exc:
                errors.append(f"{rel}: {_os_error(exc)}")
                continue
            if _stat.S_ISLNK(st.st_mode):
                kind = "symlink"
            elif _stat.S_ISREG(st.st_mode):
                kind = "file"
            elif _stat.S_ISDIR(st.st_mode):
                kind = "dir"
            else:
                kind = "other"
            entries[rel] = {"type": kind, "size": st.st_size if kind == "file" else None}
    return entries, errors
