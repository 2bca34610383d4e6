"""Argo's ``depends`` and ``when`` expression strings, parsed (pure functions).

The graph states its conditions as data (:class:`~gauntlet.workflows.graph.Need`,
:class:`~gauntlet.workflows.graph.When`) and the local runner evaluates those; this parser
is for strings: lint checks rendered or hand-written documents with it
(:func:`depends_tasks`, :func:`check_when`), and the tests hold the structures' evaluation
against Argo's semantics with it. Both languages are parsed rather than approximated:

- ``depends``: ``task.Succeeded|Failed|Errored|Skipped|Omitted|Daemoned`` (and
  ``AnySucceeded``/``AllFailed``), a bare ``task`` meaning
  ``Succeeded || Skipped || Daemoned``, with ``!``, ``&&``, ``||`` and parentheses.
- ``when`` (references substituted first, :func:`gauntlet.workflows.refs.substitute`): operands are quoted strings, numbers,
  ``true``/``false`` or bare words, compared with ``==``, ``!=``, ``=~``, ``!~``
  (regex search, like govaluate), combined with ``!``, ``&&``, ``||``, parentheses.

Bad syntax raises :class:`ExpressionError` with the expression and the position.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from gauntlet.workflows import refs
from gauntlet.workflows.graph import PHASES

__all__ = ["ExpressionError", "eval_depends", "eval_when", "depends_tasks", "check_when"]

_PROPS = {**{p: (p,) for p in PHASES}, "AnySucceeded": ("Succeeded",), "AllFailed": ("Failed", "Errored")}


class ExpressionError(ValueError):
    """An expression that does not parse, or names something unknown."""


# ------------------------------------------------------------------ tokenizer shared by both languages

_TOKEN = re.compile(r"""
    \s*(?:
      (?P<op>&&|\|\||==|!=|=~|!~|!|\(|\))
    | '(?P<sq>[^']*)'
    | "(?P<dq>[^"]*)"
    | (?P<word>[A-Za-z0-9_.:/+\-]+)
    )""", re.VERBOSE)


def _tokens(expr: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(expr):
        if expr[pos:].strip() == "":
            break
        m = _TOKEN.match(expr, pos)
        if not m or m.end() == pos:
            raise ExpressionError(f"cannot parse {expr!r} at position {pos}: {expr[pos:pos + 10]!r}")
        pos = m.end()
        if m.group("op"):
            out.append(("op", m.group("op")))
        elif m.group("sq") is not None:
            out.append(("str", m.group("sq")))
        elif m.group("dq") is not None:
            out.append(("str", m.group("dq")))
        else:
            out.append(("word", m.group("word")))
    return out


class _Parser:
    """Recursive descent: or := and ('||' and)*; and := not ('&&' not)*; not := '!' not | atom."""

    def __init__(self, expr: str, atom: Callable[[_Parser], bool]):
        self.expr, self.toks, self.i, self.atom_fn = expr, _tokens(expr), 0, atom
        if not self.toks:
            raise ExpressionError("empty expression")

    def peek(self) -> tuple[str, str] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> tuple[str, str]:
        t = self.peek()
        if t is None:
            raise ExpressionError(f"unexpected end of {self.expr!r}")
        self.i += 1
        return t

    def parse(self) -> bool:
        v = self.or_()
        left = self.peek()
        if left is not None:
            raise ExpressionError(f"unexpected {left[1]!r} in {self.expr!r}")
        return v

    def or_(self) -> bool:
        v = self.and_()
        while self.peek() == ("op", "||"):
            self.take()
            rhs = self.and_()          # parse both sides: a syntax error never hides behind short-circuit
            v = v or rhs
        return v

    def and_(self) -> bool:
        v = self.not_()
        while self.peek() == ("op", "&&"):
            self.take()
            rhs = self.not_()
            v = v and rhs
        return v

    def not_(self) -> bool:
        if self.peek() == ("op", "!"):
            self.take()
            return not self.not_()
        if self.peek() == ("op", "("):
            self.take()
            v = self.or_()
            if self.peek() != ("op", ")"):
                raise ExpressionError(f"missing ')' in {self.expr!r}")
            self.take()
            return v
        return self.atom_fn(self)


# ------------------------------------------------------------------ depends

def _depends_term(p: _Parser) -> tuple[str, str]:
    """(task, property) of the next ``task.Property`` or bare ``task``; property "" when bare."""
    kind, word = p.take()
    if kind != "word":
        raise ExpressionError(f"expected a task name in {p.expr!r}, got {word!r}")
    task, _, prop = word.rpartition(".") if "." in word else (word, "", "")
    if prop and prop not in _PROPS:
        task, prop = word, ""            # a dotted task name without a property
    return task, prop


def eval_depends(expr: str | None, phases: Mapping[str, str]) -> bool:
    """Is ``expr`` true given each task's phase (``{"deploy": "Succeeded", ...}``)? None is true."""
    if expr is None or not expr.strip():
        return True

    def atom(p: _Parser) -> bool:
        task, prop = _depends_term(p)
        if task not in phases:
            raise ExpressionError(f"depends {p.expr!r} names task {task!r}, which has no result "
                                  f"(known: {', '.join(sorted(phases)) or 'none'})")
        phase = phases[task]
        if not prop:
            return phase in ("Succeeded", "Skipped", "Daemoned")
        return phase in _PROPS[prop]
    return _Parser(expr, atom).parse()


