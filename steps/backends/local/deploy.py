"""Gate 2, local back end: start the engine detached, prove it ready, stop it by its recorded group.

The engine must outlive ``gauntlet step deploy``: later gates are separate
processes that talk to it. So deploy starts it in its own session
(:class:`gauntlet.steps.engines.local_vllm.LocalEngine`), records it in a state file
``<run-dir>/.engines/<engine>.json`` (pid, pgid, port, log) and labels its
environment with ``GAUNTLET_ENGINE_DIR=<run-dir>``, the local counterpart of the
cluster's ``gauntlet.dev/run`` label: teardown and :func:`stop_all` only kill
a process group that carries the label of the run they were given, and find
it from the label even when a killed deploy never wrote its state file.

``<run-dir>`` is ``--run-dir`` when given, else the parent of ``--out`` (the
engine sequence's directory, shared by its deploy and teardown tasks). A
deploy that finds an engine of the same sequence on its port replaces it
(a retry, or a Gate 6 variant restarting the engine); any other listener on
the port fails the gate.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gauntlet.params.models import Profile
from gauntlet.steps.engines.local_vllm import (EngineDied, EngineError, EngineTimeout, LocalEngine, group_members, kill_group,
                                 log_tail, port_open, sigterm_as_interrupt)
from gauntlet.contract import Check, UsageError, now_iso, write_json_atomic
from gauntlet.contract.layout import RunLayout
from gauntlet.steps.engines import engine as engine_of
from gauntlet.steps.engines.commands import context_of, engine_command, engine_env

if TYPE_CHECKING:
    from gauntlet.steps.backends.protocol import EngineRequest, StopRequest

__all__ = ["deploy", "teardown", "cleanup", "stop_all", "run_dir_of", "state_path", "find_labelled", "LABEL_DIR",
           "LABEL_PORT", "owned", "deployed", "restart"]

LABEL_DIR = "GAUNTLET_ENGINE_DIR"
LABEL_PORT = "GAUNTLET_ENGINE_PORT"
LABEL_VARIANT = "GAUNTLET_ENGINE_VARIANT"     # a Gate 6 variant's name; absent on the baseline
HOST = "127.0.0.1"
GRACE_S = 15.0


def run_dir_of(out: Path, given: str | Path | None = None) -> Path:
    """The run directory: ``given``, else the parent of the gate's ``--out`` (the engine sequence's directory)."""
    return Path(given).resolve() if given else RunLayout.dag_dir(out)


def state_path(run_dir: Path, engine: str) -> Path:
    return run_dir / ".engines" / f"{engine}.json"


def _model_path(profile: Profile) -> Path:
    p = profile.model_dir()
    return p if p.is_absolute() else (Path.cwd() / p).resolve()


# ------------------------------------------------------------------ labels: which groups belong to a run

def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(kv.split("=", 1) for kv in raw.decode("utf-8", "replace").split("\0") if "=" in kv)


def find_labelled(under: Path) -> dict[int, dict[str, str]]:
    """{pgid: labels} of live engine process groups whose run dir is ``under`` or inside it."""
    under = Path(under).resolve()
    found: dict[int, dict[str, str]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        env = _environ(pid)
        d = env.get(LABEL_DIR)
        if d is None or not (Path(d) == under or under in Path(d).parents):
            continue
        try:
            pgid = os.getpgid(pid)
        except ProcessLookupError:
            continue
        if pgid not in found and group_members(pgid):
            found[pgid] = {"dir": d, "port": env.get(LABEL_PORT, ""), "variant": env.get(LABEL_VARIANT, "")}
    return found


def owned(pgid: int, run_dir: Path) -> bool:
    """A recorded pgid is killed only if a member still carries this run's label (pids get reused)."""
    return any(_environ(pid).get(LABEL_DIR) == str(run_dir) for pid in group_members(pgid))


# ------------------------------------------------------------------ deploy

