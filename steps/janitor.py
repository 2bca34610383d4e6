"""The janitor: release what a run left behind when its exit handler never ran or never finished.

The exit handler is skipped by ``argo terminate``, and a controller restart, a deleted
step pod or a deadline can leave an engine holding GPUs. The ``gauntlet-janitor``
CronWorkflow (every few minutes, ``Forbid``) runs this step: it finds every StatefulSet,
Job and pod carrying ``gauntlet.dev/run``, looks the run's workflow up by uid (Argo's
``workflows`` in the namespace), and releases the run's objects when the workflow is
gone or finished more than ``--grace`` ago: logs first, then scale to 0 and delete. It
never touches an object without the label, nor one whose run is still running, nor
Argo's own step pods.

Locally (``gauntlet janitor --local``, and at the start of every ``gauntlet run``): the
engines of a run whose runner is no longer alive (``kill -9``) are found by their label
and stopped (:mod:`gauntlet.steps._janitor_local`).

Judgement is pure (:func:`judge_run`); the I/O is the back end's (:data:`gauntlet.steps.backends.BACKENDS`,
``janitor``): :mod:`gauntlet.steps._janitor_k8s`, :mod:`gauntlet.steps._janitor_local`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from gauntlet.contract import EXIT_FAIL, EXIT_PASS, EXIT_TRANSIENT, Check, UsageError, Verdict
from gauntlet.steps import Needs
from gauntlet.steps.backends import BACKENDS
from gauntlet.steps.options import GateOptions, option

NAME = "janitor"
HELP = "release the objects (or local engines) of runs whose workflow is gone or long finished"
NEEDS = Needs(profile=False)
FINISHED = ("Succeeded", "Failed", "Error")

__all__ = ["Options", "judge_run", "parse_duration", "RunState", "run", "exit_code"]


@dataclass(frozen=True)
class RunState:
    release: bool
    reason: str


def parse_duration(text: str) -> float:
    """``30s``, ``10m``, ``1h``, ``1h30m`` or plain seconds; UsageError otherwise."""
    t = (text or "").strip()
    if re.fullmatch(r"\d+(\.\d+)?", t):
        return float(t)
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|m|s)", t)
    if not parts or "".join(a + b for a, b in parts) != t:
        raise UsageError(f"--grace: expected a duration like 30s, 10m or 1h, got {text!r}")
    return sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)


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
    if phase not in FINISHED:
        return RunState(False, f"its workflow {workflow.get('metadata', {}).get('name')} is {phase}")
    finished = _time(st.get("finishedAt"))
    if finished is None:
        return RunState(True, f"its workflow is {phase} with no finish time")
    age = (now - finished).total_seconds()
    if age < grace_s:
        return RunState(False, f"its workflow {phase} {age:.0f}s ago, within the {grace_s:.0f}s grace")
    return RunState(True, f"its workflow {phase} {age:.0f}s ago (grace {grace_s:.0f}s)")


@dataclass(frozen=True, kw_only=True)
class Options(GateOptions):
    grace: str = option("10m", help="release a finished run's objects this long after it finished")
    namespace: str | None = option(None, help="default: $GAUNTLET_NAMESPACE, else gauntlet")
    local: bool = option(False, help="the local back end: stop engines of dead runners")
    runs_dir: str = option("runs", help="local: the runs directory (default: runs)")

    def __post_init__(self) -> None:
        super().__post_init__()
        parse_duration(self.grace)

    @property
    def grace_s(self) -> float:
        return parse_duration(self.grace)


def run(opts: Options, out: Path) -> tuple[list[Check], dict[str, Any]]:
    backend = BACKENDS["local" if opts.local else "kubernetes"]
    return backend.janitor(out, runs_dir=Path(opts.runs_dir), namespace=opts.namespace, grace_s=opts.grace_s)


def exit_code(verdict: Verdict) -> int:
    """0 unless a released run still holds something: 75 after a transient error, else 1."""
    m = verdict.metrics
    if not m.get("held"):
        return EXIT_PASS
    return EXIT_TRANSIENT if m.get("transient") else EXIT_FAIL