# ------------------------------------------------------------------ when

def _literal(kind: str, text: str) -> object:
    if kind == "str":
        return text
    if text in ("true", "false"):
        return text == "true"
    try:
        return float(text)
    except ValueError:
        return text                    # a bare word: compared as a string


def _as_text(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def eval_when(expr: str | None) -> bool:
    """Is a substituted ``when`` expression true? None is true."""
    if expr is None or not expr.strip():
        return True
    if refs.find(expr):
        raise ExpressionError(f"when {expr!r} still holds references; substitute them first")

    def atom(p: _Parser) -> bool:
        kind, text = p.take()
        if kind == "op":
            raise ExpressionError(f"expected a value in {p.expr!r}, got {text!r}")
        lhs = _literal(kind, text)
        nxt = p.peek()
        if nxt is None or nxt[0] != "op" or nxt[1] not in ("==", "!=", "=~", "!~"):
            if isinstance(lhs, bool):
                return lhs
            raise ExpressionError(f"{text!r} in {p.expr!r} is not a boolean; compare it with == or =~")
        op = p.take()[1]
        rkind, rtext = p.take()
        if rkind == "op":
            raise ExpressionError(f"expected a value after {op!r} in {p.expr!r}")
        rhs = _literal(rkind, rtext)
        if op in ("=~", "!~"):
            try:
                hit = re.search(_as_text(rhs), _as_text(lhs)) is not None
            except re.error as exc:
                raise ExpressionError(f"bad regex {rtext!r} in {p.expr!r}: {exc}") from None
            return hit if op == "=~" else not hit
        same = _as_text(lhs) == _as_text(rhs) if type(lhs) is not type(rhs) else lhs == rhs
        return same if op == "==" else not same
    return _Parser(expr, atom).parse()


# ------------------------------------------------------------------ lint

def depends_tasks(expr: str | None) -> list[str]:
    """The task names a ``depends`` expression mentions, in order; ExpressionError when it does not parse."""
    names: list[str] = []

    def atom(p: _Parser) -> bool:
        task, _ = _depends_term(p)
        if task not in names:
            names.append(task)
        return True
    if expr is not None and expr.strip():
        _Parser(expr, atom).parse()
    return names


def check_when(expr: str | None) -> None:
    """ExpressionError when a ``when`` expression would not evaluate, whatever its references hold.

    Each reference stands in as ``true``: a boolean where it is unquoted, text where it is quoted."""
    if expr is not None and expr.strip():
        eval_when(refs.fill(expr, "true"))
