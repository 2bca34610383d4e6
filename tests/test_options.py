"""Typed gate options (gauntlet.steps.options): declared once, the command line and the object agree."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from pathlib import Path

import pytest

from gauntlet.contract import UsageError
from gauntlet.params import load_profile
from gauntlet.steps.options import GateOptions, add_options, option, options_from


@dataclass(frozen=True, kw_only=True)
class Demo(GateOptions):
    endpoint: str = option(help="engine base URL")
    engine: str | None = option(None, help="engine")
    cases: tuple[str, ...] = option((), csv=True, help="case names")
    inputs: tuple[str, ...] | None = option(None, help="dirs")
    rounds: int | None = option(None, help="rounds")
    no_store: bool = option(False, help="do not store")
    verify: bool = option(True, help="verify TLS")
    launcher: str | None = option(None, choices=("local", "kubernetes"))
    src: Path | None = option(None)

    def __post_init__(self) -> None:
        if self.rounds is not None and self.rounds < 1:
            raise UsageError(f"--rounds {self.rounds}: at least 1")


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(exit_on_error=False)
    add_options(Demo, p)
    return p.parse_args(argv)


def test_flags_follow_the_declaration():
    ns = parse(["--endpoint", "http://h:1", "--cases", "a, b,,c", "--inputs", "x", "y", "--rounds", "3",
                "--no-store", "--no-verify", "--launcher", "local", "--src", "/m"])
    o = options_from(Demo, ns, None)
    assert (o.endpoint, o.cases, o.inputs, o.rounds, o.no_store, o.verify, o.launcher, o.src) == \
        ("http://h:1", ("a", "b", "c"), ("x", "y"), 3, True, False, "local", Path("/m"))
    d = options_from(Demo, parse(["--endpoint", "e"]), None)
    assert (d.engine, d.cases, d.inputs, d.rounds, d.no_store, d.verify) == (None, (), None, None, False, True)


def test_required_choices_and_validation_fail_up_front():
    with pytest.raises(SystemExit):
        parse([])                                   # --endpoint is required
    with pytest.raises(argparse.ArgumentError):
        parse(["--endpoint", "e", "--launcher", "ssh"])
    with pytest.raises(UsageError, match="--rounds 0"):
        options_from(Demo, parse(["--endpoint", "e", "--rounds", "0"]), None)
    with pytest.raises(UsageError, match="endpoint"):
        options_from(Demo, argparse.Namespace(), None)   # a hand-made namespace missing a required field


def test_frozen_and_built_directly_by_a_test():
    p = load_profile("local-cpu")
    o = Demo(profile=p, endpoint="e")
    assert o.the_profile is p
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.engine = "x"  # type: ignore[misc]
    with pytest.raises(UsageError, match="--profile is required"):
        Demo(endpoint="e").the_profile  # noqa: B018


def test_every_field_must_be_declared_with_option():
    @dataclass(frozen=True, kw_only=True)
    class Bad(GateOptions):
        x: int = 1

    with pytest.raises(TypeError, match="option"):
        add_options(Bad, argparse.ArgumentParser())
