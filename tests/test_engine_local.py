"""gauntlet.steps.engines.local_vllm: readiness with a deadline, fail fast on death, nothing left behind.

The engine here is tests/fakes/fake_engine.py (a real subprocess that forks a
grandchild like vLLM's engine core), so every case runs in about a second; the
real engine is driven by tests/test_deploy_local.py.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gauntlet.steps.engines.local_vllm import (EngineDied, EngineError, EngineTimeout, LocalEngine, free_port, group_members,
                                 kill_group)

FAKE = Path(__file__).parent / "fakes" / "fake_engine.py"
REPO = Path(__file__).resolve().parent.parent


def fake(mode: str, tmp_path: Path, timeout: float = 20.0, grace: float = 5.0) -> LocalEngine:
    port = free_port()
    return LocalEngine([sys.executable, str(FAKE), mode, str(port), "m"], port=port, served_name="m",
                       log_path=tmp_path / "engine.log", startup_timeout_s=timeout, grace_s=grace, poll_s=0.1)


def wait_for(pred, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_ready_engine_then_whole_group_stopped(tmp_path: Path) -> None:
    with fake("ready", tmp_path) as eng:
        pgid = eng.pgid
        assert eng.startup_s is not None and 0.3 < eng.startup_s < 10
        assert len(group_members(pgid)) == 2                 # leader + its forked "engine core"
        assert eng.peak_rss_bytes > 1_000_000
    assert group_members(pgid) == []
    assert not eng.alive()


def test_engine_that_dies_fails_fast_with_code_and_log(tmp_path: Path) -> None:
    eng = fake("die", tmp_path, timeout=60)
    t0 = time.monotonic()
    with pytest.raises(EngineDied) as info:
        eng.launch()
    assert time.monotonic() - t0 < 10                          # not the 60 s deadline
    assert info.value.returncode == 3
    assert "could not allocate the KV cache" in str(info.value)
    assert group_members(eng.pgid) == []                       # the orphaned grandchild was killed too


def test_readiness_timeout_fails_and_leaves_nothing(tmp_path: Path) -> None:
    eng = fake("hang", tmp_path, timeout=1.5)
    with pytest.raises(EngineTimeout, match=r"not ready within 2s.*last probe: ConnectError"):
        eng.launch()
    assert group_members(eng.pgid) == []


def test_sigterm_ignored_gets_sigkill(tmp_path: Path) -> None:
    eng = fake("stubborn", tmp_path, grace=0.5).start()
    wait_for(lambda: "pgid=" in (tmp_path / "engine.log").read_text())
    wait_for(lambda: len(group_members(eng.pgid)) == 2)
    t0 = time.monotonic()
    killed = kill_group(eng.pgid, grace_s=0.5, reap=eng.proc)
    assert len(killed) == 2 and 0.4 < time.monotonic() - t0 < 5
    assert group_members(eng.pgid) == []
    assert eng.proc.returncode == -signal.SIGKILL


def test_port_in_use_is_refused_before_starting(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        eng = LocalEngine([sys.executable, str(FAKE), "ready", str(port), "m"], port=port, served_name="m",
                          log_path=tmp_path / "engine.log")
        with pytest.raises(EngineError, match=f"port {port} .* already in use"):
            eng.launch()
        assert eng.proc is None


def test_wrong_served_name_is_not_ready(tmp_path: Path) -> None:
    port = free_port()
    eng = LocalEngine([sys.executable, str(FAKE), "ready", str(port), "other"], port=port, served_name="m",
                      log_path=tmp_path / "engine.log", startup_timeout_s=2, poll_s=0.1)
    with pytest.raises(EngineTimeout, match=r"lists \['other'\], not 'm'"):
        eng.launch()
    assert group_members(eng.pgid) == []


DRIVER = """
import sys
from pathlib import Path
from gauntlet.steps.engines.local_vllm import LocalEngine, sigterm_as_interrupt
argv = [sys.executable, sys.argv[1], "hang", sys.argv[2], "m"]
with sigterm_as_interrupt():
    LocalEngine(argv, port=int(sys.argv[2]), served_name="m", log_path=Path(sys.argv[3])).launch()
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_while_waiting_leaves_nothing(tmp_path: Path, sig: signal.Signals) -> None:
    log = tmp_path / "engine.log"
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(FAKE), str(free_port()), str(log)], cwd=REPO,
                            stderr=subprocess.PIPE, text=True)
    pgid = int(wait_for(lambda: re.search(r"pgid=(\d+)", log.read_text() if log.exists() else ""), 20).group(1))
    wait_for(lambda: len(group_members(pgid)) == 2)
    proc.send_signal(sig)                                       # Ctrl-C / kill during the readiness wait
    proc.wait(timeout=30)
    assert "KeyboardInterrupt" in proc.stderr.read()
    assert group_members(pgid) == []
