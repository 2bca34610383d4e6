"""Hostile gate options: every number on a gate's command line has a declared range and must be finite; what is
out of range is refused before anything runs with one line naming the flag (exit 2), never a traceback and never
a silent default (``--k nan`` once turned a -19.8% drop into PASS, ``--window 0`` used the whole history)."""

from __future__ import annotations

import argparse
import math
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gauntlet.contract import UsageError
from gauntlet.params import load_profile
from gauntlet.steps import STEPS, load_step
from gauntlet.steps.options import add_options, numeric_fields, options_from
from gauntlet.workflows.cli import main as gauntlet

LOCAL = load_profile("local-cpu")
KIMI = load_profile("kimi-k3-h20")
ENDPOINT = "http://127.0.0.1:9"

# gate -> (profile, the arguments that make its other options valid): the gates with numbers on their command line
BASE = {
    "regress": (LOCAL, []),
    "perf": (LOCAL, ["--engine", "vllm", "--endpoint", ENDPOINT, "--cases", LOCAL.bench.cases[0].name]),
    "prewarm": (KIMI, []),
    "network": (KIMI, []),
    "deploy": (LOCAL, ["--engine", "vllm"]),
}


def _build(gate: str, argv: list[str]):
    """What the step runner does with a command line: parse it, then build the gate's Options once."""
    profile, base = BASE[gate]
    cls = load_step(gate).Options
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_options(cls, parser)
    # --flag=value: argparse takes "-inf" or "-1e+16" after a space for another flag
    argv = [f"{a}={b}" for a, b in zip(argv[::2], argv[1::2], strict=True)]
    return options_from(cls, parser.parse_args([*base, *argv]), profile)


def test_every_number_on_every_gate_declares_a_range():
    """A new numeric option without bounds fails here, not in a hostile user's hands."""
    seen = {}
    for name in STEPS:
        for flag, (_, (ge, gt, le, lt)) in numeric_fields(load_step(name).Options).items():
            seen[f"{name} {flag}"] = (ge, gt, le, lt)
            assert (ge, gt) != (None, None) and (le, lt) != (None, None), f"{name} {flag}: declare ge/gt and le/lt"
    assert set(seen) >= {"regress --k", "regress --window", "regress --min-history", "perf --rounds",
                         "perf --sample-interval", "prewarm --streams", "network --nproc", "deploy --context-length"}
    # the property test below reaches every numeric flag through a gate in BASE (experiment's are perf's)
    assert {f for n in STEPS for f in numeric_fields(load_step(n).Options)} <= \
        {f for g in BASE for f in numeric_fields(load_step(g).Options)}, "add the gate to BASE"


@pytest.mark.parametrize("gate,argv,says", [
    ("regress", ["--k", "nan"], "--k nan: must be a finite number"),
    ("regress", ["--k", "inf"], "--k inf: must be a finite number"),
    ("regress", ["--k", "-inf"], "--k -inf: must be a finite number"),
    ("regress", ["--k", "-1"], "--k -1.0: must be greater than 0"),
    ("regress", ["--k", "0"], "--k 0.0: must be greater than 0"),
    ("regress", ["--k", "1"], "--k 1.0: must be at least the suspect band's k 1.5"),
    ("regress", ["--k", "1e400"], "--k inf: must be a finite number"),
    ("regress", ["--window", "-8"], "--window -8: must be at least 1"),
    ("regress", ["--window", "0"], "--window 0: must be at least 1"),
    ("regress", ["--window", str(10**30)], f"--window {10**30}: must be at most 10000"),
    ("regress", ["--min-history", "0"], "--min-history 0: must be at least 1"),
    ("regress", ["--window", "5", "--min-history", "7"], "--min-history 7: must be at most --window 5"),
    ("perf", ["--rounds", "0"], "--rounds 0: must be at least 1"),
    ("perf", ["--rounds", "-3"], "--rounds -3: must be at least 1"),
    ("perf", ["--rounds", str(10**30)], "must be at most 100"),
    ("perf", ["--sample-interval", "nan"], "--sample-interval nan: must be a finite number"),
    ("perf", ["--sample-interval", "0"], "--sample-interval 0.0: must be at least 0.05"),
    ("perf", ["--sample-interval", "-1"], "--sample-interval -1.0: must be at least 0.05"),
    ("prewarm", ["--streams", "100000"], "--streams 100000: must be at most 256"),
    ("network", ["--nproc", "-2"], "--nproc -2: must be at least 1"),
    ("deploy", ["--context-length", "-5"], "--context-length -5: must be at least 1"),
])
def test_out_of_range_is_one_line_naming_the_flag(gate, argv, says):
    with pytest.raises(UsageError) as exc:
        _build(gate, argv)
    assert says in str(exc.value) and "\n" not in str(exc.value)


def test_the_command_line_exits_2_with_one_line(tmp_path, capsys):
    """Through the real CLI: nothing runs (no verdict of a judged night), exit 2, one line on stderr."""
    for argv, says in ((["--k", "nan"], "--k nan"), (["--window", "-8"], "--window -8"),
                       (["--window", "0"], "--window 0")):
        rc = gauntlet(["step", "regress", "--profile", "local-cpu", "--out", str(tmp_path / "o"),
                       "--results-uri", str(tmp_path / "store"), *argv])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and err == [f"UsageError: {err[0].split('UsageError: ', 1)[1]}"] and says in err[0]
        assert "Traceback" not in "".join(err)


def test_valid_values_are_kept():
    o = _build("regress", ["--k", "2.5", "--window", "7", "--min-history", "7"])
    assert (o.k, o.window, o.min_history) == (2.5, 7, 7) and o.rule.k == 2.5
    assert _build("perf", ["--rounds", "1", "--sample-interval", "0.05"]).rounds == 1


_NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.sampled_from([0, -1, 1, 2**31, 2**63, -(2**63), 1e308, 5e-324, -0.0]),
)
_CASES = [(g, flag, kind) for g in BASE for flag, (kind, _) in numeric_fields(load_step(g).Options).items()]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.sampled_from(_CASES), value=_NUMBERS)
def test_any_number_is_refused_in_one_line_or_accepted_within_range(case, value):
    """Property: a generated number (NaN, inf, negative, huge, tiny) is either accepted, finite and inside the
    flag's declared range, or refused by argparse (exit 2: not a number of the flag's type) or by a one-line
    UsageError naming the flag; nothing else escapes."""
    gate, flag, kind = case
    text = repr(value) if isinstance(value, float) else str(value)
    try:
        opts = _build(gate, [flag, text])
    except argparse.ArgumentError:
        assert kind is int and not re.fullmatch(r"-?\d+", text)      # "1e+308", "nan" for an int flag
        return
    except UsageError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("--") and flag in str(exc), str(exc)
        return
    got = getattr(opts, flag[2:].replace("-", "_"))
    ge, gt, le, lt = numeric_fields(type(opts))[flag][1]
    assert math.isfinite(got)
    assert (ge is None or got >= ge) and (gt is None or got > gt) and (le is None or got <= le) and \
        (lt is None or got < lt)
