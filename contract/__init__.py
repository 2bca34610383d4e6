"""The contract every gate and both back ends share: the evidence contract.

Imported by the gates (``gauntlet.steps``), the back ends and the CLI (``gauntlet.workflows``) and the
profile loader (``gauntlet.params``); it imports nothing of theirs. Where a run's tasks write (the run
directory's layout, ``verdict.json`` and ``outputs/`` included) is :mod:`gauntlet.contract.layout`.

- A gate builds a list of :class:`Check` results; the step runner wraps them in a :class:`Verdict`
  and writes ``<out>/verdict.json``.
- Exit codes: 0 pass/skip, 1 failed verdict (or a crash: never retried), 2 bad profile/arguments,
  75 transient infrastructure error (the only code Argo's retryStrategy and the local runner retry).
- Errors: every error the project raises on purpose is a :class:`GauntletError` carrying its exit
  code; :func:`exit_code_of` is the one map from an exception to an exit code.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import datetime, UTC
from pathlib import Path
from typing import Any, Literal

from gauntlet.contract.layout import VERDICT_FILE

__all__ = [
    "Check",
    "Verdict",
    "Status",
    "STATUSES",
    "CheckStatus",
    "CHECK_STATUSES",
    "GauntletError",
    "UsageError",
    "TransientError",
    "CorruptVerdict",
    "CORRUPT_KINDS",
    "MAX_VERDICT_BYTES",
    "EXIT_PASS",
    "EXIT_FAIL",
    "EXIT_USAGE",
    "EXIT_TRANSIENT",
    "EXIT_INTERRUPTED",
    "overall_status",
    "exit_code_for",
    "exit_code_of",
    "write_json_atomic",
    "now_iso",
    "param_name",
]

Status = Literal["pass", "fail", "skip", "error"]
STATUSES = ("pass", "fail", "skip", "error")
# A check may also be a "probe": exploratory, its result recorded and shown, never the verdict's status and never
# a failure (Gate 5's probe rungs, steps/gates/longctx.py); overall_status counts it as it counts a skip.
CheckStatus = Literal["pass", "fail", "skip", "error", "probe"]
CHECK_STATUSES = (*STATUSES, "probe")

EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_TRANSIENT = 75


EXIT_INTERRUPTED = 130


class GauntletError(Exception):
    """The base of every error the project raises on purpose; ``exit_code`` is what the process exits with.

    Printed as one line (``Type: message``), never with a traceback: it names its cause.
    """

    exit_code: int = EXIT_FAIL


class UsageError(GauntletError):
    """Bad profile or arguments: exit 2 with one line, no traceback."""

    exit_code = EXIT_USAGE


class TransientError(GauntletError):
    """Infrastructure hiccup worth a retry: exit 75."""

    exit_code = EXIT_TRANSIENT


class CorruptVerdict(GauntletError):
    """A ``verdict.json`` that is not a verdict (missing, unreadable, not JSON, not an object, missing keys):
    ``path``, ``why`` and ``kind`` (one of :data:`CORRUPT_KINDS`: missing, unreadable, not-json,
    not-a-verdict); printed as ``<path>: corrupt verdict (<why>)``. Exit 1: the gate's result is unknown."""

    def __init__(self, path: Path | str, why: str, kind: str = "not-a-verdict") -> None:
        if kind not in CORRUPT_KINDS:
            raise ValueError(f"corrupt verdict kind {kind!r}: one of {', '.join(CORRUPT_KINDS)}")
        self.path, self.why, self.kind = Path(path), why, kind
        super().__init__(f"{path}: corrupt verdict ({why})")


CORRUPT_KINDS = ("missing", "unreadable", "not-json", "not-a-verdict")


MAX_VERDICT_BYTES = 64 * 2**20      # a perf verdict of a large matrix is a few MB; beyond this it is not one


def _json_kind(x: Any) -> str:
    return {list: "list", str: "string", int: "number", float: "number", bool: "boolean", dict: "object"}.get(
        type(x), "null" if x is None else type(x).__name__)


def _short(x: Any) -> str:
    if isinstance(x, list | dict):
        return f"(a JSON {_json_kind(x)})"
    text = repr(x)
    return text if len(text) <= 60 else text[:57] + "..."


def exit_code_of(exc: BaseException) -> int:
    """The one map from an exception to the process's exit code.

    A :class:`GauntletError` carries its own; an interrupt is 130; anything else is a crash (a bug,
    or a broken install such as a gate module that does not import): 1, never retried.
    """
    if isinstance(exc, GauntletError):
        return exc.exit_code
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    return EXIT_FAIL


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass
class Check:
    """One judged fact: what was expected, what was seen, and what to do about it."""

    name: str
    status: CheckStatus
    expected: Any = None
    observed: Any = None
    detail: str = ""

    def __post_init__(self) -> None:
        if self.status not in CHECK_STATUSES:
            raise ValueError(f"check {self.name}: status {self.status!r} not in {CHECK_STATUSES}")

    @classmethod
    def compare(cls, name: str, expected: Any, observed: Any, detail: str = "") -> Check:
        """Pass when observed == expected; the detail says both when not."""
        ok = expected == observed
        if not detail:
            detail = "as expected" if ok else f"expected {expected!r}, observed {observed!r}"
        return cls(name, "pass" if ok else "fail", expected, observed, detail)


