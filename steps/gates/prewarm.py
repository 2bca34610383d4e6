"""Prewarm: copy the model from the CFS copy to this node's NVMe cache, resumably; the only step that reads CFS.

Order of work, so that a directory carrying the marker is always complete:

1. read the source (listing, marker manifest, shard headers) and the destination (sizes, header hashes);
2. plan (pure): a file already present with the right size and header hash (shards) or bytes hash (small
   files) is skipped; refuse when the free space cannot hold what is left to copy;
3. remove the destination's marker, then copy with ``--streams`` parallel streams, each to
   ``.<name>.gauntlet-partial``, and check the copy's size and header against the source; every
   ``SYNC_BATCH_BYTES`` (and at the end) make the batch durable with one ``syncfs`` (one cache flush, not
   one per file: what ``cp -r && sync`` costs) and rename it to the final names;
4. fsync the directory and write the marker with its manifest last, atomically, and only when all succeeded.

For a local profile with ``model.prepare`` (and no ``--src``) the "source" is a recipe:
``gauntlet.steps.model.local.prepare`` builds the directory and writes the marker itself.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib
import os
import shutil
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from gauntlet.contract import Check, TransientError, UsageError
from gauntlet.params.models import DEFAULT_MARKER, Profile
from gauntlet.steps.gate import Needs
from gauntlet.steps.options import GateOptions, option
from gauntlet.steps.model.marker import build_manifest, is_checksum_file, parse_marker, write_marker
from gauntlet.steps.model.shards import PARTIAL_SUFFIX, read_header, walk_entries

__all__ = ["NAME", "HELP", "NEEDS", "Options", "run", "write_marker", "plan_copy", "CopyItem",
           "prewarm"]

NAME = "prewarm"
HELP = "copy the model from CFS to the node's NVMe cache (parallel, resumable, verified; marker last)"
NEEDS = Needs(model_cache="write", size="large", per_node=True)

INDEX = "model.safetensors.index.json"
HASH_LIMIT = 64 << 20        # small files are compared by content; bigger non-shard files by size
RESERVE_BYTES = 1 << 30      # keep this much free beyond the copy
SYNC_BATCH_BYTES = 4 << 30   # syncfs + rename after this many copied bytes (and at the end)
CHUNK = 64 << 20             # copy_file_range step: how often a stream looks at the stop flag
_STOP = threading.Event()    # set on SIGTERM/^C: streams abandon their temp files


def _load_sync_file_range() -> Callable[..., int] | None:
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    return fn


# start writeback of each copied chunk at once (SYNC_FILE_RANGE_WRITE), so the final fsync has little left
# to do and the disk writes while the next chunk is copied, as the kernel's background writeback does for cp
_SYNC_FILE_RANGE = _load_sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2


def _start_writeback(fd: int, off: int, n: int) -> None:
    if _SYNC_FILE_RANGE is not None:
        _SYNC_FILE_RANGE(fd, off, n, _SYNC_FILE_RANGE_WRITE)


@dataclass(frozen=True, kw_only=True)
class Options(GateOptions):
    src: str | None = option(None, help="source model directory (default: the profile's model.source_path)")
    dst: str | None = option(None, help="destination (default: the profile's model.host_cache_path)")
    streams: int = option(4, ge=1, le=256, help="parallel copy streams, 1 to 256 (default: 4)")
    allow_unmarked_src: bool = option(False, help="copy even when the source has no completion marker")
    delete_extras: bool = option(False, help="delete files in the destination that the source does not have")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.streams < 1:
            raise UsageError(f"--streams must be at least 1, got {self.streams}")
        if self.src is None and not self.runs_recipe and self.the_profile.model.source_path is None:
            raise UsageError("prewarm: no --src and the profile has no model.source_path")

    @property
    def runs_recipe(self) -> bool:
        """A local profile with a recipe and no --src: the recipe builds the directory (no copy)."""
        p = self.the_profile
        return self.src is None and p.hardware.kind == "local" and bool(p.model.prepare)


@dataclass(frozen=True)
class CopyItem:
    name: str
    size: int
    shard: bool
    action: str          # "copy" or "skip"
    reason: str


def _abs(p: str) -> Path:
    q = Path(p)
    return q if q.is_absolute() else Path.cwd() / q


def _sha256(path: Path) -> str | None:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
    except OSError:
        return None
    return h.hexdigest()


# ---------------------------------------------------------------- read (I/O)

def read_side(root: Path, marker: str, names: list[str] | None = None, shards: set[str] | None = None
              ) -> dict[str, Any]:
    """Facts of one side: files {name: {size, header_sha256 | sha256, error}}, marker, listing errors."""
    facts: dict[str, Any] = {"root": str(root), "exists": root.is_dir(), "files": {}, "marker": None,
                             "errors": [], "partials": []}
    if not facts["exists"]:
        return facts
    entries, errors = walk_entries(root)
    facts["errors"] = errors
    facts["entries"] = {k: v for k, v in entries.items() if v["type"] == "file"}
    facts["partials"] = sorted(k for k in entries if k.endswith(PARTIAL_SUFFIX))
    if names is None:
        names = sorted(k for k, v in entries.items() if v["type"] == "file" and k != marker
                       and not k.endswith(PARTIAL_SUFFIX))
    for name in names:
        e = entries.get(name)
        if e is None or e["type"] != "file":
            continue
        if shards is not None and name in shards:
            h = read_header(root / name, tensors=False)
            facts["files"][name] = {"size": h["size"], "header_sha256": h["header_sha256"], "error": h["error"]}
        else:
            info = {"size": e["size"], "sha256": None, "error": None}
            if e["size"] <= HASH_LIMIT:
                info["sha256"] = _sha256(root / name)
                if info["sha256"] is None:
                    info["error"] = "cannot read"
            facts["files"][name] = info
    mp = root / marker
    if mp.is_file():
        try:
            data, err = parse_marker(mp.read_text(errors="replace"))
        except OSError as exc:
            data, err = None, f"cannot read: {exc.strerror}"
        facts["marker"] = {"data": data, "error": err}
    return facts


def _src_shards(root: Path) -> tuple[set[str], str | None]:
    import json
    p = root / INDEX
    try:
        wm = json.loads(p.read_text()).get("weight_map")
    except FileNotFoundError:
        return ({"model.safetensors"} if (root / "model.safetensors").is_file() else set()), None
    except (OSError, ValueError, AttributeError) as exc:
        return set(), f"{INDEX}: {exc}"
    if not isinstance(wm, dict):
        return set(), f"{INDEX}: no weight_map"
    return set(wm.values()), None


# ---------------------------------------------------------------- plan (pure)

def plan_copy(src: dict[str, Any], dst: dict[str, Any], shards: set[str]) -> list[CopyItem]:
    """What to copy and what is already there (same size and same header / content hash)."""
    items = []
    for name, s in sorted(src["files"].items()):
        d = dst["files"].get(name)
        shard = name in shards
        if d is None:
            items.append(CopyItem(name, s["size"], shard, "copy", "absent"))
        elif d.get("error") or d["size"] != s["size"]:
            items.append(CopyItem(name, s["size"], shard, "copy", f"size {d['size']} != {s['size']}"
                                  if not d.get("error") else f"unreadable: {d['error']}"))
        elif shard and d.get("header_sha256") != s.get("header_sha256"):
            items.append(CopyItem(name, s["size"], shard, "copy", "header differs"))
        elif not shard and s.get("sha256") != d.get("sha256"):
            items.append(CopyItem(name, s["size"], shard, "copy", "content differs"))
        else:
            items.append(CopyItem(name, s["size"], shard, "skip", "same size and hash"))
    return items


def _src_checks(src: dict[str, Any], shards: set[str], marker: str, index_error: str | None,
                allow_unmarked: bool) -> list[Check]:
    checks = []
    if index_error:
        checks.append(Check("src-index", "fail", INDEX, None, f"source {index_error}"))
    elif not shards:
        checks.append(Check("src-index", "fail", INDEX, None, f"source {src['root']} has no {INDEX} and no model.safetensors"))
    m = src["marker"]
    if m is None:
        checks.append(Check("src-complete", "skip" if allow_unmarked else "fail", marker, None,
                            f"source has no {marker}: the CFS copy may be incomplete"
                            + (" (--allow-unmarked-src)" if allow_unmarked else "; pass --allow-unmarked-src to copy anyway")))
    elif m["error"]:
        checks.append(Check("src-complete", "fail", marker, None, f"source {marker}: {m['error']}"))
    else:
        manifest = (m["data"] or {}).get("files")
        probs = []
        if manifest:
            have = src.get("entries", {})
            probs = [f"{n}: {have[n]['size'] if n in have else 'missing'} vs manifest {sz}"
                     for n, sz in sorted(manifest.items()) if have.get(n, {}).get("size") != sz]
        checks.append(Check("src-complete", "fail" if probs else "pass", marker, len(probs),
                            ("source does not match its marker manifest: " + "; ".join(probs[:5])) if probs
                            else f"source marker present{' with a matching manifest' if manifest else ''}"))
    bad = [f"{n}: {f['error']}" for n, f in sorted(src["files"].items()) if n in shards and f.get("error")]
    missing = sorted(shards - set(src["files"]))
    bad += [f"{n} is missing" for n in missing]
    checks.append(Check("src-shards", "fail" if bad else "pass", len(shards), len(shards) - len(bad),
                        ("source shards are bad, nothing copied: " + "; ".join(bad[:5])) if bad
                        else f"{len(shards)} source shard headers valid"))
    return checks


# ---------------------------------------------------------------- copy (I/O)

def _temp_of(final: Path) -> Path:
    """Where a file is copied before it is verified, made durable and renamed to ``final``."""
    return final.with_name(f".{final.name}{PARTIAL_SUFFIX}")


def _copy_one(src: Path, dst_dir: Path, item: CopyItem, want_header: str | None
              ) -> tuple[CopyItem, Path, str | None]:
    """Copy to a temp name and verify it (size, header) through the page cache. (item, temp, error or None).

    The temp is made durable and renamed by :func:`_commit`, a batch at a time.
    """
    final = dst_dir / item.name
    tmp = _temp_of(final)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        with open(src / item.name, "rb") as fin, open(tmp, "wb") as fout:
            _copy_fd(fin.fileno(), fout.fileno(), item.size)
        size = tmp.stat().st_size
        if size != item.size:
            raise OSError(f"copied {size} bytes, source has {item.size}")
        if item.shard:
            h = read_header(tmp, tensors=False)
            if h["error"]:
                raise OSError(f"copy fails the header check: {h['error']}")
            if h["header_sha256"] != want_header:
                raise OSError("copy's header differs from the source's")
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        return item, tmp, str(exc) if not getattr(exc, "strerror", None) else f"{exc.strerror}: {exc.filename or ''}"
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return item, tmp, None


def _load_syncfs() -> Callable[..., int] | None:
    try:
        fn = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int,)
    return fn


_SYNCFS = _load_syncfs()


def _sync_dst(dst_dir: Path) -> None:
    """Make every copied byte on dst's filesystem durable: one syncfs (one cache flush) for the batch."""
    if _SYNCFS is None:
        os.sync()
        return
    fd = os.open(dst_dir, os.O_RDONLY)
    try:
        if _SYNCFS(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"syncfs: {os.strerror(err)}")
    finally:
        os.close(fd)


