"""The results store: every measured round plus run metadata, as a Parquet dataset.

Layout under the store's root (a local directory, or any URI pyarrow's
``FileSystem.from_uri`` understands, e.g. ``s3://bucket/prefix`` with
``?endpoint_override=...&scheme=http`` for an S3-compatible server)::

    <root>/rounds/profile=<p>/engine=<e>/date=<YYYY-MM-DD>/<uuid>-0.parquet
    <root>/diagnostics/...   rounds measured by another client (e.g. SGLang's bench client)
    <root>/telemetry/...     one row per round and engine rank: what that rank's node did (steps/cluster/telemetry.py)
    <root>/expert_load/...   one row per case: SGLang's per-rank expert load over its rounds (steps/cluster/expert_load.py)

The main table only ever holds rounds from the pinned client (``vllm-bench-serve``)
so medians and history are comparable; anything else goes to ``diagnostics``.
Writes add new files (never rewrite old ones), so concurrent nightly runs
cannot corrupt each other.

Durability: an append writes its files under ``<root>/_staging/<uuid>/`` (no reader looks there),
flushes them, then publishes each by a rename into the table (``os.rename`` locally: atomic; on S3
a finished object appears whole), so a writer killed at any moment leaves the old store or the new
one and a reader never sees half a file. An append is one file per (table, profile, engine, date);
the pipeline's appends are one such file each. A file that does not read later (no Parquet footer,
bad pages, not this schema) is moved aside to ``<root>/quarantine/<its path>`` with a ``.why.json``
beside it, named in what :func:`load_rounds` returns, and the other files are read: one bad file
never stops the nights after it.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from gauntlet.contract import TransientError, UsageError, now_iso
from gauntlet.steps.client.bench import LATENCY_METRICS, SPEC_METRICS

__all__ = ["SCHEMA", "TELEMETRY_SCHEMA", "TELEMETRY", "append_telemetry", "EXPERT_LOAD", "EXPERT_LOAD_SCHEMA",
           "append_expert_load", "MAIN_CLIENT", "open_store", "append_rounds", "read_rounds", "load_rounds", "Rounds",
           "Quarantined", "table_for", "PARTITIONING", "QUARANTINE", "STAGING"]

MAIN_CLIENT = "vllm-bench-serve"
PARTITION_FIELDS = ("profile", "engine", "date")
QUARANTINE = "quarantine"        # <root>/quarantine/<table>/...: files that did not read, moved aside
STAGING = "_staging"             # <root>/_staging/<uuid>/...: an append's files before they are published
STALE_STAGING_S = 24 * 3600      # a staging directory this old was left by a killed writer: removed

_META = [
    ("run_id", pa.string()), ("profile", pa.string()), ("engine", pa.string()), ("date", pa.string()),
    ("timestamp", pa.string()), ("client", pa.string()), ("client_version", pa.string()),
    ("image", pa.string()), ("image_digest", pa.string()), ("args_hash", pa.string()),
    ("model_fingerprint", pa.string()), ("git_rev", pa.string()), ("topology", pa.string()), ("nodes", pa.string()),
    ("driver", pa.string()), ("context_length", pa.int64()), ("experiment", pa.string()), ("phase", pa.string()),
    ("case", pa.string()), ("input_len", pa.int64()), ("output_len", pa.int64()), ("concurrency", pa.int64()),
    ("prefix_len", pa.int64()), ("round", pa.int64()), ("valid", pa.bool_()), ("invalid_reason", pa.string()),
]
_NUM = [
    ("num_prompts", pa.int64()), ("completed", pa.int64()), ("failed", pa.int64()), ("success_rate", pa.float64()),
    ("duration_s", pa.float64()), ("total_input_tokens", pa.int64()), ("total_output_tokens", pa.int64()),
    ("request_throughput", pa.float64()), ("input_throughput", pa.float64()), ("output_throughput", pa.float64()),
    ("total_token_throughput", pa.float64()),
    *[(k, pa.float64()) for k in LATENCY_METRICS], *[(k, pa.float64()) for k in SPEC_METRICS],
    ("headroom", pa.float64()), ("client_ceiling", pa.float64()), ("client_bound", pa.bool_()),
    ("first_ttft_ms", pa.float64()), ("cold_start", pa.bool_()),
    # the request set the client sent (steps/client/request_set.py): two engines' rounds of a case compare only
    # where theirs agree; null where it was not drawn
    ("requests_sha256", pa.string()),
    ("cpu_util_mean", pa.float64()), ("gpu_util_mean", pa.float64()),
    ("gpu_mem_used_frac_max", pa.float64()), ("gpu_power_w_max", pa.float64()),
    ("engine_rss_bytes_max", pa.float64()), ("engine_kv_usage_max", pa.float64()),
    ("engine_running_max", pa.float64()), ("engine_waiting_max", pa.float64()),
    ("prefix_cache_hit_rate", pa.float64()), ("net_rx_bytes", pa.int64()), ("net_tx_bytes", pa.int64()),
    # the engine's own figures over the round beside the client's (steps/evidence/stats.py ENGINE_COLUMNS; the
    # same for every engine, null where it reports none and engine_notes, a JSON object, says why)
    ("engine_kv_usage_mean", pa.float64()), ("engine_preemptions", pa.float64()),
    ("engine_spec_acceptance_rate_pct", pa.float64()), ("engine_spec_acceptance_length", pa.float64()),
    ("engine_prompt_tokens", pa.float64()), ("engine_generation_tokens", pa.float64()),
    ("token_counts_agree", pa.bool_()), ("token_counts_detail", pa.string()), ("engine_notes", pa.string()),
    # the client's goodput against the profile's SLO (bench.slo), and whether the round's p99s met it
    ("request_goodput", pa.float64()), ("slo_ttft_p99_ms", pa.float64()), ("slo_tpot_p99_ms", pa.float64()),
    ("slo_met", pa.bool_()),
]
SCHEMA = pa.schema(_META + _NUM)
# per round and rank, from the sampler beside the rank (steps/cluster/rank_telemetry.py); GB/s are 1e9 bytes/s
_RANK = [
    ("rank", pa.int64()), ("where", pa.string()), ("node", pa.string()), ("reachable", pa.bool_()),
    ("error", pa.string()), ("gpu_source", pa.string()), ("samples", pa.int64()), ("gpus", pa.int64()),
    ("gpu_util_mean", pa.float64()), ("gpu_util_max", pa.float64()), ("gpu_mem_used_gib_max", pa.float64()),
    ("gpu_mem_total_gib", pa.float64()), ("power_w_mean", pa.float64()), ("power_w_max", pa.float64()),
    ("node_power_w_mean", pa.float64()), ("sm_clock_mhz_mean", pa.float64()), ("cpu_util_mean", pa.float64()),
    *[(f"{k}_gbps_{s}", pa.float64()) for k in ("rdma_tx", "rdma_rx", "nic_tx", "nic_rx") for s in ("mean", "max")],
]
TELEMETRY = "telemetry"
TELEMETRY_SCHEMA = pa.schema([f for f in _META if f[0] not in ("invalid_reason",)] + _RANK)
# per case, from SGLang's expert distribution recorder over the case's measured rounds (steps/cluster/expert_load.py):
# tokens routed to experts (each token once per expert it picks), per EP rank, and max / mean across ranks
_EXPERTS = [
    ("mode", pa.string()), ("file", pa.string()), ("error", pa.string()), ("note", pa.string()),
    ("steps", pa.int64()), ("layers", pa.int64()), ("experts", pa.int64()), ("tokens", pa.int64()),
    ("ep_size", pa.int64()), ("per_rank_tokens", pa.list_(pa.int64())), ("imbalance", pa.float64()),
    ("imbalance_layer_mean", pa.float64()), ("imbalance_layer_max", pa.float64()), ("hottest", pa.string()),
]
EXPERT_LOAD = "expert_load"
EXPERT_LOAD_SCHEMA = pa.schema([f for f in _META if f[0] not in ("round", "valid", "invalid_reason")] + _EXPERTS)
PARTITIONING = ds.partitioning(pa.schema([SCHEMA.field(n) for n in PARTITION_FIELDS]), flavor="hive")


def open_store(uri: str | Path) -> tuple[pafs.FileSystem, str]:
    """(filesystem, root path) for a local path or a pyarrow filesystem URI."""
    text = str(uri)
    if "://" not in text:
        path = Path(text).expanduser().resolve()
        path.mkdir(parents=True, exist_ok=True)
        return pafs.LocalFileSystem(), str(path)
    try:
        fs, root = pafs.FileSystem.from_uri(text)
    except ValueError as exc:       # pyarrow's ArrowInvalid: an unknown scheme, a malformed URI
        raise UsageError(f"results store {text!r}: {str(exc).splitlines()[0]}") from None
    return fs, root.rstrip("/")


def table_for(client: str) -> str:
    return "rounds" if client == MAIN_CLIENT else "diagnostics"


def _schema(table: str) -> pa.Schema:
    return {TELEMETRY: TELEMETRY_SCHEMA, EXPERT_LOAD: EXPERT_LOAD_SCHEMA}.get(table, SCHEMA)


def _table(rows: list[Mapping[str, Any]], schema: pa.Schema = SCHEMA) -> pa.Table:
    cols = {f.name: [r.get(f.name) for r in rows] for f in schema}
    return pa.Table.from_pydict(cols, schema=schema)


def append_telemetry(rows: Iterable[Mapping[str, Any]], uri: str | Path) -> dict[str, int]:
    """Append per-rank telemetry rows (TELEMETRY_SCHEMA's keys) to the ``telemetry`` table, as :func:`append_rounds`."""
    return append_rounds(rows, uri, table=TELEMETRY)


def append_expert_load(rows: Iterable[Mapping[str, Any]], uri: str | Path) -> dict[str, int]:
    """Append per-case expert load rows (EXPERT_LOAD_SCHEMA's keys) to the ``expert_load`` table."""
    return append_rounds(rows, uri, table=EXPERT_LOAD)


def append_rounds(rows: Iterable[Mapping[str, Any]], uri: str | Path, *, table: str | None = None) -> dict[str, int]:
    """Append round rows (dicts with SCHEMA's keys; extra keys are dropped). Returns rows written per table.
    ``table``: every row to that table (``telemetry``) instead of the one its client picks."""
    by_table: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        missing = [k for k in PARTITION_FIELDS if not r.get(k)]
        if missing:
            raise ValueError(f"result row lacks partition field(s) {missing}")
        by_table.setdefault(table or table_for(r.get("client") or ""), []).append(r)
    fs, root = open_store(uri)
    _sweep_staging(fs, root)
    written = {}
    for name, trows in by_table.items():
        stage = f"{root}/{STAGING}/{uuid.uuid4().hex}"
        files: list[str] = []
        ds.write_dataset(_table(trows, _schema(name)), stage, filesystem=fs, format="parquet",
                         partitioning=PARTITIONING, existing_data_behavior="overwrite_or_ignore",
                         basename_template=f"{uuid.uuid4().hex}-{{i}}.parquet",
                         file_visitor=lambda wf, files=files: files.append(wf.path))
        for path in files:              # every file whole on disk before any is published
            _flush(fs, path)
        for path in files:
            _publish(fs, path, f"{root}/{name}/{path[len(stage) + 1:]}")
        _delete_dir(fs, stage)
        written[name] = len(trows)
    return written


def _local(fs: pafs.FileSystem) -> bool:
    return isinstance(fs, pafs.LocalFileSystem)


def _flush(fs: pafs.FileSystem, path: str) -> None:
    """Local files reach the disk before their rename (a remote object is whole once written)."""
    if _local(fs):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _publish(fs: pafs.FileSystem, src: str, dst: str) -> None:
    """Move ``src`` to ``dst`` in one step (a rename locally), creating ``dst``'s directory."""
    if _local(fs):
        parent = os.path.dirname(dst)
        os.makedirs(parent, exist_ok=True)
        os.rename(src, dst)
        fd = os.open(parent, os.O_RDONLY)
        try:
            os.fsync(fd)        # the rename itself survives a crash
        finally:
            os.close(fd)
    else:
        fs.move(src, dst)


def _delete_dir(fs: pafs.FileSystem, path: str) -> None:
    try:
        fs.delete_dir(path)
    except OSError:
        pass            # leftovers under _staging are never read, and swept later


def _sweep_staging(fs: pafs.FileSystem, root: str) -> None:
    """Remove staging directories a killed writer left behind (older than a day; best effort)."""
    try:
        entries = fs.get_file_info(pafs.FileSelector(f"{root}/{STAGING}", allow_not_found=True))
    except OSError:
        return
    for e in entries:
        if e.mtime is not None and time.time() - e.mtime.timestamp() > STALE_STAGING_S:
            _delete_dir(fs, e.path)


@dataclass(frozen=True)
class Quarantined:
    """A store file that did not read, moved aside: where it was and where it is (relative to the store's
    root; ``moved_to`` is None when it could not be moved and was only skipped) and why."""

    path: str
    moved_to: str | None
    why: str

    def line(self) -> str:
        where = f"moved to {self.moved_to}" if self.moved_to else "skipped (could not be moved aside)"
        return f"{self.path} ({self.why}): {where}"


@dataclass(frozen=True)
class Rounds:
    """What a read of the store found: the rows, and the files it quarantined on the way."""

    table: pa.Table
    quarantined: tuple[Quarantined, ...] = ()


def read_rounds(uri: str | Path, *, table: str = "rounds", profile: str | None = None,
                engine: str | None = None, columns: list[str] | None = None) -> pa.Table:
    """The stored rounds (an empty table with SCHEMA when there are none); see :func:`load_rounds`."""
    return load_rounds(uri, table=table, profile=profile, engine=engine, columns=columns).table


def load_rounds(uri: str | Path, *, table: str = "rounds", profile: str | None = None,
                engine: str | None = None, columns: list[str] | None = None) -> Rounds:
    """The stored rounds, and the files that did not read: each is moved aside to ``quarantine/`` and the
    rest is returned. TransientError when a remote store fails every file (an outage, not corruption)."""
    fs, root = open_store(uri)
    base = f"{root}/{table}"
    schema = _schema(table)
    empty = schema.empty_table() if columns is None else schema.empty_table().select(columns)
    info = fs.get_file_info(base)
    if info.type == pafs.FileType.NotFound:
        return Rounds(empty)
    flt = None
    for col, val in (("profile", profile), ("engine", engine)):
        if val is not None:
            e = ds.field(col) == val
            flt = e if flt is None else flt & e
    dataset = ds.dataset(base, filesystem=fs, format="parquet", schema=schema, partitioning=PARTITIONING)
    try:
        return Rounds(dataset.to_table(columns=columns, filter=flt))
    except (pa.ArrowInvalid, OSError):
        pass        # some file does not read (or went to quarantine meanwhile): one file at a time
    parts, failed = [], []
    for frag in dataset.get_fragments(filter=flt):
        got = _read_file(fs, base, frag.path, columns, flt, schema)
        if isinstance(got, pa.Table):
            parts.append(got)
        elif got is not None:
            failed.append((frag.path, got))
    if len(failed) > 1 and not parts and not _local(fs) and not any(isinstance(e, pa.ArrowInvalid) for _, e in failed):
        raise TransientError(f"results store: no file under {base} reads ({_why(failed[0][1], failed[0][0])})")
    bad = [q for path, exc in failed if (q := _quarantine(fs, root, path, exc)) is not None]
    return Rounds(pa.concat_tables(parts) if parts else empty, tuple(bad))


def _read_file(fs: pafs.FileSystem, base: str, path: str, columns: list[str] | None,
               flt: Any, schema: pa.Schema = SCHEMA) -> pa.Table | BaseException | None:
    """One file's rows; the error when it does not read (an I/O error twice); None when it is gone."""
    for attempt in (1, 2):
        try:
            one = ds.dataset([path], filesystem=fs, format="parquet", schema=schema, partitioning=PARTITIONING,
                             partition_base_dir=base)
            return one.to_table(columns=columns, filter=flt)
        except FileNotFoundError:
            return None             # another reader moved it aside first
        except pa.ArrowInvalid as exc:
            return exc
        except OSError as exc:
            if attempt == 2:
                return exc
    return None


def _why(exc: BaseException, path: str) -> str:
    text = str(exc).replace(f"Could not open Parquet input source '{path}': ", "").replace(path, "the file").strip()
    return (text.splitlines() or [type(exc).__name__])[0][:200]


def _quarantine(fs: pafs.FileSystem, root: str, path: str, exc: BaseException) -> Quarantined | None:
    """Move a file that did not read to ``<root>/quarantine/<its path>``, with a ``.why.json`` beside it."""
    rel = path[len(root) + 1:] if path.startswith(root + "/") else path
    why, dst = _why(exc, path), f"{root}/{QUARANTINE}/{rel}"
    try:
        _publish(fs, path, dst)
    except FileNotFoundError:
        return None                 # another reader moved it first: that reader names it
    except OSError as move_exc:
        return Quarantined(rel, None, f"{why}; not moved: {_why(move_exc, path)}")
    try:
        with fs.open_output_stream(dst + ".why.json") as fh:
            fh.write(json.dumps({"file": rel, "why": why, "when": now_iso()}).encode())
    except OSError:
        pass
    return Quarantined(rel, f"{QUARANTINE}/{rel}", why)
