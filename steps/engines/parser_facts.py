"""What an engine's own argparse parser says about an argv, for Gate 0's engine-check adapters.

The SGLang and vLLM adapters (:mod:`gauntlet.steps.engines.sglang`, :mod:`gauntlet.steps.engines.vllm`) feed the
planned argv to the engine's parser through :func:`parse` (its errors caught, never printed or exiting) and read
back the options it sets away from the parser's defaults (:func:`options`).
"""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

__all__ = ["ParseError", "refuse", "parse", "plain", "actions", "action", "options"]


class ParseError(Exception):
    """The parser's own error message, raised instead of argparse's print-usage-and-exit."""


def refuse(msg: str) -> NoReturn:
    raise ParseError(msg)


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[argparse.Namespace | None, str | None]:
    parser.error = refuse  # type: ignore[method-assign, assignment]  # argparse would print usage and exit(2)
    try:
        return parser.parse_args(argv), None
    except ParseError as exc:
        return None, str(exc)
    except SystemExit as exc:
        return None, f"parser exited with {exc.code}"
    except Exception as exc:  # a type= converter that raises its own error
        return None, f"{type(exc).__name__}: {exc}"


def plain(v: Any) -> Any:
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if isinstance(v, list | tuple):
        return [plain(x) for x in v]
    return str(v)


def actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """dest -> the action that owns it (the first one: deprecated aliases share a dest)."""
    out: dict[str, argparse.Action] = {}
    for a in parser._actions:
        if a.option_strings and a.dest not in ("help", argparse.SUPPRESS):
            out.setdefault(a.dest, a)
    return out


def action(parser: argparse.ArgumentParser, flag: str) -> argparse.Action | None:
    return next((a for a in actions(parser).values() if flag in a.option_strings), None)


def options(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> dict[str, Any]:
    """The options the command sets away from the parser's defaults, keyed by their long flag."""
    out: dict[str, Any] = {}
    for dest, act in actions(parser).items():
        v = getattr(ns, dest, None)
        if v != act.default:
            flag = next((o for o in act.option_strings if o.startswith("--")), act.option_strings[0])
            out[flag] = plain(v)
    return out
