"""The results store: every measured round plus run metadata, as a Parquet dataset.

Layout under the store's root (a local directory, or any URI pyarrow's
``FileSystem.from_uri`` understands, e.g. ``s3://bucket/prefix`` with
``?endpoint_override=...&scheme=http`` for an S3-compatible server)::

    <root>/rounds/profile=<p>/engine=<e>/date=<YYYY-MM-DD>/<uuid>-0.parquet
    <root>/diagnostics/...   rounds measured by another client (e.g. SGLang's bench client)

The main table only ever holds rounds from the pinned client (``vllm-bench-serve``)
so medians and history are comparable; anything else goes to ``diagnostics``.
Writes add new files (never rewrite old ones), so concurrent nightly runs
cannot corrupt each other.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from gauntlet.contract import UsageError
from gauntlet.steps._bench import LATENCY_METRICS, SPEC_METRICS

__all__ = ["SCHEMA", "MAIN_CLIENT", "open_store", "append_rounds", "read_rounds", "table_for", "PARTITIONING"]

MAIN_CLIENT = "vllm-bench-serve"
PARTITION_FIELDS = ("profile", "engine", "date")

_META = [
    ("run_id", pa.string()), ("profile", pa.string()), ("engine", pa.string()), ("date", pa.string()),
    ("timestamp", pa.string()), ("client", pa.string()), ("client_version", pa.string()),
    ("image", pa.string()), ("image_digest", pa.string()), ("args_hash", pa.string()),
    ("model_fingerprint", pa.string()), ("git_rev", pa.string()), ("topology", pa.string()), ("nodes", pa.string()),
    ("context_length", pa.int64()), ("experiment", pa.string()), ("phase", pa.string()),
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
    ("cpu_util_mean", pa.float64()), ("gpu_util_mean", pa.float64()),
    ("gpu_mem_used_frac_max", pa.float64()), ("gpu_power_w_max", pa.float64()),
    ("engine_rss_bytes_max", pa.float64()), ("engine_kv_usage_max", pa.float64()),
    ("engine_running_max", pa.float64()), ("engine_waiting_max", pa.float64()),
    ("prefix_cache_hit_rate", pa.float64()), ("net_rx_bytes", pa.int64()), ("net_tx_bytes", pa.int64()),
]
SCHEMA = pa.schema(_META + _NUM)
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


def _table(rows: list[Mapping[str, Any]]) -> pa.Table:
    cols = {f.name: [r.get(f.name) for r in rows] for f in SCHEMA}
    return pa.Table.from_pydict(cols, schema=SCHEMA)


def append_rounds(rows: Iterable[Mapping[str, Any]], uri: str | Path) -> dict[str, int]:
    """Append round rows (dicts with SCHEMA's keys; extra keys are dropped). Returns rows written per table."""
    by_table: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        missing = [k for k in PARTITION_FIELDS if not r.get(k)]
        if missing:
            raise ValueError(f"result row lacks partition field(s) {missing}")
        by_table.setdefault(table_for(r.get("client") or ""), []).append(r)
    fs, root = open_store(uri)
    written = {}
    for name, trows in by_table.items():
        ds.write_dataset(_table(trows), f"{root}/{name}", filesystem=fs, format="parquet",
                         partitioning=PARTITIONING, existing_data_behavior="overwrite_or_ignore",
                         basename_template=f"{uuid.uuid4().hex}-{{i}}.parquet")
        written[name] = len(trows)
    return written


def read_rounds(uri: str | Path, *, table: str = "rounds", profile: str | None = None,
                engine: str | None = None, columns: list[str] | None = None) -> pa.Table:
    """The stored rounds (an empty table with SCHEMA when there are none)."""
    fs, root = open_store(uri)
    base = f"{root}/{table}"
    info = fs.get_file_info(base)
    if info.type == pafs.FileType.NotFound:
        return SCHEMA.empty_table() if columns is None else SCHEMA.empty_table().select(columns)
    dataset = ds.dataset(base, filesystem=fs, format="parquet", schema=SCHEMA, partitioning=PARTITIONING)
    flt = None
    for col, val in (("profile", profile), ("engine", engine)):
        if val is not None:
            e = ds.field(col) == val
            flt = e if flt is None else flt & e
    return dataset.to_table(columns=columns, filter=flt)
