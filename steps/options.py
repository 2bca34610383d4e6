"""Typed gate options: each gate declares one frozen dataclass; the CLI, a test or a back end builds it once.

A gate never sees an argparse Namespace. It declares::

    @dataclass(frozen=True, kw_only=True)
    class Options(GateOptions):
        endpoint: str = option(help="engine base URL")              # required: no default
        engine: str | None = option(None, help="engine in the profile (default: the baseline)")
        cases: tuple[str, ...] = option((), csv=True, help="comma-separated case names")

        def __post_init__(self) -> None:                            # validation, up front
            super().__post_init__()
            if self.engine is not None and self.engine not in self.profile.engines: raise UsageError(...)

and runs ``run(opts: Options, out: Path)``. :func:`add_options` turns the fields into the command line
(``--endpoint``, ``--engine``, ``--cases``: the flags the rendered templates pass), :func:`options_from`
builds the object from parsed arguments, :func:`to_argv` writes field values back as that command line (the
graph's tasks), and a test simply calls ``Options(profile=p, endpoint=...)``.

``profile`` is not a command-line field: the step runner loads ``--profile`` once and passes the
:class:`~gauntlet.params.Profile` in. A field's type decides its parsing: ``str``, ``int``, ``float``,
``Path`` (each optionally ``| None``); ``bool`` (a switch: ``--x`` when False by default,
``--x/--no-x`` when True); ``tuple[str, ...]`` (``csv=True``: one comma-separated value; otherwise
``nargs``, default ``"*"``).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from gauntlet.contract import UsageError
from gauntlet.params import Profile

__all__ = ["GateOptions", "option", "add_options", "options_from", "to_argv", "Opt", "check_ranges", "numeric_fields"]

Opt = TypeVar("Opt", bound="GateOptions")
_META = "gauntlet.option"


def option(default: Any = MISSING, *, help: str = "", flag: str | None = None, choices: tuple[Any, ...] | None = None,
           csv: bool = False, nargs: str | None = None, metavar: str | None = None, cli: bool = True,
           ge: float | None = None, gt: float | None = None, le: float | None = None, lt: float | None = None) -> Any:
    """A gate option. No ``default`` makes it required on the command line (and in the constructor).

    A number (``int`` or ``float``) states its range with ``ge``/``gt`` (the lower bound) and ``le``/``lt``
    (the upper); a float must be finite (NaN and infinities are refused). :class:`GateOptions` checks
    both when the object is built, and the error names the flag: ``--window -8: must be at least 1``.
    """
    meta = {_META: {"help": help, "flag": flag, "choices": choices, "csv": csv, "nargs": nargs,
                    "metavar": metavar, "cli": cli, "range": (ge, gt, le, lt)}}
    if isinstance(default, list | dict | set):
        raise TypeError("option(): use a tuple (options are frozen), not a mutable default")
    if (ge is not None and gt is not None) or (le is not None and lt is not None):
        raise TypeError("option(): one lower bound (ge or gt) and one upper bound (le or lt)")
    return field(default=default, metadata=meta)


def _range_error(value: Any, rng: tuple[float | None, ...]) -> str | None:
    """Why a number is out of its declared range, or None (pure)."""
    ge, gt, le, lt = rng
    if isinstance(value, float) and not math.isfinite(value):
        return "must be a finite number"
    if ge is not None and value < ge:
        return f"must be at least {ge}"
    if gt is not None and value <= gt:
        return f"must be greater than {gt}"
    if le is not None and value > le:
        return f"must be at most {le}"
    if lt is not None and value >= lt:
        return f"must be less than {lt}"
    return None


def numeric_fields(cls: type[GateOptions]) -> dict[str, tuple[Any, tuple[float | None, ...]]]:
    """flag -> (int or float, (ge, gt, le, lt)) for every number on ``cls``'s command line."""
    out = {}
    for f, meta, tp in _cli_fields(cls):
        base, _ = _base(tp)
        if base in (int, float):
            out[_flag(f, meta)] = (base, meta.get("range") or (None, None, None, None))
    return out


