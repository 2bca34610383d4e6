"""The contract every gate and both back ends share (DESIGN.md, "The evidence contract").

One public module, imported by the gates (``gauntlet.steps``), the back ends and the CLI
(``gauntlet.workflows``) and the profile loader (``gauntlet.params``); it imports nothing of theirs.

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

__all__ = [
    "Check",
    "Verdict",
    "Status",
    "STATUSES",
    "GauntletError",
    "UsageError",
    "TransientError",
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
    status: Status
    expected: Any = None
    observed: Any = None
    detail: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"check {self.name}: status {self.status!r} not in {STATUSES}")

    @classmethod
    def compare(cls, name: str, expected: Any, observed: Any, detail: str = "") -> Check:
        """Pass when observed == expected; the detail says both when not."""
        ok = expected == observed
        if not detail:
            detail = "as expected" if ok else f"expected {expected!r}, observed {observed!r}"
        return cls(name, "pass" if ok else "fail", expected, observed, detail)


def overall_status(checks: list[Check]) -> Status:
    """error beats fail beats pass beats skip; no checks at all is an error."""
    if not checks:
        return "error"
    seen = {c.status for c in checks}
    for s in ("error", "fail", "pass"):
        if s in seen:
            return s  # type: ignore[return-value]
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
    def from_dict(cls, d: dict[str, Any]) -> Verdict:
        checks = [Check(**c) for c in d.get("checks", [])]
        return cls(d["gate"], d["status"], d.get("started", ""), d.get("finished", ""), checks, d.get("metrics", {}))

    def write(self, out: Path) -> Path:
        return write_json_atomic(Path(out) / "verdict.json", self.to_dict())

    @classmethod
    def read(cls, out: Path) -> Verdict:
        return cls.from_dict(json.loads((Path(out) / "verdict.json").read_text()))

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