def deploy(opts: EngineRequest, out: Path) -> tuple[list[Check], dict[str, Any]]:
    profile = opts.the_profile
    spec, variant = opts.engine_spec(), opts.variant or None
    run_dir = run_dir_of(out, opts.run_dir)
    model = _model_path(profile)
    argv = engine_command(opts.engine, spec, model_path=str(model), served_name=profile.model.served_name,
                          python=sys.executable, host=HOST)
    env = {**engine_env(opts.engine, spec), LABEL_DIR: str(run_dir), LABEL_PORT: str(spec.port),
           **({LABEL_VARIANT: variant} if variant else {})}
    log = Path(out).resolve() / "engine.log"
    secrets = spec.secret_env     # locally: the runner's own variables of those names, inherited, never recorded
    metrics: dict[str, Any] = {
        "engine": opts.engine, "variant": variant, "backend": "local", "command": argv,
        "command_line": shlex.join(argv), "env": {**env, **{k: f"{ref} (the runner's ${k})" for k, ref in secrets.items()}},
        "env_note": "added to the deploying process's environment; a Secret's value is the runner's variable of "
                    "that name, inherited and not recorded",
        "engine_args": spec.args.model_dump(), "port": spec.port, "model_path": str(model), "log": str(log),
        "run_dir": str(run_dir), "startup_timeout_s": spec.startup_timeout_s,
    }
    missing = sorted(k for k in secrets if not os.environ.get(k))
    if missing:
        return [Check("secret-env", "fail", "the runner's environment holds " + ", ".join(missing), None,
                      "; ".join(f"engines.{opts.engine}.env.{k} reads {secrets[k]} on a cluster; locally export "
                                f"{k} in the environment gauntlet runs in" for k in missing))], metrics
    checks: list[Check] = []
    if not (model / "config.json").is_file():
        hint = (f"`{shlex.join(['gauntlet', 'model', 'prepare', profile.model.prepare])}`" if profile.model.prepare
                else "prepare the model")
        return [Check("model-dir", "fail", str(model), None, f"no model at {model}: run {hint} first")], metrics
    checks.append(Check("model-dir", "pass", str(model), str(model), "model directory present"))
    local_weights = engine_of(opts.engine).local_weights
    if local_weights:      # an engine that reads another format (llama.cpp: GGUF) converts the same weights
        weights, facts = local_weights(model, spec, profile.marker_name)
        metrics.update(facts)
        if weights.status == "fail":
            return checks + [weights], metrics
        checks.append(weights)

    replaced = _replace_sequence_engines(run_dir, spec.port)
    if replaced:
        checks.append(Check("replaced-engine", "pass", None, replaced,
                            f"stopped this sequence's earlier engine on port {spec.port} (pids {replaced})"))
    if port_open(HOST, spec.port):
        checks.append(Check("port-free", "fail", f"{HOST}:{spec.port} free", "in use",
                            f"port {spec.port} is held by a process this run did not start; stop it or change "
                            f"engines.{opts.engine}.port"))
        return checks, metrics

    engine = LocalEngine(argv, port=spec.port, served_name=profile.model.served_name, log_path=log, env=env,
                         host=HOST, startup_timeout_s=spec.startup_timeout_s, grace_s=GRACE_S)
    state = state_path(run_dir, opts.engine)
    with sigterm_as_interrupt():
        try:
            engine.start()
            _write_state(state, engine, opts.engine, variant, started=now_iso())
            startup = engine.wait_ready()
        except EngineError as exc:
            engine.stop()
            state.unlink(missing_ok=True)
            metrics.update(_sizes(engine), log_tail=log_tail(log, 40))
            return checks + [_failure(exc, engine)], metrics
        except BaseException:           # Ctrl-C / SIGTERM: nothing may outlive the interrupted gate
            engine.stop()
            state.unlink(missing_ok=True)
            raise
    telemetry, why = _start_telemetry(profile, engine, Path(out).resolve())
    _write_state(state, engine, opts.engine, variant, started=None, ready=now_iso(), telemetry=telemetry)
    metrics.update(_sizes(engine), pid=engine.pid, pgid=engine.pgid, state_file=str(state),
                   outputs={"endpoint": engine.base_url}, telemetry=telemetry)
    checks.append(Check("telemetry", "pass" if telemetry else "skip", "a sampler beside the engine",
                        telemetry, f"sampling this machine at {telemetry} until pid {engine.pid} exits"
                        if telemetry else f"no per-rank telemetry: {why}"))
    checks.append(Check("engine-ready", "pass", f"/health 200 and /v1/models lists {profile.model.served_name!r} "
                        f"within {spec.startup_timeout_s}s", round(startup, 1),
                        f"ready in {startup:.1f}s at {engine.base_url} (pid {engine.pid}, "
                        f"peak RSS {engine.peak_rss_bytes / 2**30:.2f} GiB)"))
    return checks, metrics