def _commit(dst_dir: Path, pending: list[tuple[Path, Path]]) -> None:
    """Durable first, then the final names, then the directory entries."""
    if not pending:
        return
    _sync_dst(dst_dir)
    for tmp, final in pending:
        os.replace(tmp, final)
    for d in {final.parent for _, final in pending}:
        _fsync_dir(d)
    pending.clear()


def _copy_fd(fin: int, fout: int, size: int) -> None:
    """In-kernel copy (copy_file_range, then sendfile), falling back to read/write."""
    off = 0
    try:
        while off < size:
            if _STOP.is_set():
                raise InterruptedError("interrupted")
            n = os.copy_file_range(fin, fout, min(CHUNK, size - off))
            if n == 0:
                break
            _start_writeback(fout, off, n)
            off += n
        if off >= size:
            return
    except InterruptedError:
        raise
    except OSError:  # EXDEV/ENOSYS/EINVAL on older kernels or odd filesystems
        pass
    os.lseek(fin, off, os.SEEK_SET)
    os.lseek(fout, off, os.SEEK_SET)
    os.ftruncate(fout, off)
    while chunk := os.read(fin, 8 << 20):
        if _STOP.is_set():
            raise InterruptedError("interrupted")
        os.write(fout, chunk)


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _free_bytes(d: Path) -> int:
    p = d
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


