"""The run directory's layout: where each task of a run writes its evidence, and where others read it.

One owner for both back ends (the Argo renderer and the local runner write each task's ``--out`` with it)
and for the gates that read another task's evidence. Task names are the graph's
(``gauntlet.workflows.graph``); this module maps them to directories:

- a task of the main DAG, and the exit handler (:data:`CLEANUP_TASK`): ``<run>/<task>``;
- a task of an engine sequence: ``<run>/<engine>/<task>``, one directory per engine, so the tasks of one
  sequence are siblings (:meth:`RunLayout.sibling`);
- inside a task's directory: ``verdict.json`` (:func:`verdict_path`, written and read by
  :class:`gauntlet.contract.Verdict`) and ``outputs/<name>`` (:func:`output_path`: its output parameters,
  plain text, read by Argo's ``valueFrom.path`` and by the local runner).

The root is a real directory (the local runner, a gate) or, when rendering, Argo's template text
(``/runs/{{workflow.uid}}``): the paths built from it keep its type.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import TypeVar

__all__ = ["RunLayout", "VERDICT_FILE", "OUTPUTS_DIR", "CLEANUP_TASK", "PREFLIGHT_TASK", "preflight_task",
           "verdict_path", "output_path", "nodes_task"]

VERDICT_FILE = "verdict.json"
OUTPUTS_DIR = "outputs"
_P = TypeVar("_P", bound=PurePath)      # a Path in, a Path out; a PurePosixPath (a pod's) in, one out
CLEANUP_TASK = "cleanup"          # the exit handler: its directory existing means the run's engines were released
PREFLIGHT_TASK = "preflight"      # Gate 0's preflight; on the cluster one per node, preflight-<i>
_PREFLIGHT = re.compile(rf"{PREFLIGHT_TASK}(-[0-9]+)?")
NODES_TASK = "nodes"              # Gate 1's node check, one per pool node: nodes-<i>
_NODES = re.compile(rf"{NODES_TASK}-[0-9]+")


def preflight_task(node_index: int | None = None) -> str:
    """The preflight task's name: ``preflight`` (one machine) or ``preflight-<i>`` (the cluster's i-th node)."""
    return PREFLIGHT_TASK if node_index is None else f"{PREFLIGHT_TASK}-{node_index}"


def nodes_task(node_index: int) -> str:
    """Gate 1's node check of the cluster's i-th node: ``nodes-<i>``."""
    return f"{NODES_TASK}-{node_index}"


def verdict_path(out: _P) -> _P:
    """The verdict file of the task whose directory is ``out``."""
    return out / VERDICT_FILE


def output_path(out: _P, name: str) -> _P:
    """The file that holds output parameter ``name`` of the task whose directory is ``out``."""
    return out / OUTPUTS_DIR / name


def _segment(what: str, text: str) -> str:
    if not text or text in (".", "..") or "/" in text or "\\" in text:
        raise ValueError(f"{what} {text!r}: not one path segment (a task or engine name, never a path)")
    return text


@dataclass(frozen=True)
class RunLayout:
    """The directories of one run rooted at ``root``."""

    root: PurePath

    @classmethod
    def of_task(cls, out: Path, *, in_sequence: bool) -> RunLayout:
        """The run that holds the task directory ``out``: two levels up in an engine sequence, else one."""
        out = Path(out).resolve()
        return cls(out.parents[1] if in_sequence else out.parent)

    @staticmethod
    def dag_dir(out: Path) -> Path:
        """The directory of the DAG run that holds the task directory ``out``: an engine's directory in an
        engine sequence, the run's in the main DAG."""
        return Path(out).resolve().parent

    @classmethod
    def sibling(cls, out: Path, task: str) -> Path:
        """The directory of ``task`` in the same DAG run (the same engine sequence) as the task writing to ``out``."""
        return cls.dag_dir(out) / _segment("task", task)

    @staticmethod
    def with_continuations(task_dir: Path) -> list[Path]:
        """A task's directory, then those of its gated continuations in the same DAG run (``<task>-<name>``:
        ``perf-<case>``, ``longctx-<tokens>``), by name; the task's own directory first even when absent."""
        task_dir = Path(task_dir)
        return [task_dir, *sorted(d for d in task_dir.parent.glob(f"{task_dir.name}-*") if d.is_dir())]

    def task_path(self, task: str, engine: str | None = None) -> str:
        """``task`` or ``<engine>/<task>`` (a task of ``engine``'s sequence), relative to the root."""
        task = _segment("task", task)
        return task if engine is None else f"{_segment('engine', engine)}/{task}"

    def task_dir(self, task: str, engine: str | None = None) -> PurePath:
        """Where ``task`` writes (its ``--out``)."""
        return self.root / self.task_path(task, engine)

    def cleanup_dir(self) -> PurePath:
        """The exit handler's directory."""
        return self.task_dir(CLEANUP_TASK)

    def released(self) -> bool:
        """Has the run's exit handler run (an earlier attempt's): it wrote its verdict."""
        return Path(verdict_path(self.cleanup_dir())).is_file()

    def preflight_dirs(self) -> list[Path]:
        """The directories of this run's preflight tasks that exist (one, or one per node), by name."""
        root = Path(self.root)
        try:
            return sorted(d for d in root.iterdir() if _PREFLIGHT.fullmatch(d.name) and d.is_dir())
        except OSError:
            return []

    def node_check_dirs(self) -> list[Path]:
        """The directories of this run's Gate 1 node checks that exist (``nodes-<i>``), by name."""
        root = Path(self.root)
        try:
            return sorted(d for d in root.iterdir() if _NODES.fullmatch(d.name) and d.is_dir())
        except OSError:
            return []

    def verdict_files(self, task: str | None = None) -> list[Path]:
        """Every ``verdict.json`` under the run, at any depth (a gate's own sub-runs included), sorted;
        only those of tasks named ``task`` when given."""
        files = sorted(Path(self.root).rglob(VERDICT_FILE))
        return [f for f in files if task is None or f.parent.name == task]

    def relative(self, path: PurePath) -> str:
        """A task directory's (or a verdict file's task's) path relative to the root, with ``/``."""
        path = Path(path)
        if path.name == VERDICT_FILE:
            path = path.parent
        return path.relative_to(Path(self.root)).as_posix()
