"""What Argo hands the release steps, read: ``{{workflow.failures}}``, ``{{workflow.status}}``, and whether a
run's workflow lets its objects go. Pure; the exit handler (cleanup) and the janitor judge with it, the
Kubernetes back end records it.

``{{workflow.failures}}`` reaches the container as Argo's controller leaves it: the JSON list passed through
Go's ``strconv.Quote`` (workflow/controller/operator.go, v4.0.5), so "nothing failed" is ``"null"`` with the
quotes and a failure is a JSON string literal whose content is the list. :func:`parse_failures` takes that
form, the bare JSON the local runner used to pass, and Go escapes JSON lacks.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

__all__ = ["WORKFLOW_PHASES", "go_unquote", "parse_failures", "parse_status", "RunState", "judge_run"]

WORKFLOW_PHASES = ("Succeeded", "Failed", "Error")


_GO_ESC = re.compile(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[0-7]{3}|[abfnrtv\\'\"])")
_SIMPLE = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\", "'": "'",
           '"': '"'}


def go_unquote(text: str) -> str:
    """The string a Go double-quoted literal denotes (``strconv.Quote``'s output, which may use
    ``\\x``/``\\U`` escapes that JSON lacks). ValueError when it is not one."""
    if len(text) < 2 or text[0] != '"' or text[-1] != '"':
        raise ValueError("not a double-quoted string")
    body = text[1:-1]
    if re.search(r'(?<!\\)(?:\\\\)*"', body):
        raise ValueError("unescaped quote inside the literal")

    def sub(m: re.Match[str]) -> str:
        e = m.group(1)
        if e[0] in "xuU":
            return chr(int(e[1:], 16))
        if e[0].isdigit():
            return chr(int(e, 8))
        return _SIMPLE[e]
    rest = _GO_ESC.sub("", body)
    if "\\" in rest:
        raise ValueError("unknown escape")
    return _GO_ESC.sub(sub, body)


def parse_failures(text: str | None) -> tuple[list[dict[str, Any]], str | None]:
    """``({{workflow.failures}} as a list, problem)``; never raises.

    Accepts Argo's form (the JSON list through ``strconv.Quote``: ``"null"`` or
    ``"[{\\"displayName\\":...}]"``), bare JSON (``null``, ``[...]``) and empty. Anything
    else gives ``[]`` and a one-line problem naming what arrived.
    """
    raw = (text or "").strip()
    value: Any = raw
    for _ in range(3):                      # at most: Go-quoted -> JSON text -> list
        if not isinstance(value, str):
            break
        s = value.strip()
        if s in ("", "null"):
            return [], None
        try:
            value = json.loads(s)
        except ValueError:
            try:
                value = go_unquote(s)
            except ValueError:
                return [], f"--failures: expected Argo's {{{{workflow.failures}}}} (a JSON list, or null), got {raw[:80]!r}"
    if value is None:
        return [], None
    if not isinstance(value, list):
        return [], f"--failures: expected a JSON list, got {type(value).__name__}: {raw[:80]!r}"
    bad = [i for i, f in enumerate(value) if not isinstance(f, dict)]
    if bad:
        return [f for f in value if isinstance(f, dict)], f"--failures: entries {bad} are not objects"
    return value, None


def parse_status(text: str | None) -> tuple[str, str | None]:
    """``({{workflow.status}}, problem)``; an unexpected value is kept and named, never fatal."""
    s = (text or "").strip().strip('"')
    if s in WORKFLOW_PHASES:
        return s, None
    return s or "Unknown", f"--workflow-status: expected one of {', '.join(WORKFLOW_PHASES)}, got {text!r}"


# ------------------------------------------------------------------ a run's workflow, judged

@dataclass(frozen=True)
class RunState:
    release: bool
    reason: str


def _time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def judge_run(workflow: dict[str, Any] | None, now: datetime, grace_s: float) -> RunState:
    """Whether a run's objects may be released, from its workflow (None: no workflow has that uid)."""
    if workflow is None:
        return RunState(True, "its workflow is gone")
    st = workflow.get("status") or {}
    phase = st.get("phase") or "Pending"
    if phase not in WORKFLOW_PHASES:
        return RunState(False, f"its workflow {workflow.get('metadata', {}).get('name')} is {phase}")
    finished = _time(st.get("finishedAt"))
    if finished is None:
        return RunState(True, f"its workflow is {phase} with no finish time")
    age = (now - finished).total_seconds()
    if age < grace_s:
        return RunState(False, f"its workflow {phase} {age:.0f}s ago, within the {grace_s:.0f}s grace")
    return RunState(True, f"its workflow {phase} {age:.0f}s ago (grace {grace_s:.0f}s)")
