"""A local engine under test: a subprocess in its own process group, ready or failed, never left behind.

:class:`LocalEngine` starts the engine's argv (from :mod:`gauntlet.steps.engines.commands`) with
``start_new_session`` so the whole tree (API server + engine core) shares one
process group that nothing else is in, logs to a file, waits for ``/health``
and ``/v1/models`` with a deadline, fails fast when the process dies, and kills
the group (SIGTERM, then SIGKILL after a grace period) on exit, on error and on
Ctrl-C. The process-group helpers work from a recorded pgid alone, so another
process (teardown, the run's exit handler) can stop an engine it did not start.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from gauntlet.contract import GauntletError
from gauntlet.steps.client.http import EngineClient

__all__ = ["LocalEngine", "EngineError", "EngineDied", "EngineTimeout", "group_members", "group_rss_bytes",
           "kill_group", "free_port", "port_open", "log_tail", "sigterm_as_interrupt"]

PAGE = os.sysconf("SC_PAGE_SIZE")


class EngineError(GauntletError):
    """The engine did not become ready; the message names the cause and ends with the log tail (a verdict: exit 1)."""


class EngineDied(EngineError):
    def __init__(self, returncode: int | None, tail: str, startup_s: float):
        self.returncode, self.tail, self.startup_s = returncode, tail, startup_s
        super().__init__(f"engine exited with code {returncode} after {startup_s:.1f}s; last log lines:\n{tail}")


class EngineTimeout(EngineError):
    def __init__(self, timeout_s: float, last_error: str, tail: str):
        self.timeout_s, self.last_error, self.tail = timeout_s, last_error, tail
        super().__init__(f"engine not ready within {timeout_s:.0f}s (last probe: {last_error}); "
                         f"last log lines:\n{tail}")


# ------------------------------------------------------------ process groups, from /proc alone

def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, pgrp, rss_bytes) of a pid, None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = text[text.rindex(")") + 2:].split()   # after "pid (comm) "; comm may hold spaces
    return fields[0], int(fields[2]), int(fields[21]) * PAGE


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) pids in process group ``pgid``."""
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            st = _stat(int(entry.name))
            if st is not None and st[1] == pgid and st[0] not in ("Z", "X"):
                out.append(int(entry.name))
    return sorted(out)


def group_rss_bytes(pgid: int) -> int:
    """Resident memory of every process in the group (the engine's whole tree)."""
    total = 0
    for pid in group_members(pgid):
        st = _stat(pid)
        total += st[2] if st else 0
    return total


def kill_group(pgid: int, grace_s: float = 10.0, reap: subprocess.Popen | None = None) -> list[int]:
    """SIGTERM the group, SIGKILL what is left after ``grace_s``; return the pids that were alive.

    ``reap`` is our own child (the group leader), waited for so it does not linger as a zombie.
    Raises EngineError if anything survives SIGKILL.
    """
    with _signals_deferred():
        return _kill_group(pgid, grace_s, reap)


@contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold SIGINT/SIGTERM while killing: a second Ctrl-C must not cut the kill short."""
    sigs = {signal.SIGINT, signal.SIGTERM}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _kill_group(pgid: int, grace_s: float, reap: subprocess.Popen | None) -> list[int]:
    alive = group_members(pgid)
    if not alive:
        _reap(reap)
        return []
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            _reap(reap)
            if not group_members(pgid):
                _reap(reap, wait_s=2.0)      # the leader may have died after the poll above
                return alive
            time.sleep(0.1)
    _reap(reap)
    left = group_members(pgid)
    if left:
        raise EngineError(f"process group {pgid} survived SIGKILL: pids {left}")
    return alive


def _reap(proc: subprocess.Popen | None, wait_s: float = 0.0) -> None:
    if proc is None:
        return
    try:
        proc.wait(timeout=wait_s) if wait_s else proc.poll()
    except subprocess.TimeoutExpired:
        pass


def port_open(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM and SIGINT as Ctrl-C while inside, so `finally` blocks kill what we started.

    SIGINT too: a process started in the background by a non-interactive shell (`cmd &`, CI jobs)
    inherits SIGINT *ignored*, and Python then installs no KeyboardInterrupt for it, so an interrupt
    would be lost and the engine left running."""
    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    try:
        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    except ValueError:            # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


# ------------------------------------------------------------ the engine

@dataclass
class LocalEngine:
    """One engine process group. ``with LocalEngine(...) as e:`` starts it, waits, and always stops it."""

    argv: list[str]
    port: int
    served_name: str
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)   # added to this process's environment
    host: str = "127.0.0.1"
    startup_timeout_s: float = 600.0
    grace_s: float = 10.0
    poll_s: float = 0.5
    proc: subprocess.Popen | None = field(default=None, init=False, repr=False)
    started_at: float | None = field(default=None, init=False)
    startup_s: float | None = field(default=None, init=False)
    peak_rss_bytes: int = field(default=0, init=False)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def pgid(self) -> int | None:
        return self.proc.pid if self.proc else None   # start_new_session: the leader's pid is the group id

    def start(self) -> LocalEngine:
        if port_open(self.host, self.port):
            # a stale engine would answer the readiness probe in ours' place
            raise EngineError(f"port {self.port} on {self.host} is already in use; stop what listens there "
                              f"(an earlier run's engine? `gauntlet step teardown`) or change engines.*.port")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.started_at = time.monotonic()
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         env={**os.environ, **self.env}, start_new_session=True)
        return self

    def sample_rss(self) -> int:
        if self.pgid is not None:
            self.peak_rss_bytes = max(self.peak_rss_bytes, group_rss_bytes(self.pgid))
        return self.peak_rss_bytes

    def wait_ready(self) -> float:
        """Block until /health is 200 and /v1/models lists the served name; return start-up seconds."""
        assert self.proc is not None and self.started_at is not None, "start() first"
        deadline = self.started_at + self.startup_timeout_s
        last = "not probed yet"
        with EngineClient(self.base_url, timeout_s=5.0, trust_env=False) as client:
            while True:
                self.sample_rss()
                rc = self.proc.poll()
                if rc is not None:
                    raise EngineDied(rc, log_tail(self.log_path), time.monotonic() - self.started_at)
                last = _probe(client, self.served_name)
                if last == "ready":
                    self.startup_s = time.monotonic() - self.started_at
                    return self.startup_s
                if time.monotonic() >= deadline:
                    raise EngineTimeout(self.startup_timeout_s, last, log_tail(self.log_path))
                time.sleep(self.poll_s)

    def launch(self) -> LocalEngine:
        """start + wait_ready; on any failure (also Ctrl-C) the group is killed before re-raising."""
        try:
            self.start()
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> list[int]:
        if self.proc is None:
            return []
        return kill_group(self.proc.pid, self.grace_s, reap=self.proc)

    def __enter__(self) -> LocalEngine:
        return self.launch()

    def __exit__(self, *exc) -> None:
        self.stop()


def _probe(client: EngineClient, served_name: str) -> str:
    """'ready', or what is not ready yet (one line)."""
    try:
        r = client.health()
        if r.status_code != 200:
            return f"/health HTTP {r.status_code}"
        r = client.get("/v1/models")
        if r.status_code != 200:
            return f"/v1/models HTTP {r.status_code}"
        ids = [m.get("id") for m in r.json().get("data", [])]
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return "ready" if served_name in ids else f"/v1/models lists {ids}, not {served_name!r}"
