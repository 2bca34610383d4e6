"""One-line error text for pydantic errors, bounded in size and cost whatever the input holds.

``short`` never calls ``repr()`` on a whole value: a YAML bomb or a 4,000-character string
in a field costs the same as a short one (reprlib stops after a few items and characters).
"""

from __future__ import annotations

import reprlib
from typing import Any

__all__ = ["short", "describe", "join"]

_REPR = reprlib.Repr()
_REPR.maxstring = 60
_REPR.maxother = 60
_REPR.maxlevel = 2
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = _REPR.maxfrozenset = 4
_REPR.maxlong = 40

MAX_ERRORS = 5          # errors named in one message; the rest are counted
MAX_PART = 1000         # characters of one error's text


def short(v: Any) -> str:
    """A bounded, one-line repr of ``v`` (at most ~60 characters per string)."""
    if isinstance(v, bytes | bytearray):
        v = bytes(v[:40])
    return _REPR.repr(v)


def _one_line(text: str, limit: int) -> str:
    if not text.isprintable():      # \n, \f, U+2028 ...: anything str.splitlines would break the line at
        text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def describe(e: Any) -> str:
    """One pydantic error (an ``ErrorDetails``) as ``a.b.c: expected int, got 'sixteen'``."""
    loc = ".".join(_one_line(str(x), 64) for x in e["loc"])
    typ = e["type"]
    if typ == "extra_forbidden":
        msg = "unknown key (check the spelling against params/models.py)"
    elif typ == "missing":
        msg = "required key is missing"
    elif typ == "finite_number":
        msg = f"expected a finite number, got {short(e.get('input'))}"
    elif typ.endswith("_type") or typ.endswith("_parsing"):
        want = typ.split("_")[0]
        want = {"string": "str", "dict": "mapping", "list": "list", "bool": "bool"}.get(want, want)
        msg = f"expected {want}, got {short(e.get('input'))}"
    elif typ == "literal_error":
        msg = f"{e['msg'].lower()}, got {short(e.get('input'))}"
    elif typ in ("greater_than", "greater_than_equal", "less_than", "less_than_equal", "too_long", "too_short",
                 "string_too_long", "string_too_short"):
        msg = f"{e['msg'].lower()}, got {short(e.get('input'))}"
    else:
        msg = e["msg"].removeprefix("Value error, ")
    return _one_line(f"{loc}: {msg}" if loc else msg, MAX_PART)


def join(errors: list[Any]) -> str:
    """The first MAX_ERRORS errors described and joined by '; ', then how many more there were."""
    parts = [describe(e) for e in errors[:MAX_ERRORS]]
    if len(errors) > MAX_ERRORS:
        parts.append(f"and {len(errors) - MAX_ERRORS} more errors")
    return "; ".join(parts)
