"""The janitor: release what a run left behind when its exit handler never ran or never finished.

The exit handler is skipped by ``argo terminate``, and a controller restart, a deleted
step pod or a deadline can leave an engine holding GPUs. The ``gauntlet-janitor``
CronWorkflow (every few minutes, ``Forbid``) runs this step: it finds every StatefulSet,
Job and pod carrying ``gauntlet.dev/run``, looks the run's workflow up by uid (Argo's
``workflows`` in the namespace), and releases the run's objects when the workflow is
gone or finished more than ``--grace`` ago: logs first, then scale to 0 and delete. It
never touches an object without the label, nor one whose run is still running, nor
Argo's own step pods.

Locally (``gauntlet janitor --backend local``, and at the start of every ``gauntlet run``): the
engines of a run whose runner is no longer alive (``kill -9``) are found by their label
and stopped.

Judgement is pure (:func:`gauntlet.steps.backends.argo.judge_run`); the I/O is the back end's
(:class:`gauntlet.steps.backends.protocol.Releaser`, ``janitor``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gauntlet.contract import EXIT_FAIL, EXIT_PASS, EXIT_TRANSIENT, Check, UsageError, Verdict
from gauntlet.steps.gate import Needs
from gauntlet.steps.backends import BACKENDS
from gauntlet.steps.backends.argo import RunState, judge_run
from gauntlet.steps.gates.shared_options import backend_option
from gauntlet.steps.options import GateOptions, option

NAME = "janitor"
HELP = "release the objects (or local engines) of runs whose workflow is gone or long finished"
NEEDS = Needs(profile=False, api="janitor", windowed=False)

__all__ = ["Options", "judge_run", "parse_duration", "RunState", "run", "exit_code"]


def parse_duration(text: str) -> float:
    """``30s``, ``10m``, ``1h``, ``1h30m`` or plain seconds; UsageError otherwise."""
    t = (text or "").strip()
    if re.fullmatch(r"\d+(\.\d+)?", t):
        return float(t)
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|m|s)", t)
    if not parts or "".join(a + b for a, b in parts) != t:
        raise UsageError(f"--grace: expected a duration like 30s, 10m or 1h, got {text!r}")
    return sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)


@dataclass(frozen=True, kw_only=True)
class Options(GateOptions):
    grace: str = option("10m", help="release a finished run's objects this long after it finished")
    namespace: str | None = option(None, help="default: $GAUNTLET_NAMESPACE, else gauntlet")
    backend: str | None = backend_option("kubernetes (the default): the labelled objects of finished runs; "
                                         "local: the engines of dead runners")
    runs_dir: str = option("runs", help="local: the runs directory (default: runs)")

    def __post_init__(self) -> None:
        super().__post_init__()
        parse_duration(self.grace)

    @property
    def grace_s(self) -> float:
        return parse_duration(self.grace)


def run(opts: Options, out: Path) -> tuple[list[Check], dict[str, Any]]:
    backend = BACKENDS[opts.backend or "kubernetes"]
    return backend.janitor(out, runs_dir=Path(opts.runs_dir), namespace=opts.namespace, grace_s=opts.grace_s)


def exit_code(verdict: Verdict) -> int:
    """0 unless a released run still holds something: 75 after a transient error, else 1."""
    m = verdict.metrics
    if not m.get("held"):
        return EXIT_PASS
    return EXIT_TRANSIENT if m.get("transient") else EXIT_FAIL
