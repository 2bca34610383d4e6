"""Argo's ``{{...}}`` references: the one module that knows their syntax.

A :class:`Ref` names what a step argument or a condition reads: a workflow parameter
(``workflow.parameters.<name>``), a workflow variable (``workflow.<name>``: uid, status,
failures ...), an input parameter of the enclosing template (``inputs.parameters.<name>``),
an output parameter of an earlier task of the same DAG
(``tasks.<task>.outputs.parameters.<name>``) or the phase such a task ended in (``tasks.<task>.status``:
Argo's node phase, Succeeded/Failed/Error/Skipped/Omitted, set for every ancestor of the task that reads it,
workflow/controller/operator.go ``buildLocalScope``). ``str(ref)`` is the braced text both back ends
put into arguments; :func:`find`, :func:`replace` and :func:`substitute` read it back out of text.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = ["Ref", "RefError", "parameter", "workflow", "input_param", "output", "status", "parse", "braced", "find",
           "replace", "substitute", "fill"]

Kind = Literal["parameter", "workflow", "input", "output", "status"]

_PATTERN = re.compile(r"\{\{\s*([^{}]+?)\s*\}\}")
_NAME = r"[A-Za-z0-9_][-A-Za-z0-9_]*"
_PATHS: dict[Kind, re.Pattern[str]] = {
    "parameter": re.compile(rf"workflow\.parameters\.(?P<name>{_NAME})"),
    "workflow": re.compile(rf"workflow\.(?P<name>{_NAME})"),
    "input": re.compile(rf"inputs\.parameters\.(?P<name>{_NAME})"),
    "output": re.compile(rf"tasks\.(?P<task>{_NAME})\.outputs\.parameters\.(?P<name>{_NAME})"),
    "status": re.compile(rf"tasks\.(?P<task>{_NAME})\.(?P<name>status)"),
}


class RefError(ValueError):
    """A reference that cannot be resolved (or is not one of the five kinds where one is required)."""


@dataclass(frozen=True)
class Ref:
    kind: Kind
    name: str
    task: str = ""                       # the producing task, for kinds "output" and "status"

    def __post_init__(self) -> None:
        if (self.kind in ("output", "status")) != bool(self.task):
            raise ValueError(f"a task name goes with an output or status reference only: {self!r}")
        if not _PATHS[self.kind].fullmatch(self.path):
            raise ValueError(f"not a valid reference: {self.path!r}")

    @property
    def path(self) -> str:
        """The text between the braces, e.g. ``workflow.parameters.engines``."""
        if self.kind == "parameter":
            return f"workflow.parameters.{self.name}"
        if self.kind == "workflow":
            return f"workflow.{self.name}"
        if self.kind == "input":
            return f"inputs.parameters.{self.name}"
        if self.kind == "status":
            return f"tasks.{self.task}.{self.name}"
        return f"tasks.{self.task}.outputs.parameters.{self.name}"

    def __str__(self) -> str:
        return braced(self.path)


def parameter(name: str) -> Ref:
    """A workflow parameter (``gauntlet run`` fills them from the graph's defaults and its options)."""
    return Ref("parameter", name)


def workflow(name: str) -> Ref:
    """A workflow variable: ``uid``, ``name``, ``namespace``, ``status``, ``failures``."""
    return Ref("workflow", name)


def input_param(name: str) -> Ref:
    """An input parameter of the template the reference is used in (an engine sequence's ``engine``)."""
    return Ref("input", name)


def output(task: str, name: str) -> Ref:
    """An output parameter of an earlier task of the same DAG."""
    return Ref("output", name, task)


def status(task: str) -> Ref:
    """The phase an earlier task of the same DAG ended in (an ancestor: it must be in the reader's depends,
    directly or through other tasks). Argo's node phase names: ``Error``, where ``depends`` says ``Errored``."""
    return Ref("status", "status", task)


def parse(path: str) -> Ref | None:
    """The Ref a reference's inner text names, or None for any other Argo variable (``item``, ``pod.name`` ...)."""
    path = path.strip()
    for kind in ("parameter", "input", "output", "status", "workflow"):   # workflow.parameters.x before workflow.x
        m = _PATHS[kind].fullmatch(path)
        if m:
            return Ref(kind, m.group("name"), m.groupdict().get("task") or "")
    return None


def braced(path: str) -> str:
    """``path`` as a reference in text: ``{{path}}``."""
    return "{{" + path + "}}"


def find(text: str) -> list[str]:
    """The inner text of every reference in ``text``, in order (any Argo variable, not only Refs)."""
    return _PATTERN.findall(text)


def replace(text: str, fn: Callable[[Ref], str | None]) -> str:
    """Each reference by ``fn(ref)``; None keeps it as written. A reference that is no Ref raises RefError."""
    def sub(m: re.Match[str]) -> str:
        ref = parse(m.group(1))
        if ref is None:
            raise RefError(f"unsupported reference {m.group(0)} in {text!r}")
        new = fn(ref)
        return m.group(0) if new is None else new
    return _PATTERN.sub(sub, text)


def substitute(text: str, values: Mapping[Ref, str] | Callable[[Ref], str | None]) -> str:
    """Every reference by its value; one without a value raises RefError."""
    lookup = values if callable(values) else values.get

    def value(ref: Ref) -> str:
        v = lookup(ref)
        if v is None:
            raise RefError(f"unresolved reference {ref} in {text!r}")
        return str(v)
    return replace(text, value)


def fill(text: str, value: str) -> str:
    """Every reference, of any Argo variable, by ``value`` (a stand-in, to check an expression's syntax)."""
    return _PATTERN.sub(lambda m: value, text)