def _start_telemetry(profile: Profile, engine: LocalEngine, out: Path) -> tuple[str | None, str]:
    """The rank sampler (steps/cluster/telemetry.py) beside the local engine: its own session, no run label (the rank
    watch and teardown judge the engine's group alone), exiting by itself once the engine's pid is gone.
    Returns its URL, or None and why."""
    import subprocess

    import httpx

    from gauntlet.steps.engines.local_vllm import free_port
    port = free_port()
    argv = [sys.executable, "-m", "gauntlet.steps.cluster.telemetry", "serve", "--host", HOST, "--port", str(port),
            "--interval", str(profile.hardware.telemetry.interval_s), "--exit-with", str(engine.pid)]
    try:
        with open(out / "telemetry.log", "ab") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
    except OSError as exc:
        return None, f"the sampler did not start: {exc}"
    url = f"http://{HOST}:{port}"
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return None, f"the sampler exited with {proc.returncode} (log: {out / 'telemetry.log'})"
        try:
            if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                return url, ""
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    proc.wait(5)
    return None, f"the sampler did not answer at {url} within 15 s (log: {out / 'telemetry.log'})"


def _sizes(engine: LocalEngine) -> dict[str, Any]:
    return {"startup_s": None if engine.startup_s is None else round(engine.startup_s, 2),
            "peak_rss_bytes": engine.peak_rss_bytes}


def _failure(exc: EngineError, engine: LocalEngine) -> Check:
    last = next((ln for ln in reversed(getattr(exc, "tail", "").splitlines()) if ln.strip()), "")
    if isinstance(exc, EngineDied):
        return Check("engine-ready", "fail", "engine stays up until ready", f"exit code {exc.returncode}",
                     f"engine exited with code {exc.returncode} after {exc.startup_s:.1f}s: {last[-300:]} "
                     f"(full log: {engine.log_path}); process group stopped")
    if isinstance(exc, EngineTimeout):
        return Check("engine-ready", "fail", f"ready within {exc.timeout_s:.0f}s", exc.last_error,
                     f"not ready within {exc.timeout_s:.0f}s (last probe: {exc.last_error}); log: {engine.log_path}; "
                     "process group stopped")
    return Check("engine-ready", "fail", "engine starts", None, str(exc).splitlines()[0])


def _write_state(path: Path, engine: LocalEngine, name: str, variant: str | None, **extra: Any) -> None:
    old = json.loads(path.read_text()) if path.exists() and extra.get("started") is None else {}
    data = {**old, "engine": name, "variant": variant, "pid": engine.pid, "pgid": engine.pgid, "port": engine.port,
            "endpoint": engine.base_url, "log": str(engine.log_path), "command": engine.argv,
            **{k: v for k, v in extra.items() if v is not None}}
    if engine.startup_s is not None:
        data["startup_s"] = round(engine.startup_s, 2)
    write_json_atomic(path, data)


def _replace_sequence_engines(run_dir: Path, port: int) -> list[int]:
    """Stop live engines on ``port`` started for this sequence (its dir or an enclosing one)."""
    stopped: list[int] = []
    for pgid, lab in find_labelled(Path("/")).items():
        d = Path(lab["dir"])
        if lab["port"] == str(port) and (d == run_dir or d in run_dir.parents):
            stopped += kill_group(pgid, GRACE_S)
    if stopped:
        deadline = time.monotonic() + 10
        while port_open(HOST, port) and time.monotonic() < deadline:
            time.sleep(0.2)
    return stopped


def deployed(run_dir: Path, engine: str) -> dict[str, Any] | None:
    """The running deployment of ``engine`` in this sequence, as its state file records it (argv, served
    context, pid, start-up), or None: no record, stopped, or its process group gone."""
    state = state_path(Path(run_dir).resolve(), engine)
    try:
        rec = json.loads(state.read_text())
    except (OSError, ValueError):
        return None
    pgid = rec.get("pgid")
    if rec.get("stopped") or not isinstance(pgid, int) or not group_members(pgid):
        return None
    argv = [str(a) for a in rec.get("command") or []]
    return {"record": str(state), "argv": argv, "context_length": context_of(engine, argv),
            "endpoint": rec.get("endpoint"), "pid": rec.get("pid"), "startup_s": rec.get("startup_s")}


def restart(opts: EngineRequest, out: Path) -> tuple[list[Check], dict[str, Any]]:
    """Restart this sequence's engine with ``opts`` (Gate 5: another context): :func:`deploy` stops the
    sequence's engine on the port first (by its label), then starts and proves the new one on the same port."""
    return deploy(opts, out)


# ------------------------------------------------------------------ teardown / stop_all

