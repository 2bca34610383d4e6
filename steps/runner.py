"""Run one step under the evidence contract: verdict.json, exit code, no traceback."""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gauntlet.contract import (EXIT_INTERRUPTED, EXIT_TRANSIENT, EXIT_USAGE, Check, GauntletError, UsageError,
                               Verdict, exit_code_for, exit_code_of, now_iso)
from gauntlet.contract.layout import output_path
from gauntlet.params import load_profile
from gauntlet.steps import needs_of
from gauntlet.steps.options import options_from
from gauntlet.steps.window import WindowSpent, armed, window_check, window_of

if TYPE_CHECKING:
    from gauntlet.params.models import Profile
    from gauntlet.steps.cluster.rank_watch import Rank

__all__ = ["run_step", "write_outputs"]


def run_step(module, args: argparse.Namespace) -> int:
    """Execute ``module.run`` and turn its outcome into a verdict and an exit code."""
    out = Path(args.out)
    started = now_iso()
    gate = module.NAME
    window = window_of() if needs_of(module).windowed else None
    t0 = time.time()
    try:
        with armed(window):
            checks, metrics = _judge(module, args, out)
    except WindowSpent:
        assert window is not None
        check = window_check(gate, window, t0)
        _write_verdict(out, Verdict.of(gate, started, [check], {"window": {
            "ends": window.end_iso(), "reserve_s": window.reserve_s, "ran_s": round(time.time() - t0, 1)}},
            status="fail"))
        print(f"{gate}: {check.detail}", file=sys.stderr)
        return exit_code_for("fail")
    except GauntletError as exc:
        code = exit_code_of(exc)
        if code != EXIT_USAGE:      # bad input writes nothing; anything else leaves an error verdict
            _write_error(out, gate, started, "transient" if code == EXIT_TRANSIENT else "error",
                         f"{type(exc).__name__}: {exc}")
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return code
    except KeyboardInterrupt:
        _write_error(out, gate, started, "interrupted", "interrupted (SIGINT); resources were released")
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # a bug or an unexpected environment: one line, full trace beside the verdict
        line = f"{type(exc).__name__}: {exc}".splitlines()[0]
        _write_error(out, gate, started, "unexpected", line)
        try:
            (out / "traceback.txt").write_text(traceback.format_exc())
        except OSError:
            pass
        print(f"{gate}: {line} (traceback in {out / 'traceback.txt'})", file=sys.stderr)
        return 1
    verdict = Verdict.of(gate, started, checks, metrics)
    verdict.write(out)
    write_outputs(out, verdict)
    _print_summary(verdict)
    # a step whose exit code means something other than its verdict (cleanup: "still held?") says so
    judge = getattr(module, "exit_code", None)
    return judge(verdict) if judge is not None else exit_code_for(verdict.status)


def _judge(module, args: argparse.Namespace, out: Path) -> tuple[list[Check], dict[str, Any]]:
    """The gate's checks and metrics: its options, the engine it judges present and its ranks watched."""
    gate = module.NAME
    profile = None
    if needs_of(module).profile:
        if not args.profile:
            raise UsageError(f"step {gate}: --profile is required")
        profile = load_profile(args.profile)
    opts = options_from(module.Options, args, profile)    # built and validated once, before anything runs
    out.mkdir(parents=True, exist_ok=True)
    # the profile whose engine's ranks this gate watches (None: not watched)
    watched = profile if needs_of(module).engine_ranks and getattr(opts, "engine", None) else None
    present, redeploy = _engine_present(gate, watched, opts, out) if watched is not None else (None, {})
    if present is not None and present.status != "pass":    # never judge an engine that is absent
        return [present], redeploy
    before = _ranks(watched, opts.engine, out) if watched is not None else None
    checks, metrics = module.run(opts, out)
    if watched is not None:
        checks = [*([present] if present else []), *checks,
                  _rank_check(gate, before, watched, opts.engine, out, metrics)]
        metrics = {**redeploy, **metrics}
    return checks, metrics


def _write_verdict(out: Path, verdict: Verdict) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
        verdict.write(out)
        write_outputs(out, verdict)
    except OSError:
        pass


def _engine_present(gate: str, profile: Profile, opts: Any, out: Path) -> tuple[Check | None, dict[str, Any]]:
    """The engine the gate judges is deployed, or redeployed after the exit handler released it (steps/gates/engine_present.py)."""
    from gauntlet.steps.gates.engine_present import ensure
    return ensure(gate, profile, opts, out)


def _ranks(profile: Profile, engine: str, out: Path) -> list[Rank] | str | None:
    """The deployed engine's ranks through the profile's back end; a one-line reason when they cannot be read."""
    from gauntlet.steps.gates.watch_ranks import snapshot
    return snapshot(profile, engine, out)


def _rank_check(gate: str, before: list[Rank] | str | None, profile: Profile, engine: str, out: Path,
                metrics: dict[str, Any]) -> Check:
    """The ``engine_ranks`` check: did every rank stay up, unrestarted, from the gate's start to its end?"""
    from gauntlet.steps.gates.watch_ranks import check
    return check(gate, before, _ranks(profile, engine, out), redeployed=bool(metrics.get("engine_restarts")))


def write_outputs(out: Path, verdict: Verdict) -> None:
    """Plain-text output parameters: ``outputs/verdict`` plus ``metrics["outputs"]``.

    Argo reads them with ``valueFrom.path``; the local runner reads the same files.
    """
    values = {"verdict": verdict.status, **{str(k): v for k, v in verdict.metrics.get("outputs", {}).items()}}
    for k, v in values.items():
        text = ("true" if v else "false") if isinstance(v, bool) else str(v)
        path = Path(output_path(out, k))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _write_error(out: Path, gate: str, started: str, name: str, detail: str) -> None:
    _write_verdict(out, Verdict.of(gate, started, [Check(name, "error", None, None, detail)], status="error"))


def _print_summary(v: Verdict) -> None:
    width = max((len(c.name) for c in v.checks), default=10)
    for c in v.checks:
        print(f"  {c.status:5} {c.name:<{width}}  {c.detail}")
    print(f"{v.gate}: {v.status.upper()}")
