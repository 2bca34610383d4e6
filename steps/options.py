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
builds the object from parsed arguments, and a test simply calls ``Options(profile=p, endpoint=...)``.

``profile`` is not a command-line field: the step runner loads ``--profile`` once and passes the
:class:`~gauntlet.params.Profile` in. A field's type decides its parsing: ``str``, ``int``, ``float``,
``Path`` (each optionally ``| None``); ``bool`` (a switch: ``--x`` when False by default,
``--x/--no-x`` when True); ``tuple[str, ...]`` (``csv=True``: one comma-separated value; otherwise
``nargs``, default ``"*"``).
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from gauntlet.contract import UsageError
from gauntlet.params import Profile

__all__ = ["GateOptions", "option", "add_options", "options_from", "Opt"]

Opt = TypeVar("Opt", bound="GateOptions")
_META = "gauntlet.option"


def option(default: Any = MISSING, *, help: str = "", flag: str | None = None, choices: tuple[Any, ...] | None = None,
           csv: bool = False, nargs: str | None = None, metavar: str | None = None, cli: bool = True) -> Any:
    """A gate option. No ``default`` makes it required on the command line (and in the constructor)."""
    meta = {_META: {"help": help, "flag": flag, "choices": choices, "csv": csv, "nargs": nargs,
                    "metavar": metavar, "cli": cli}}
    if isinstance(default, list | dict | set):
        raise TypeError("option(): use a tuple (options are frozen), not a mutable default")
    return field(default=default, metadata=meta)


@dataclass(frozen=True, kw_only=True)
class GateOptions:
    """The options every gate has: the profile the runner loaded (None for a gate that needs none)."""

    profile: Profile | None = field(default=None, metadata={_META: {"cli": False}})

    def __post_init__(self) -> None:
        pass

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
            kw["default"] = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
        parser.add_argument(_flag(f, meta), **kw)


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