def prewarm(src_dir: Path, dst_dir: Path, *, marker: str = DEFAULT_MARKER, streams: int = 4,
            revision: str | None = None, allow_unmarked_src: bool = False, delete_extras: bool = False,
            reserve_bytes: int = RESERVE_BYTES) -> tuple[list[Check], dict[str, Any]]:
    """The whole copy; returns checks and metrics. The marker is written only when every check passed."""
    t0 = time.monotonic()
    if not src_dir.is_dir():
        return [Check("src", "fail", "a readable source directory", str(src_dir),
                      f"source {src_dir} does not exist or is not a directory")], {}
    shards, index_error = _src_shards(src_dir)
    src = read_side(src_dir, marker, shards=shards)
    checks = [Check("src", "fail" if src["errors"] else "pass", str(src_dir), len(src["files"]),
                    "; ".join(src["errors"][:3]) or f"{len(src['files'])} files in the source")]
    checks += _src_checks(src, shards, marker, index_error, allow_unmarked_src)
    names = sorted(src["files"])
    dst = read_side(dst_dir, marker, names=names, shards=shards)
    plan = plan_copy(src, dst, shards)
    todo = [i for i in plan if i.action == "copy"]
    need = sum(i.size for i in todo)
    metrics: dict[str, Any] = {"src": str(src_dir), "dst": str(dst_dir), "streams": streams,
                               "files": len(plan), "files_to_copy": len(todo), "bytes_to_copy": need,
                               "files_skipped": len(plan) - len(todo)}
    extras = sorted(set(dst.get("entries", {})) - set(names) - {marker}
                    - {p for p in dst.get("entries", {}) if is_checksum_file(p) or p.endswith(PARTIAL_SUFFIX)})
    if extras and delete_extras:
        for e in extras:
            (dst_dir / e).unlink(missing_ok=True)
        checks.append(Check("dst-extras", "pass", [], extras, f"deleted {len(extras)} files the source lacks"))
    else:
        checks.append(Check("dst-extras", "fail" if extras else "pass", [], extras,
                            (f"destination has files the source lacks: {', '.join(extras[:5])}; remove them or pass "
                             "--delete-extras") if extras else "no files beyond the source's"))
    free = _free_bytes(dst_dir)
    enough = free >= need + (reserve_bytes if need else 0)
    checks.append(Check("free-space", "pass" if enough else "fail", need + (reserve_bytes if need else 0), free,
                        f"{need:,} bytes to copy, {free:,} free on {dst_dir}" if enough else
                        f"refusing to copy: {need:,} bytes (+{reserve_bytes:,} reserve) needed, only {free:,} free "
                        f"on the filesystem of {dst_dir}; free space or pick another --dst"))
    if any(c.status == "fail" for c in checks):
        return checks, metrics

    dst_dir.mkdir(parents=True, exist_ok=True)
    marker_ok = _marker_matches(dst_dir, marker, names)
    if todo or not marker_ok:
        (dst_dir / marker).unlink(missing_ok=True)  # a directory being changed must not look complete
        _fsync_dir(dst_dir)
    for p in dst.get("partials", []):  # leftovers of an interrupted run
        (dst_dir / p).unlink(missing_ok=True)
    t_copy = time.monotonic()
    errors: list[str] = []
    if todo:
        _STOP.clear()
        pool = ThreadPoolExecutor(max_workers=max(1, streams))
        pending: list[tuple[Path, Path]] = []
        pending_bytes = 0
        try:
            futures = [pool.submit(_copy_one, src_dir, dst_dir, i, src["files"][i.name].get("header_sha256"))
                       for i in sorted(todo, key=lambda i: -i.size)]
            for f in as_completed(futures):
                item, tmp, err = f.result()
                if err:
                    errors.append(f"{item.name}: {err}")
                    continue
                pending.append((tmp, dst_dir / item.name))
                pending_bytes += item.size
                if pending_bytes >= SYNC_BATCH_BYTES:  # bounded loss on a crash; big shards commit one by one
                    _commit(dst_dir, pending)
                    pending_bytes = 0
            _commit(dst_dir, pending)   # verified copies keep their names even when another one failed
        except BaseException:
            _STOP.set()  # running streams drop their temp files; queued ones never start
            pool.shutdown(wait=True, cancel_futures=True)
            # no stream runs now: drop every temp of this copy, the committed-to-be (pending) and the ones a
            # stream finished but the loop had not taken yet when the signal came
            for item in todo:
                _temp_of(dst_dir / item.name).unlink(missing_ok=True)
            raise
        pool.shutdown(wait=True)
    secs = time.monotonic() - t_copy
    metrics |= {"copy_seconds": round(secs, 3), "bytes_copied": need if not errors else None,
                "throughput_bytes_per_s": round(need / secs) if todo and secs > 0 and not errors else None}
    checks.append(Check("copy", "fail" if errors else "pass", len(todo), len(todo) - len(errors),
                        ("copy failed, no marker written: " + "; ".join(errors[:5])) if errors else
                        (f"copied {len(todo)} files, {need:,} bytes in {secs:.1f} s with {streams} streams, "
                         f"skipped {len(plan) - len(todo)} already present" if todo else
                         f"nothing to copy: all {len(plan)} files present with the right size and hash")))
    if errors:
        return checks, metrics
    if not marker_ok or todo:
        src_rev = ((src["marker"] or {}).get("data") or {}).get("revision")
        write_marker(dst_dir, revision=revision or src_rev, marker=marker)
        _fsync_dir(dst_dir)
        checks.append(Check("marker", "pass", marker, marker, f"wrote {marker} with a manifest of {len(names)} files"))
    else:
        checks.append(Check("marker", "pass", marker, marker, f"{marker} already matches the directory"))
    metrics["seconds"] = round(time.monotonic() - t0, 3)
    return checks, metrics


