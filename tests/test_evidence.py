"""The evidence contract: verdict.json, outputs/, and the exit codes every step uses."""

from __future__ import annotations

import argparse
import json
import types

import pytest

from gauntlet.steps import Needs
from gauntlet.contract import Check, TransientError, UsageError, Verdict, overall_status
from gauntlet.steps.options import GateOptions
from gauntlet.steps.runner import run_step


def _module(fn):
    return types.SimpleNamespace(NAME="demo", HELP="", NEEDS=Needs(profile=False), Options=GateOptions, run=fn)


def _args(tmp_path):
    return argparse.Namespace(out=str(tmp_path / "ev"), profile=None)


def _pass(args, out):
    return [Check("a", "pass", 1, 1, "ok"), Check("b", "skip", None, None, "n/a")], {"outputs": {"unlock_x": True}}


def _fail(args, out):
    return [Check("a", "pass"), Check("shard-present", "fail", "96", "95", "model-00007 missing")], {}


def _usage(args, out):
    raise UsageError("--engine trtllm: not in profile")


def _transient(args, out):
    raise TransientError("API server 503")


def _bug(args, out):
    raise KeyError("boom")


@pytest.mark.parametrize("fn,code,status", [
    (_pass, 0, "pass"), (_fail, 1, "fail"), (_transient, 75, "error"), (_bug, 1, "error"),
])
def test_exit_codes_and_verdict(tmp_path, capsys, fn, code, status):
    rc = run_step(_module(fn), _args(tmp_path))
    assert rc == code
    out = tmp_path / "ev"
    v = json.loads((out / "verdict.json").read_text())
    assert v["gate"] == "demo" and v["status"] == status and v["started"] and v["finished"]
    assert all({"name", "status", "expected", "observed", "detail"} <= set(c) for c in v["checks"])
    assert (out / "outputs" / "verdict").read_text() == status
    assert "Traceback" not in capsys.readouterr().err


def test_outputs_become_files(tmp_path):
    run_step(_module(_pass), _args(tmp_path))
    assert (tmp_path / "ev" / "outputs" / "unlock_x").read_text() == "true"


def test_usage_error_exit_2_one_line(tmp_path, capsys):
    assert run_step(_module(_usage), _args(tmp_path)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["UsageError: --engine trtllm: not in profile"]


def test_unexpected_error_keeps_trace_beside_verdict(tmp_path, capsys):
    run_step(_module(_bug), _args(tmp_path))
    assert "KeyError" in (tmp_path / "ev" / "traceback.txt").read_text()
    assert "Traceback" not in capsys.readouterr().err


def test_overall_status_rules():
    assert overall_status([]) == "error"
    assert overall_status([Check("a", "skip")]) == "skip"
    assert overall_status([Check("a", "skip"), Check("b", "pass")]) == "pass"
    assert overall_status([Check("a", "pass"), Check("b", "fail")]) == "fail"
    assert overall_status([Check("a", "fail"), Check("b", "error")]) == "error"
    with pytest.raises(ValueError):
        Check("a", "ok")


def test_verdict_roundtrip(tmp_path):
    v = Verdict.of("g", "t0", [Check("a", "fail", 1, 2, "x")], {"m": 1})
    v.write(tmp_path)
    back = Verdict.read(tmp_path)
    assert back.status == "fail" and back.failed_checks()[0].observed == 2 and back.metrics == {"m": 1}
