"""Start one container of the process kubelet: ``python nsexec.py PLAN.json``.

PLAN is ``{"argv": [...], "env": {...}, "cwd": "/", "mounts": [[source, target, read_only], ...]}``.
This process unshares a mount and a PID namespace, forks the container's first process
(PID 1 in the new namespace, killed by the kernel with everything it started when this
process dies: PR_SET_PDEATHSIG), bind-mounts the plan's sources at their targets in the
private mount namespace, and execs the argv. It forwards SIGTERM/SIGINT/SIGHUP/SIGQUIT/
SIGUSR1/SIGUSR2 to that process and exits with its status (128+signal when killed), as a
container runtime reports it. Standard library only: it starts for every container.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG = 1
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)

libc = ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _enc(s: str | None) -> bytes | None:
    return s.encode() if s is not None else None


def _mount(source: str | None, target: str, fstype: str | None, flags: int) -> None:
    _check(libc.mount(_enc(source), _enc(target), _enc(fstype), flags, None), f"mount {source} on {target}")


def _bind_all(mounts: list[list]) -> None:
    """Bind every source at its target; sources are opened first, so an earlier mount (over /tmp, say)
    cannot hide a later mount's source."""
    fds = [os.open(src, os.O_PATH) for src, _, _ in mounts]
    for fd, (_, target, read_only) in zip(fds, mounts):
        _mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
        if read_only:
            _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
    for fd in fds:
        os.close(fd)


def _container(plan: dict) -> None:
    """PID 1 of the new namespace: mounts, cwd, exec. Never returns."""
    try:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        _mount(None, "/", None, MS_REC | MS_PRIVATE)
        _bind_all(plan["mounts"])
        try:   # this namespace's own /proc, so `kill 1` and ps see the container's processes
            _mount("proc", "/proc", "proc", 0)
        except OSError:
            pass
        os.chdir(plan.get("cwd") or "/")
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        os.execvpe(plan["argv"][0], plan["argv"], plan["env"])
    except OSError as exc:   # what a runtime reports as StartError: exit 128, the reason on stderr
        print(f"nsexec: cannot start {plan['argv'][:1]}: {exc}", file=sys.stderr, flush=True)
        os._exit(128)


def main() -> int:
    with open(sys.argv[1]) as fh:
        plan = json.load(fh)
    _check(libc.unshare(CLONE_NEWNS | CLONE_NEWPID), "unshare")
    pid = os.fork()
    if pid == 0:
        _container(plan)
    for sig in FORWARDED:
        signal.signal(sig, lambda s, _f: os.kill(pid, s))
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except ChildProcessError:
            return 128
        except InterruptedError:
            continue
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


if __name__ == "__main__":
    sys.exit(main())