def teardown(opts: StopRequest, out: Path) -> tuple[list[Check], dict[str, Any]]:
    run_dir = run_dir_of(out)
    state = state_path(run_dir, opts.engine)
    record = json.loads(state.read_text()) if state.is_file() else None
    metrics: dict[str, Any] = {"engine": opts.engine, "backend": "local", "run_dir": str(run_dir),
                               "state": record}
    # the baseline's teardown never stops a variant, a variant's never the baseline
    targets = {pgid: lab for pgid, lab in find_labelled(run_dir).items()
               if lab["dir"] == str(run_dir) and lab["variant"] == (opts.variant or "")}
    if record and (record.get("variant") or None) != (opts.variant or None):
        record = None
    if record and group_members(record["pgid"]) and owned(record["pgid"], run_dir):
        targets.setdefault(record["pgid"], {"port": str(record["port"])})
    stopped: list[int] = []
    for pgid in targets:
        stopped += kill_group(pgid, GRACE_S)
    left = {pgid: group_members(pgid) for pgid in targets if group_members(pgid)}
    metrics["stopped_pids"] = stopped
    if record:
        _snapshot_log(Path(record["log"]), Path(out))
        record["stopped"] = now_iso()
        write_json_atomic(state, record)
    if left:
        return [Check("engine-stopped", "fail", "no process of the engine's group left", left,
                      f"still running after SIGKILL: {left}")], metrics
    what = (f"stopped process group(s) {sorted(targets)} ({len(stopped)} processes)" if targets
            else "no engine of this run was running" + (" (it had already exited)" if record else ""))
    checks = [Check("engine-stopped", "pass", "no process of the engine's group left", [], what)]
    port = int(record["port"]) if record else None
    if port is not None:
        deadline = time.monotonic() + 10
        while port_open(HOST, port) and time.monotonic() < deadline:
            time.sleep(0.2)
        busy = port_open(HOST, port)
        checks.append(Check("port-released", "fail" if busy else "pass", "closed", "open" if busy else "closed",
                            f"port {port} " + ("still accepts connections" if busy else "released")))
    return checks, metrics


def _snapshot_log(log: Path, out: Path) -> None:
    if log.is_file() and log.parent.resolve() != out.resolve():
        out.mkdir(parents=True, exist_ok=True)
        (out / "engine.log").write_bytes(log.read_bytes())


def stop_all(run_dir: Path) -> list[dict[str, Any]]:
    """Stop every engine process group of the run under ``run_dir``; return what was stopped.

    The exit handler's guarantee: state files and labels both lead here, so an engine
    whose deploy was killed before recording it is found too.
    """
    run_dir = Path(run_dir).resolve()
    if run_dir == Path(run_dir.anchor):
        raise UsageError(f"stop_all: {run_dir} is a filesystem root, not a run directory")
    targets: dict[int, dict[str, Any]] = {}
    for pgid, lab in find_labelled(run_dir).items():
        targets[pgid] = {"pgid": pgid, "dir": lab["dir"], "port": lab["port"]}
    for state in sorted(run_dir.rglob(".engines/*.json")):
        try:
            rec = json.loads(state.read_text())
            pgid = int(rec["pgid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if pgid not in targets and group_members(pgid) and owned(pgid, state.parent.parent):
            targets[pgid] = {"pgid": pgid, "dir": str(state.parent.parent), "port": str(rec.get("port", ""))}
    stopped = []
    for pgid, info in targets.items():
        pids = kill_group(pgid, GRACE_S)
        stopped.append({**info, "pids": pids})
    return stopped


# ------------------------------------------------------------------ cleanup: the exit handler's release

def cleanup(run_dir: Path) -> tuple[list[Check], dict[str, Any]]:
    """Stop every engine of the run under ``run_dir`` and confirm none is left; never raises."""
    run_dir = Path(run_dir).resolve()
    t0 = time.monotonic()
    errors: list[str] = []
    stopped: list[dict[str, Any]] = []
    try:
        stopped = stop_all(run_dir)
    except Exception as exc:  # noqa: BLE001 - recorded; what is left is judged below
        errors.append(f"stop_all({run_dir}): {type(exc).__name__}: {exc}")
    try:
        left = sorted(find_labelled(run_dir)) if run_dir != Path(run_dir.anchor) else []
    except OSError as exc:
        errors.append(f"listing labelled processes: {exc}")
        left = []
    metrics = {"backend": "local", "run_dir": str(run_dir), "stopped": stopped,
               "held": [f"pgid {p}" for p in left], "transient": False,
               "seconds": round(time.monotonic() - t0, 2)}
    what = (", ".join(f"pgid {s['pgid']} (port {s['port']}, {len(s['pids'])} processes) -> 0 running"
                      for s in stopped) or "no engine of this run was still running")
    checks = [Check("engines-stopped", "pass" if not left else "fail", "no engine process of the run left",
                    left, f"stopped: {what}" if not left else f"still running after SIGKILL: process groups {left}")]
    checks += [Check("release-error", "fail", "no error while releasing", e, e) for e in errors]
    return checks, metrics