def overall_status(checks: list[Check]) -> Status:
    """error beats fail beats pass beats skip (a probe counts as a skip); no checks at all is an error."""
    if not checks:
        return "error"
    seen = {c.status for c in checks}
    for s in ("error", "fail", "pass"):
        if s in seen:
            return s
    return "skip"


def exit_code_for(status: Status) -> int:
    return {"pass": EXIT_PASS, "skip": EXIT_PASS, "fail": EXIT_FAIL, "error": EXIT_FAIL}[status]


@dataclass
class Verdict:
    gate: str
    status: Status
    started: str
    finished: str
    checks: list[Check] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, gate: str, started: str, checks: list[Check], metrics: dict[str, Any] | None = None,
           status: Status | None = None) -> Verdict:
        return cls(gate, status or overall_status(checks), started, now_iso(), list(checks), dict(metrics or {}))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Any) -> Verdict:
        """A verdict from its JSON form; ValueError saying what is wrong when ``d`` is not one.

        ``gate`` and ``status`` are required, ``checks`` is a list of objects with a ``name`` and a
        ``status``, ``metrics`` an object; keys this version does not know are ignored.
        """
        if not isinstance(d, dict):
            raise ValueError(f"a JSON {_json_kind(d)}, not an object")
        if not isinstance(d.get("gate"), str) or not d["gate"]:
            raise ValueError("no gate" if "gate" not in d else f"gate {_short(d['gate'])} is not a name")
        if d.get("status") not in STATUSES:
            raise ValueError("no status" if "status" not in d else
                             f"status {_short(d['status'])} is not one of {', '.join(STATUSES)}")
        for key in ("started", "finished"):
            if not isinstance(d.get(key, ""), str):
                raise ValueError(f"{key} {_short(d[key])} is not a time stamp")
        raw_checks, metrics = d.get("checks", []), d.get("metrics", {})
        if not isinstance(raw_checks, list):
            raise ValueError(f"checks is a JSON {_json_kind(raw_checks)}, not a list")
        if not isinstance(metrics, dict):
            raise ValueError(f"metrics is a JSON {_json_kind(metrics)}, not an object")
        checks = []
        for i, c in enumerate(raw_checks):
            if not isinstance(c, dict) or not isinstance(c.get("name"), str) or c.get("status") not in CHECK_STATUSES:
                raise ValueError(f"checks[{i}] is not a check with a name and a status")
            checks.append(Check(c["name"], c["status"], c.get("expected"), c.get("observed"),
                                "" if c.get("detail") is None else str(c["detail"])))
        return cls(d["gate"], d["status"], d.get("started", ""), d.get("finished", ""), checks, metrics)

    def write(self, out: Path) -> Path:
        return write_json_atomic(Path(out) / VERDICT_FILE, self.to_dict())

    @classmethod
    def read(cls, out: Path) -> Verdict:
        """``<out>/verdict.json`` (or ``out`` itself when it names a file); :class:`CorruptVerdict` naming the
        file and why when it is missing, unreadable, too large, not UTF-8 JSON or not a verdict."""
        path = Path(out)
        if path.name != VERDICT_FILE or path.is_dir():
            path = path / VERDICT_FILE
        try:
            with path.open("rb") as fh:
                raw = fh.read(MAX_VERDICT_BYTES + 1)
        except FileNotFoundError:
            raise CorruptVerdict(path, "missing", "missing") from None
        except OSError as exc:
            raise CorruptVerdict(path, f"unreadable: {exc.strerror or exc}", "unreadable") from None
        if len(raw) > MAX_VERDICT_BYTES:
            raise CorruptVerdict(path, f"larger than {MAX_VERDICT_BYTES // 2**20} MiB", "unreadable")
        try:
            doc = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise CorruptVerdict(path, f"not UTF-8 text (byte {exc.start})", "not-json") from None
        except json.JSONDecodeError as exc:
            where = f"{exc.msg} at line {exc.lineno} column {exc.colno}"
            raise CorruptVerdict(path, "empty" if not raw.strip() else f"truncated after {len(raw)} bytes: {where}"
                                 if exc.pos >= len(exc.doc.rstrip()) or exc.msg.startswith("Unterminated string")
                                 else f"not JSON: {where}", "not-json") from None
        except RecursionError:
            raise CorruptVerdict(path, "not JSON this reader accepts: nested too deeply", "not-json") from None
        except ValueError as exc:          # e.g. an integer past Python's digit limit
            raise CorruptVerdict(path, f"not JSON this reader accepts: {str(exc)[:120]}", "not-json") from None
        try:
            return cls.from_dict(doc)
        except ValueError as exc:
            raise CorruptVerdict(path, str(exc)) from None

    def failed_checks(self) -> list[Check]:
        return [c for c in self.checks if c.status in ("fail", "error")]


def write_json_atomic(path: Path, data: Any) -> Path:
    """Write JSON through a temp file and rename, so a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2, sort_keys=False, default=str)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def param_name(text: str) -> str:
    """A case or rung name as an output-parameter-safe suffix (``unlock_<name>``): the gate that writes the
    output and the graph that reads it name it the same way."""
    return re.sub(r"[^A-Za-z0-9_]", "_", text)
