"""One base exception carrying its exit code, mapped in one place; a broken gate is a crash, not a usage error."""

from __future__ import annotations

import pytest

from gauntlet.contract import (EXIT_FAIL, EXIT_INTERRUPTED, EXIT_TRANSIENT, EXIT_USAGE, GauntletError, TransientError,
                               UsageError, exit_code_of)
from gauntlet.params import ProfileError
from gauntlet.steps import STEPS
from gauntlet.workflows import cli


def test_one_map_from_error_to_exit_code():
    assert [exit_code_of(e) for e in (UsageError("x"), ProfileError("x"), TransientError("x"), GauntletError("x"),
                                      KeyboardInterrupt(), RuntimeError("bug"))] == \
        [EXIT_USAGE, EXIT_USAGE, EXIT_TRANSIENT, EXIT_FAIL, EXIT_INTERRUPTED, EXIT_FAIL]


def test_a_gate_that_does_not_import_is_a_crash_with_its_traceback(monkeypatch, capsys):
    monkeypatch.setitem(STEPS, "smoke", "gauntlet.steps.no_such_gate_module")
    rc = cli.main(["step", "smoke", "--endpoint", "http://127.0.0.1:9"])
    err = capsys.readouterr().err
    assert rc == EXIT_FAIL, err                         # never 2: the profile and the arguments are fine
    assert "invalid choice" not in err
    assert "Traceback" in err and "ModuleNotFoundError" in err
    assert err.strip().splitlines()[-1].startswith("GateImportError: gate smoke: its module "
                                                   "gauntlet.steps.no_such_gate_module does not import")


def test_other_gates_still_list_when_one_does_not_import(monkeypatch, capsys):
    monkeypatch.setitem(STEPS, "smoke", "gauntlet.steps.no_such_gate_module")
    with pytest.raises(SystemExit) as exc:
        cli.main(["step", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "perf" in out and "its module does not import" in out


def test_bad_profile_is_a_usage_error_without_traceback(capsys):
    rc = cli.main(["render", "--profile", "/nonexistent/profile.yaml", "--out", "/tmp/never"])
    err = capsys.readouterr().err
    assert rc == EXIT_USAGE and "Traceback" not in err and err.startswith("ProfileError: ")
