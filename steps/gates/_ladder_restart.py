"""Gate 5's engine restarts: the running engine, served again at a longer context, through Gate 2's back end.

:class:`EngineContext` reads the context the engine serves from its deployment's record (the local state
file's argv; the StatefulSet's launch script on Kubernetes: never assumed from the profile, so a later
longctx task sees what an earlier one restarted) and restarts it with ``deploy.Options(context_length=N)``
(same args otherwise) through :func:`gauntlet.steps.backends.backend_for` ``.restart``. Each restart is kept
as a :class:`Restart` for the gate's evidence. Which rung needs which context is
:func:`gauntlet.steps.gates.longctx.plan_context`'s decision, not this module's.

A restart that came up is read once more: its rank logs (``<evidence>/logs/*.log`` on Kubernetes,
``<evidence>/engine.log`` locally) are searched for the engine's own "the KV pool cannot hold one request of
this context" line (``Engine.kv_pool_capped``; SGLang's ``TpModelWorker.get_worker_info`` warning), kept as
``Restart.kv_pool``: the engine answers, but a rung of that context would be refused or truncated.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gauntlet.contract import GauntletError, TransientError
from gauntlet.steps.backends import backend_for
from gauntlet.steps.engines import engine as engine_of
from gauntlet.steps.engines.commands import args_hash

__all__ = ["Restart", "EngineContext", "kv_pool_capped"]


@dataclass
class Restart:
    rung: int
    from_context: int | None
    to_context: int
    why: str
    ok: bool = False
    seconds: float = 0.0                # stop + start + ready, wall clock
    startup_s: float | None = None      # the back end's start-up to ready
    args_hash: str = ""
    argv: list[str] = field(default_factory=list)
    evidence: str = ""                  # the restart's deploy directory
    detail: str = ""
    kv_pool: str = ""                   # the engine's "KV pool holds fewer tokens than the context" log line


def kv_pool_capped(engine: str, evidence: Path) -> str:
    """``<log file>: <line>`` for the first line of the restart's logs where the engine says its KV pool holds
    fewer tokens than the context it now serves (``Engine.kv_pool_capped``), or '' (none, or no such line)."""
    pattern = engine_of(engine).kv_pool_capped
    if pattern is None:
        return ""
    for log in sorted(Path(evidence).rglob("*.log")):
        try:
            text = log.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            if pattern.search(line):
                return f"{log.name}: {line.strip()[:400]}"
    return ""


class EngineContext:
    """The engine a ladder talks to: the context it serves now, and restarts at a longer one."""

    def __init__(self, opts: Any, engine: str, out: Path):
        self.opts, self.engine, self.out = opts, engine, Path(out)
        profile = opts.the_profile
        self.backend = backend_for(profile, opts.backend)
        self.run_dir = Path(opts.run_dir).resolve() if opts.run_dir else self.out.resolve().parent
        self.record = self.backend.deployed(profile, engine, run_dir=self.run_dir, run_id=opts.run_id)
        self.context: int | None = self.record.get("context_length") if self.record else None
        self.restarts: list[Restart] = []

    def restart(self, context: int, why: str, rung: int) -> Restart:
        """Serve at ``context`` now; a failed restart (engine not ready, a refused option) is ``ok=False``."""
        from gauntlet.steps.gates import deploy

        rs = Restart(rung, self.context, context, why, evidence=str(self.out / f"restart-{context}"))
        self.restarts.append(rs)
        t0 = time.monotonic()
        try:
            dopts = deploy.Options(profile=self.opts.the_profile, engine=self.engine, backend=self.opts.backend,
                                   run_id=self.opts.run_id, context_length=context, run_dir=str(self.run_dir),
                                   nccl_env=self.opts.nccl_env)
            rs.args_hash = args_hash(self.engine, dopts.engine_spec())
            checks, metrics = self.backend.restart(dopts, Path(rs.evidence))
        except TransientError:
            raise
        except (GauntletError, OSError) as exc:
            rs.seconds = round(time.monotonic() - t0, 1)
            rs.detail = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
            return rs
        rs.seconds = round(time.monotonic() - t0, 1)
        rs.startup_s = metrics.get("startup_s")
        rs.argv = list(metrics.get("command") or (metrics.get("argv_per_rank") or [[]])[0])
        bad = [c for c in checks if c.status in ("fail", "error")]
        rs.ok = not bad and bool((metrics.get("outputs") or {}).get("endpoint"))
        rs.detail = ("; ".join(f"{c.name}: {c.detail}" for c in bad)[:400] if bad else
                     "no endpoint after the restart" if not rs.ok else
                     f"ready at context {context} after {rs.seconds:.1f}s (start-up {rs.startup_s}s)")
        if rs.ok:
            self.context = context
            rs.kv_pool = kv_pool_capped(self.engine, Path(rs.evidence))
        return rs