def _marker_matches(dst_dir: Path, marker: str, names: list[str]) -> bool:
    try:
        data, err = parse_marker((dst_dir / marker).read_text())
    except OSError:
        return False
    files = (data or {}).get("files")
    if err or not files:
        return False
    try:
        return files == build_manifest(dst_dir, marker) and set(files) >= {n for n in names if not is_checksum_file(n)}
    except OSError:
        return False


# ---------------------------------------------------------------- local recipe

def _prepare_local(profile: Profile, dst: Path) -> tuple[list[Check], dict[str, Any]]:
    try:
        mod = importlib.import_module("gauntlet.steps.model.local")
    except ImportError as exc:
        return [Check("prepare", "fail", "gauntlet.steps.model.local", None,
                      f"cannot import steps.model.local ({exc}); it builds the local model "
                      f"(`gauntlet model prepare {profile.model.prepare}`)")], {}
    t0 = time.monotonic()
    try:
        path = Path(mod.prepare(profile.model.prepare, cache=str(dst.parent)))
    except (UsageError, TransientError):
        raise
    except Exception as exc:  # the recipe's own failure, as one line
        return [Check("prepare", "fail", profile.model.prepare, None,
                      f"prepare {profile.model.prepare!r} failed: {type(exc).__name__}: {exc}".splitlines()[0])], {}
    secs = round(time.monotonic() - t0, 3)
    real = path if path.is_absolute() else Path.cwd() / path
    checks = [Check("prepare", "pass" if real.resolve() == dst.resolve() else "fail", str(dst), str(real),
                    f"recipe {profile.model.prepare!r} built {real} in {secs} s" if real.resolve() == dst.resolve()
                    else f"recipe returned {real}, but the profile's model.host_cache_path is {dst}")]
    marker = profile.marker_name
    has_marker = (real / marker).is_file()
    checks.append(Check("marker", "pass" if has_marker else "fail", marker, has_marker,
                        f"{marker} present" if has_marker else f"the recipe left no {marker} in {real}"))
    return checks, {"dst": str(real), "seconds": secs, "prepare": profile.model.prepare}


def _on_term(signum: int, frame: FrameType | None) -> NoReturn:  # Argo stops a pod with SIGTERM: unwind like ^C (temp files removed, no marker)
    raise KeyboardInterrupt


def run(opts: Options, out: Path) -> tuple[list[Check], dict[str, Any]]:
    profile = opts.the_profile
    dst = _abs(opts.dst or profile.model.host_cache_path)
    if opts.runs_recipe:
        return _prepare_local(profile, dst)
    src = opts.src or profile.model.source_path     # one of them is set: Options refused the other case
    signal.signal(signal.SIGTERM, _on_term)
    return prewarm(_abs(src), dst, marker=profile.marker_name, streams=opts.streams,  # type: ignore[arg-type]
                   revision=profile.model.revision, allow_unmarked_src=opts.allow_unmarked_src,
                   delete_extras=opts.delete_extras)
