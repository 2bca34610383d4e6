"""The janitor on the local back end: stop the engines of runs whose runner is gone.

``gauntlet run`` marks its run directory with ``.runner.json`` (its pid and the pid's
start time, so a reused pid is not mistaken for it) and removes the mark when it ends.
A runner killed with SIGKILL leaves the mark behind, and its engines (own sessions,
labelled ``GAUNTLET_ENGINE_DIR=<dir under the run>``) keep running. :func:`sweep` finds
every labelled engine under the runs directory, maps it to its run, and stops the run's
engines through :func:`gauntlet.steps.backends.local.deploy.stop_all` unless that run's runner is alive.
Processes without the label are never looked at twice, let alone signalled.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gauntlet.contract import Check, write_json_atomic

__all__ = ["MARK", "mark_runner", "clear_runner", "runner_alive", "sweep"]

MARK = ".runner.json"


def _start_ticks(pid: int) -> int | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[19]) if fields[0] not in ("Z", "X") else None      # field 22: starttime


def mark_runner(run_dir: Path, pid: int | None = None) -> Path:
    pid = os.getpid() if pid is None else pid
    return write_json_atomic(Path(run_dir) / MARK, {"pid": pid, "start_ticks": _start_ticks(pid)})


def clear_runner(run_dir: Path) -> None:
    (Path(run_dir) / MARK).unlink(missing_ok=True)


def runner_alive(run_dir: Path) -> bool:
    """True while the runner that marked ``run_dir`` still runs (same pid, same start time)."""
    import json
    try:
        mark = json.loads((Path(run_dir) / MARK).read_text())
        pid, ticks = int(mark["pid"]), mark.get("start_ticks")
    except (OSError, ValueError, KeyError, TypeError):
        return False
    now = _start_ticks(pid)
    return now is not None and (ticks is None or now == ticks)


def _run_of(engine_dir: Path, runs_dir: Path) -> Path | None:
    try:
        rel = engine_dir.resolve().relative_to(runs_dir)
    except ValueError:
        return None
    return runs_dir / rel.parts[0] if rel.parts else None


def sweep(runs_dir: Path, out: Path, exclude: Path | None = None) -> tuple[list[Check], dict[str, Any]]:
    """Stop the labelled engines of every run under ``runs_dir`` whose runner is not alive."""
    from gauntlet.steps.backends.local.deploy import find_labelled, stop_all

    runs_dir = Path(runs_dir).resolve()
    runs: dict[Path, list[int]] = {}
    for pgid, lab in find_labelled(runs_dir).items():
        run = _run_of(Path(lab["dir"]), runs_dir)
        if run is not None and run != runs_dir:
            runs.setdefault(run, []).append(pgid)
    checks: list[Check] = []
    released: dict[str, Any] = {}
    kept: dict[str, Any] = {}
    held: list[str] = []
    for run, pgids in sorted(runs.items()):
        if (exclude is not None and run == Path(exclude).resolve()) or runner_alive(run):
            kept[run.name] = sorted(pgids)
            checks.append(Check(f"run {run.name}", "pass", "kept while its runner lives", sorted(pgids),
                                f"left alone: its runner is alive ({len(pgids)} engine group(s))"))
            continue
        try:
            stopped = stop_all(run)
            problem = None
        except Exception as exc:  # noqa: BLE001 - recorded; the other runs are still swept
            stopped, problem = [], f"{type(exc).__name__}: {exc}"
        left = sorted(find_labelled(run))
        held += [f"{run.name}: pgid {p}" for p in left]
        released[run.name] = {"stopped": stopped, "left": left, "error": problem}
        what = ", ".join(f"pgid {s['pgid']} (port {s['port']}, {len(s['pids'])} processes) -> 0 running"
                         for s in stopped)
        checks.append(Check(f"run {run.name}", "fail" if left or problem else "pass", [], left,
                            f"its runner is gone: stopped {what or 'nothing'}"
                            + (f"; still running: {left}" if left else "") + (f"; {problem}" if problem else "")))
        clear_runner(run)
    if not runs:
        checks.append(Check("swept", "pass", None, 0, f"no labelled engine under {runs_dir}: nothing to do"))
    metrics = {"backend": "local", "runs_dir": str(runs_dir), "released": released, "kept": kept, "held": held,
               "transient": False}
    try:
        write_json_atomic(Path(out) / "janitor.json", metrics)
    except OSError:
        pass
    return checks, metrics