def check_ranges(opts: GateOptions) -> None:
    """Every number of ``opts`` within its declared range, floats finite; UsageError naming the flag."""
    for f in fields(opts):
        meta = f.metadata.get(_META) or {}
        value = getattr(opts, f.name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        why = _range_error(value, meta.get("range") or (None, None, None, None))
        if why:
            shown = repr(value) if isinstance(value, float) and not math.isfinite(value) else value
            raise UsageError(f"{_flag(f, meta)} {shown}: {why}")


@dataclass(frozen=True, kw_only=True)
class GateOptions:
    """The options every gate has: the profile the runner loaded (None for a gate that needs none)."""

    profile: Profile | None = field(default=None, metadata={_META: {"cli": False}})

    def __post_init__(self) -> None:
        check_ranges(self)

    @property
    def the_profile(self) -> Profile:
        """The profile, for a gate that needs one (the runner always passes it to such a gate)."""
        if self.profile is None:
            raise UsageError(f"{type(self).__module__}: --profile is required")
        return self.profile


def _cli_fields(cls: type[GateOptions]) -> list[tuple[dataclasses.Field[Any], dict[str, Any], Any]]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in fields(cls):
        meta = f.metadata.get(_META)
        if meta is None:
            raise TypeError(f"{cls.__qualname__}.{f.name}: declare it with option(...)")
        if meta.get("cli", True):
            out.append((f, meta, hints[f.name]))
    return out


def _base(tp: Any) -> tuple[Any, bool]:
    """(the type without None, whether None is allowed)."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"unsupported option type {tp}")
        return args[0], True
    return tp, False


def _flag(f: dataclasses.Field[Any], meta: dict[str, Any]) -> str:
    return meta.get("flag") or "--" + f.name.replace("_", "-")


def add_options(cls: type[GateOptions], parser: argparse.ArgumentParser) -> None:
    """The command line of ``cls``: one flag per field, help text from the declaration."""
    for f, meta, tp in _cli_fields(cls):
        base, _ = _base(tp)
        kw: dict[str, Any] = {"dest": f.name, "help": meta["help"] or None}
        required = f.default is MISSING and f.default_factory is MISSING
        if base is bool:
            kw["action"] = argparse.BooleanOptionalAction if f.default is True else "store_true"
        elif typing.get_origin(base) is tuple:
            if meta["csv"]:
                kw["metavar"] = meta["metavar"] or "A,B,..."
            else:
                kw["nargs"] = meta["nargs"] or "*"
                if meta["metavar"]:
                    kw["metavar"] = meta["metavar"]
        else:
            kw["type"] = base if base in (int, float, Path) else str
            if meta["metavar"]:
                kw["metavar"] = meta["metavar"]
        if meta["choices"] is not None:
            kw["choices"] = meta["choices"]
        if required:
            kw["required"] = True
        else:
            kw["default"] = f.default_factory() if callable(f.default_factory) else f.default   # MISSING is no callable
        parser.add_argument(_flag(f, meta), **kw)


def to_argv(cls: type[GateOptions], values: Mapping[str, Any], *, opaque: tuple[type, ...] = ()) -> tuple[str, ...]:
    """``values`` (field name -> value) as ``cls``'s command line, in the order given: what :func:`add_options`
    parses back. A bool is its switch (nothing for a switch's default), a csv tuple one comma-joined word, any
    other tuple one word per item, None (a field whose default is None) nothing.

    A value of an ``opaque`` type (a graph reference, filled in when the task runs) stands for one value of the
    field, or one item of a tuple, and is written as its ``str()``. TypeError, naming the class and the flag, on
    a name that is no command-line field, a value of the wrong type or outside the flag's choices, or a
    required option left out.
    """
    where = f"{cls.__module__}.{cls.__qualname__}"
    cli = {f.name: (f, meta, tp) for f, meta, tp in _cli_fields(cls)}
    unknown = [k for k in values if k not in cli]
    if unknown:
        raise TypeError(f"{where}: no command-line option {', '.join(unknown)} (it has {', '.join(cli)})")
    missing = [_flag(f, meta) for f, meta, _ in cli.values()
               if f.default is MISSING and f.default_factory is MISSING and f.name not in values]
    if missing:
        raise TypeError(f"{where}: required {', '.join(missing)} not given")

    def word(flag: str, base: Any, choices: tuple[Any, ...] | None, v: Any) -> str:
        if isinstance(v, opaque):
            return str(v)
        if isinstance(v, bool) or not isinstance(v, base if base is not float else (int, float)):
            raise TypeError(f"{where}: {flag} {v!r} is not a {getattr(base, '__name__', base)}")
        if choices is not None and v not in choices:
            raise TypeError(f"{where}: {flag} {v!r} is not one of {', '.join(map(str, choices))}")
        return str(v)

    argv: list[str] = []
    for name, value in values.items():
        f, meta, tp = cli[name]
        base, _ = _base(tp)
        flag = _flag(f, meta)
        if value is None:
            if f.default is not None:
                raise TypeError(f"{where}: {flag} cannot be None (its default is {f.default!r})")
        elif base is bool:
            if not isinstance(value, bool):
                raise TypeError(f"{where}: {flag} {value!r} is not a bool")
            if f.default is True:
                argv.append(flag if value else "--no-" + flag[2:])
            elif value:
                argv.append(flag)
        elif typing.get_origin(base) is tuple:
            if meta["csv"] and isinstance(value, opaque):
                argv += [flag, str(value)]
                continue
            if not isinstance(value, tuple):
                raise TypeError(f"{where}: {flag} {value!r} is not a tuple")
            items = [word(flag, str, meta["choices"], v) for v in value]
            argv += [flag, ",".join(items)] if meta["csv"] else [flag, *items]
        else:
            argv += [flag, word(flag, base, meta["choices"], value)]
    return tuple(argv)


def _value(f: dataclasses.Field[Any], meta: dict[str, Any], tp: Any, raw: Any) -> Any:
    base, _ = _base(tp)
    if raw is None or typing.get_origin(base) is not tuple:
        return raw
    if isinstance(raw, str):            # csv
        return tuple(x.strip() for x in raw.split(",") if x.strip())
    return tuple(raw)


def options_from(cls: type[Opt], ns: argparse.Namespace, profile: Profile | None = None) -> Opt:
    """Build ``cls`` from parsed arguments, once; its own validation runs here (UsageError on bad input)."""
    values = {f.name: _value(f, meta, tp, getattr(ns, f.name)) for f, meta, tp in _cli_fields(cls)
              if hasattr(ns, f.name)}
    try:
        return cls(profile=profile, **values)
    except TypeError as exc:        # a required option missing when built from a hand-made namespace
        raise UsageError(f"{cls.__module__}: {exc}") from None
