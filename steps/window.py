"""The run's window: a gate stops itself before Argo's workflow deadline, so the release and the record run.

Argo puts the workflow's deadline (``status.startedAt`` + ``spec.activeDeadlineSeconds``, reset by a retry) in
every container it creates as ``ARGO_DEADLINE`` (RFC 3339; the zero time in an exit handler's pods, which have
none). When that deadline passes while a step runs, Argo v4.0.5 kills the pod and then creates no pod for the
teardown, regress and report that follow it (``createWorkflowPod`` returns nothing after the deadline) and
nothing wakes the workflow again until the controller's 20-minute resync, one node per resync: the run would
hold the pool's mutex for an hour and write no report (docs/reliability.md "The run's window").

So a gate that judges (``Needs.windowed``) ends at ``ARGO_DEADLINE`` minus ``GAUNTLET_WINDOW_RESERVE_S`` (what
render reserves for the steps after it, from the plan's figures): it fails at once when the window is already
spent, and a timer stops it when the window ends, with a failed verdict naming the window. The steps that
release and record (teardown, regress, report, cleanup, janitor) are not windowed. Without ``ARGO_DEADLINE``
(the local runner, a hand-run step) there is no window.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from gauntlet.contract import Check

__all__ = ["DEADLINE_ENV", "RESERVE_ENV", "Window", "WindowSpent", "window_of", "armed", "window_check"]

DEADLINE_ENV = "ARGO_DEADLINE"                 # set by Argo's controller in every container (workflowpod.go)
RESERVE_ENV = "GAUNTLET_WINDOW_RESERVE_S"      # set by render on windowed steps
REPEAT_S = 30.0                                # the timer fires again if a handler swallowed the first stop


class WindowSpent(BaseException):
    """The run's window ended while the gate ran. A BaseException, as KeyboardInterrupt is: a gate's own
    ``except Exception`` must not turn the stop into a measurement."""


@dataclass(frozen=True)
class Window:
    """Where the run's window ends for the gates (``ends``, epoch seconds), and why."""

    deadline: datetime              # Argo's workflow deadline
    reserve_s: float                # kept for the steps after the gate

    @property
    def ends(self) -> float:
        return self.deadline.timestamp() - self.reserve_s

    def left_s(self, now: float | None = None) -> float:
        return self.ends - (time.time() if now is None else now)

    def end_iso(self) -> str:
        return datetime.fromtimestamp(self.ends, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def describe(self) -> str:
        return (f"the run's window ends at {self.end_iso()}: Argo's deadline {self.deadline.strftime('%H:%M:%SZ')} "
                f"less {self.reserve_s:.0f} s kept for teardown, regress and report")


def window_of(env: Mapping[str, str] | None = None) -> Window | None:
    """The window the environment states; None without a deadline (an exit handler's pod, a local run).

    A deadline or a reserve that does not parse is no window, said on stderr by the caller's check, never a
    crash: the Argo deadline stays the backstop."""
    env = os.environ if env is None else env
    raw = (env.get(DEADLINE_ENV) or "").strip()
    if not raw:
        return None
    try:
        deadline = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None
    if deadline.tzinfo is None or deadline.year <= 1:       # Go's zero time: no deadline for this pod
        return None
    try:
        reserve = float(env.get(RESERVE_ENV) or 0)
    except ValueError:
        reserve = 0.0
    return Window(deadline.astimezone(UTC), max(reserve, 0.0))


def window_check(gate: str, window: Window, started: float, now: float | None = None) -> Check:
    """The failed ``window`` check of a gate the window stopped (or never let start)."""
    now = time.time() if now is None else now
    ran = max(now - started, 0.0)
    what = "never started: the window was already spent" if ran < 1 else f"stopped after {ran:.0f} s"
    return Check("window", "fail", f"done by {window.end_iso()}", f"{gate} {what}",
                 f"{gate} {what}; {window.describe()}, so the run releases the GPUs and writes its report "
                 f"before Argo's deadline (steps/window.py)")


@contextlib.contextmanager
def armed(window: Window | None) -> Iterator[None]:
    """Raise :class:`WindowSpent` in the main thread when the window ends (at once if it has ended); in another
    thread (an in-process caller) only the at-once check."""
    if window is None:
        yield
        return
    left = window.left_s()
    if left <= 0:
        raise WindowSpent(window.describe())

    if threading.current_thread() is not threading.main_thread():     # signals reach the main thread only
        yield
        return

    def _stop(_sig: int, _frame: object) -> None:
        raise WindowSpent(window.describe())

    previous = signal.signal(signal.SIGALRM, _stop)
    signal.setitimer(signal.ITIMER_REAL, left, REPEAT_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
