"""Measurements the tests leave in build/*.json for the docs, merged row by row.

Several pytest processes write the same file at once (``make test`` runs the box's workers beside the
rest of the suite), so each merge holds an exclusive lock on ``<file>.lock`` while it reads, updates and
atomically replaces the file: no row is lost and no reader sees half a file.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any

BUILD = Path(__file__).resolve().parent.parent / "build"


def merge_row(path: Path, row: str, fields: dict[str, Any], *, replace: bool = True) -> None:
    """Set (``replace``) or update row ``row`` of the JSON object in ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            data = json.loads(path.read_text()) if path.is_file() else {}
        except ValueError:
            data = {}
        data[row] = dict(fields) if replace else {**data.get(row, {}), **fields}
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path)
