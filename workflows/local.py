"""The local back end: walk the gate graph and run each gate as a `gauntlet step` subprocess.

The graph built for this back end (:func:`gauntlet.workflows.graph.build_graph` with ``"local"``;
the box replays the ``"argo"`` one), the same commands as the Argo containers, the same conditions
evaluated from the graph's structures (:meth:`~gauntlet.workflows.graph.Need.met`,
:meth:`~gauntlet.workflows.graph.When.holds`), the same exit handler. A task's phase follows Argo:
``Omitted`` when a need is not met, ``Skipped`` when its when is false, ``Failed`` when the step exits
non-zero, else ``Succeeded``; an engine sequence (a DAG call) fails when one of
its tasks fails. The exit handler always runs, also on Ctrl-C, and then
:meth:`gauntlet.steps.backends.protocol.RunnerGuard.stop_all` guarantees no engine outlives the run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, UTC
from pathlib import Path
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from gauntlet.params import Profile
from gauntlet.steps import STEPS, needs_of
from gauntlet.steps.engines import engine as engine_of
from gauntlet.contract import EXIT_TRANSIENT, CorruptVerdict, UsageError, Verdict, now_iso, write_json_atomic
from gauntlet.contract.layout import RunLayout, output_path, verdict_path
from gauntlet.workflows import refs
from gauntlet.workflows.graph import (ALL_PARAMETERS, DEFAULT_TIMEOUT_S, ENGINE_SEQUENCE, ConditionError, Dag, Graph,
                                      RetryPolicy, Run, Task, build_graph, dag_engine, output_default, retry_policy)
from gauntlet.workflows.phase import dag_phase

if TYPE_CHECKING:
    from gauntlet.workflows.plan import Plan

__all__ = ["run_local", "Runner", "TaskResult", "write_summary"]

HEARTBEAT_S = 30.0
INTERRUPT_GRACE_S = 60.0              # a step gets this long to release what it holds after SIGINT
BUILD_WAIT_S = 3600.0                 # the longest a deferred check waits for its engine's background build
BUILD_POLL_S = 2.0


@dataclass
class TaskResult:
    path: str                       # e.g. "preflight" or "vllm/deploy"
    name: str
    gate: str
    step: str | None
    phase: str                      # Succeeded | Failed | Skipped | Omitted
    reason: str = ""
    exit_code: int | None = None
    verdict: str | None = None
    duration_s: float = 0.0
    out: str | None = None
    command: list[str] = field(default_factory=list)
    failed_checks: list[dict[str, Any]] = field(default_factory=list)
    skipped_checks: list[dict[str, Any]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    attempts: list[int] = field(default_factory=list)   # exit code of each attempt (Argo retries exit 75)
    retried: bool = False                               # it has a retry policy: Argo gives it a Retry node


class Interrupted(Exception):
    pass


class Runner:
    """One local run of a graph. ``python`` and ``cli`` are overridable so tests can drive fake steps."""

    def __init__(self, graph: Graph, profile_file: Path, run_dir: Path, parameters: dict[str, str], *,
                 python: str = sys.executable, cli: str = "gauntlet.workflows.cli", steps: dict[str, str] | None = None,
                 gates: set[str] | None = None, stream: TextIO = sys.stdout, cwd: Path | None = None,
                 env: dict[str, str] | None = None):
        self.graph, self.profile_file, self.run_dir = graph, profile_file, run_dir
        self.layout = RunLayout(run_dir)
        self.params = parameters
        self.python, self.cli, self.steps, self.gates, self.stream = python, cli, steps or STEPS, gates, stream
        self.cwd, self.env = cwd, {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.results: list[TaskResult] = []
        self.t0 = time.monotonic()
        self.in_steps_s = 0.0
        self.interrupted = False
        self.plan_ends: dict[str, float] = {}       # task path -> when the plan has it end (s from the start)
        self.plan_total_s = 0.0
        self.moved: set[str] = set()                # task paths run later than the plan has them (deferred)
        self.build_wait_s = 0.0                     # spent waiting for an engine's background build

    # ----------------------------------------------------------- output

    def say(self, text: str) -> None:
        el = time.monotonic() - self.t0
        print(f"[{int(el) // 60:02d}:{int(el) % 60:02d}] {text}", file=self.stream, flush=True)

    def follow_plan(self, ends: dict[str, float], total_s: float) -> None:
        """Say after each task how much of the run the plan has left (``gauntlet plan``'s rows)."""
        self.plan_ends, self.plan_total_s = dict(ends), total_s

    def _progress(self, path: str) -> str:
        """`` | plan: ~N left of ~T, M behind/ahead`` after ``path`` (nothing for a task the plan lacks)."""
        end = self.plan_ends.get(path)
        if end is None or path in self.moved:       # a deferred check ran away from its place in the plan
            return ""
        el = time.monotonic() - self.t0
        drift = el - end
        return (f" | plan: ~{_mins(max(self.plan_total_s - end, 0))} left of ~{_mins(self.plan_total_s)}, "
                f"{_mins(abs(drift))} {'behind' if drift > 0 else 'ahead'}")

    # ----------------------------------------------------------- references

    def _lookup(self, scope: dict[str, Any]) -> Callable[[refs.Ref], str | None]:
        def get(ref: refs.Ref) -> str | None:
            if ref == ALL_PARAMETERS:       # as Argo's {{workflow.parameters.json}}: every one given
                return json.dumps([{"name": k, "value": v} for k, v in self.params.items()])
            if ref.kind == "parameter":
                return self.params.get(ref.name)
            if ref.kind in ("workflow", "input"):
                values: dict[str, str] = scope["workflow" if ref.kind == "workflow" else "inputs"]
                return values.get(ref.name)
            if ref.kind == "status":        # as Argo's {{tasks.X.status}}: the phase an earlier task ended in
                phases: dict[str, str] = scope.get("phases", {})
                return phases.get(ref.task)
            out = scope["outs"].get(ref.task)
            if out is None:
                return None
            f = output_path(Path(out), ref.name)
            return f.read_text().strip() if f.is_file() else output_default(ref.name)
        return get

    # ----------------------------------------------------------- the walk

    def run(self) -> str:
        """Walk the main DAG, then the exit handler. Returns the workflow status."""
        try:
            with _sigterm_as_interrupt():
                phase = self._walk(self.graph.main, engine=None, inputs={})
        except (KeyboardInterrupt, Interrupted):
            self.interrupted = True
            self.say("interrupted: stopping; the exit handler still runs")
            self._mark_unreached(self.graph.main, None)
        # Argo: a stopped workflow fails; otherwise the main DAG's phase, judged by its leaves
        status = "Failed" if self.interrupted else phase
        self._exit_handler(status)
        return status

    def _walk(self, dag: Dag, engine: str | None, inputs: dict[str, str]) -> str:
        """Run ``dag``'s tasks; ``engine``: the engine directory its tasks write under (None: the run's root)."""
        phases: dict[str, str] = {}
        outs: dict[str, str] = {}
        pending = list(dag.tasks)
        deferred: list[Task] = []          # Gate 0 checks of an engine still being built: run when first needed
        while pending or deferred:
            needed = [d for d in deferred if not pending or d.name in pending[0].upstream]
            if needed:                     # the next task needs it (or nothing else is left): wait for its build
                task = needed[0]
                deferred.remove(task)
                self.moved.add(self.layout.task_path(task.name, engine))
                self._await_build(task)
            else:
                task = pending.pop(0)
                if why := self._being_built(task):
                    self.say(f"{task.gate} {task.name}: deferred until a task needs it ({why})")
                    deferred.append(task)
                    continue
            scope = {"inputs": inputs, "outs": outs, "phases": phases, "workflow": self._workflow_vars()}
            res = self._decide(task, engine, phases, scope)
            if res is None:                              # it runs
                if task.dag:
                    sub = self.graph.dag(task.dag)
                    sub_inputs = {k: refs.substitute(v, self._lookup(scope)) for k, v in task.inputs.items()}
                    self.say(f"{task.gate} {task.name}: start ({', '.join(f'{k}={v}' for k, v in sub_inputs.items())})")
                    t = time.monotonic()
                    phase = self._walk(sub, engine=dag_engine(sub.name, sub_inputs), inputs=sub_inputs)
                    res = TaskResult(self.layout.task_path(task.name, engine), task.name, task.gate, None, phase,
                                     duration_s=round(time.monotonic() - t, 2),
                                     reason="" if phase == "Succeeded" else "a task of the sequence failed")
                    self.results.append(res)
                    self.say(f"{task.gate} {task.name}: {phase.upper()} ({res.duration_s:.1f}s)")
                else:
                    res = self._run_task(task, engine, scope)
            phases[task.name] = res.phase
            if res.out:
                outs[task.name] = res.out
            if self.interrupted:
                raise Interrupted()
        # Argo judges a DAG by its leaf tasks, not by whether any task failed (workflows/phase.py)
        return dag_phase({t.name: t.upstream for t in dag.tasks}, phases)

    def _being_built(self, task: Task) -> str | None:
        """Why ``task`` should wait: it is an engine's Gate 0 check and that engine's program is still being built
        in the background on this machine (:attr:`gauntlet.steps.engines.Engine.building`); else None."""
        if task.step != "engine-check" or "--engine" not in task.args:
            return None
        name = task.args[task.args.index("--engine") + 1]
        try:
            eng = engine_of(name)
        except UsageError:
            return None
        return eng.building(self.python) if eng.building else None

    def _await_build(self, task: Task) -> None:
        """Wait for the background build ``task`` was deferred for (a line a minute), at most BUILD_WAIT_S; the
        check then runs and judges what the build left (a failed build: no program, which the check names)."""
        t0 = time.monotonic()
        said = t0
        while (why := self._being_built(task)) and time.monotonic() - t0 < BUILD_WAIT_S:
            if time.monotonic() - said >= 60:
                self.say(f"{task.gate} {task.name}: waiting {time.monotonic() - t0:.0f}s so far: {why}")
                said = time.monotonic()
            time.sleep(BUILD_POLL_S)
        waited = time.monotonic() - t0
        self.build_wait_s += waited
        if waited >= 1:
            self.say(f"{task.gate} {task.name}: waited {waited:.0f}s for the background build"
                     + (f"; still building after {BUILD_WAIT_S:.0f}s, the check runs now" if why else ""))

    def _mark_unreached(self, dag: Dag, engine: str | None) -> None:
        """After an interrupt: every task the walk never reached shows as Omitted, with why."""
        done = {r.path for r in self.results}
        for t in dag.tasks:
            if t.dag:
                sub = self.graph.dag(t.dag)
                sub_engine = dag_engine(sub.name, t.inputs)
                if any(self.layout.task_path(s.name, sub_engine) in done for s in sub.tasks):
                    self._mark_unreached(sub, sub_engine)
            path = self.layout.task_path(t.name, engine)
            if path not in done:
                self.results.append(TaskResult(path, t.name, t.gate, t.step, "Omitted",
                                               "not reached: the run was interrupted"))

    def _decide(self, task: Task, engine: str | None, phases: dict[str, str],
                scope: dict[str, Any]) -> TaskResult | None:
        """A result for a task that does not run (Skipped/Omitted), or None when it runs."""
        path = self.layout.task_path(task.name, engine)

        def skip(phase: str, reason: str) -> TaskResult:
            r = TaskResult(path, task.name, task.gate, task.step, phase, reason)
            self.results.append(r)
            self.say(f"{task.gate} {path}: {phase.lower()} ({reason})")
            return r

        unmet = [n for n in task.depends if not n.met(phases)]
        if unmet:
            return skip("Omitted", "depends not met: " + ", ".join(f"{n.task} is {phases[n.task]}, needs "
                                                                  f"{' or '.join(n.phases)}" for n in unmet))
        if task.when is not None:
            value = self._lookup(scope)(task.when.subject)
            try:
                if value is None:
                    raise ConditionError(f"{task.when.subject} has no value here")
                if not task.when.holds(value):
                    return skip("Skipped", f"when false: {task.when} (is {value!r})")
            except ConditionError as exc:
                return skip("Failed", f"graph condition error: {exc}")
        if self.gates is not None and task.step and not {task.name, task.step, task.gate} & self.gates:
            return skip("Skipped", "not selected by --gates")
        return None

    def _workflow_vars(self) -> dict[str, str]:
        return {"uid": self.run_dir.name, "name": f"gauntlet-local-{self.run_dir.name}"}

    def _command(self, task: Task, out: Path, scope: dict[str, Any]) -> list[str]:
        args = [refs.substitute(a, self._lookup(scope)) for a in task.args]
        return [self.python, "-m", self.cli, "step", task.step_name(), "--profile", str(self.profile_file),
                "--out", str(out), *args]

    def _run_task(self, task: Task, engine: str | None, scope: dict[str, Any]) -> TaskResult:
        path = self.layout.task_path(task.name, engine)
        out = Path(self.layout.task_dir(task.name, engine))
        res = TaskResult(path, task.name, task.gate, task.step, "Failed", out=str(out))
        self.results.append(res)
        try:
            res.command = self._command(task, out, scope)
        except refs.RefError as exc:
            res.reason = f"graph reference error: {exc}"
            self.say(f"{task.gate} {path}: FAILED ({res.reason})")
            return res
        module = self.steps.get(task.step or "")
        if module is None or importlib.util.find_spec(module) is None:
            res.reason = (f"step {task.step!r} is not available (module {module or '?'} is missing): "
                          "the gate cannot run")
            self.say(f"{task.gate} {path}: FAILED ({res.reason})")
            return res
        self.say(f"{task.gate} {path}: running `gauntlet step {task.step}`")
        out.mkdir(parents=True, exist_ok=True)
        t = time.monotonic()
        try:
            # Argo's retryStrategy, as rendered (graph.retry_policy): only exit 75 is retried, after a backoff
            policy = retry_policy(task, needs_of(importlib.import_module(module)))
            res.retried = policy is not None
            limit = policy.limit if policy is not None else 0
            for attempt in range(limit + 1):
                log = out / ("step.log" if attempt == 0 else f"step.{attempt}.log")
                res.exit_code = self._spawn(res.command, log, task.timeout_s or DEFAULT_TIMEOUT_S, path)
                res.attempts.append(res.exit_code)
                if res.exit_code != EXIT_TRANSIENT or policy is None or attempt == limit:
                    break
                wait = self._backoff_s(attempt, policy)
                self.say(f"{task.gate} {path}: exit {EXIT_TRANSIENT} (transient), retry {attempt + 1}/"
                         f"{limit} in {wait:.0f}s")
                time.sleep(wait)
        except BaseException:
            res.reason = "interrupted (Ctrl-C or SIGTERM); the step was stopped"
            res.verdict = _read_verdict(out)[0]
            raise
        finally:
            res.duration_s = round(time.monotonic() - t, 2)
            self.in_steps_s += time.monotonic() - t
        res.verdict, res.failed_checks, res.skipped_checks, res.counts = _read_verdict(out)
        if res.exit_code == 0:
            res.phase = "Succeeded"
        else:
            res.reason = _failure_reason(res, out / "step.log")
        self.say(f"{task.gate} {path}: {res.phase.upper()} verdict={res.verdict or '-'} ({res.duration_s:.1f}s)"
                 + (f" - {res.reason}" if res.reason else "") + self._progress(path))
        return res

    def _backoff_s(self, attempt: int, policy: RetryPolicy) -> float:
        """Argo's backoff before retry ``attempt + 1``: duration * factor**attempt, the duration's parameter
        reference (if any) filled from the run's parameters, as Argo substitutes it."""
        base = refs.replace(policy.backoff, lambda r: (self.params.get(r.name) or "30s") if r.kind == "parameter" else None)
        return _duration_s(base) * float(policy.factor) ** attempt

    def _spawn(self, cmd: list[str], log: Path, timeout_s: float, label: str) -> int:
        """Run one step; Ctrl-C reaches it (same process group), the runner waits for it to clean up."""
        with open(log, "wb") as fh:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                                    cwd=self.cwd, env=self.env, preexec_fn=_sigint_default)
            start = time.monotonic()
            try:
                while True:
                    try:
                        return proc.wait(timeout=HEARTBEAT_S)
                    except subprocess.TimeoutExpired:
                        el = time.monotonic() - start
                        if el > timeout_s:
                            self.say(f"{label}: past its {timeout_s:.0f}s deadline; interrupting it")
                            _stop_child(proc)
                            fh.write(f"\n[gauntlet run] killed after its {timeout_s:.0f}s deadline\n".encode())
                            return 124
                        self.say(f"  {label}: still running ({el:.0f}s)")
            except BaseException:
                self.interrupted = True
                _stop_child(proc)
                raise

    # ----------------------------------------------------------- exit handler

    def _exit_handler(self, status: str) -> None:
        task = self.graph.exit_handler
        wf = {**self._workflow_vars(), "status": status}
        wf["failures"] = argo_failures(self.results, wf["name"], status)
        scope = {"inputs": {}, "outs": {}, "workflow": wf}
        # Ctrl-C again must not cut the cleanup short: ignore it in the runner while cleanup runs
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            self._run_task(task, None, scope)
        except BaseException as exc:  # noqa: BLE001 - the engine guarantee below must still run
            self.say(f"exit handler: {type(exc).__name__}: {exc}")
        finally:
            signal.signal(signal.SIGINT, previous)


def argo_failures(results: list[TaskResult], workflow: str, status: str) -> str:
    """The workflow variable ``failures`` exactly as Argo's controller substitutes it (v4.0.5 operator.go).

    Every Failed/Error node, as JSON, quoted once more with strconv.Quote: each failed attempt of a
    step (``name(i)``), the step's retry node (``name``), each failed DAG (an engine sequence, and
    the workflow's own root DAG, named after the workflow); nothing failed gives ``"null"``.
    """
    nodes: list[dict[str, str]] = []

    def node(name: str, template: str, message: str) -> None:
        nodes.append({"displayName": name, "message": message, "templateName": template, "phase": "Failed",
                      "podName": "", "finishedAt": now_iso()})

    for r in results:
        if r.step and r.retried:         # without a retryStrategy the pod node is the step's node
            for i, code in enumerate(r.attempts):
                if code != 0:
                    node(f"{r.name}({i})", r.step, f"exit code {code}")
        if r.phase == "Failed":
            node(r.name, r.step or ENGINE_SEQUENCE, r.reason)
    if status == "Failed":
        node(workflow, "main", "child failed")
    return json.dumps(json.dumps(nodes) if nodes else "null", ensure_ascii=False)


def _duration_s(text: str) -> float:
    """An Argo duration string ("30s", "2m", "1h", or plain seconds) in seconds."""
    text = text.strip()
    units = {"s": 1, "m": 60, "h": 3600}
    try:
        return float(text[:-1]) * units[text[-1]] if text and text[-1] in units else float(text)
    except ValueError:
        return 30.0


def _sigint_default() -> None:
    """In the child: SIGINT back to default even when the runner was started with it ignored
    (`cmd &` in a script), so the step's own Ctrl-C handling releases what it holds."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _stop_child(proc: subprocess.Popen[Any]) -> None:
    """The step got Ctrl-C with us (same process group) or gets SIGINT now; SIGKILL is the last resort."""
    try:
        proc.wait(timeout=5)          # a terminal Ctrl-C reached it already: let it unwind undisturbed
        return
    except subprocess.TimeoutExpired:
        pass
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=INTERRUPT_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class _sigterm_as_interrupt:
    """SIGTERM to the runner behaves like Ctrl-C: stop the current gate, run the exit handler. SIGINT is
    installed too: a runner started in the background by a non-interactive shell inherits it ignored."""

    def __enter__(self) -> _sigterm_as_interrupt:
        def handler(signum: int, frame: FrameType | None) -> NoReturn:
            raise KeyboardInterrupt(f"signal {signum}")
        self.prev: dict[signal.Signals, Any] | None
        try:
            self.prev = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
        except ValueError:
            self.prev = None
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in (self.prev or {}).items():
            signal.signal(sig, old)


def _read_verdict(out: Path) -> tuple[str | None, list[dict[str, Any]], list[dict[str, Any]], dict[str, int]]:
    """(status, failing checks, skipped checks, counts by status) of a step's verdict.json; (None, ...) when the
    step left none that reads as a verdict (the contract's reader)."""
    try:
        v = Verdict.read(out)
    except CorruptVerdict:
        return None, [], [], {}
    bad = [asdict(c) for c in v.failed_checks()]
    skipped = [asdict(c) for c in v.checks if c.status == "skip"]
    counts: dict[str, int] = {}
    for c in v.checks:
        counts[c.status] = counts.get(c.status, 0) + 1
    return v.status, bad, skipped, counts


def _failure_reason(res: TaskResult, log: Path) -> str:
    if res.failed_checks:
        c = res.failed_checks[0]
        more = f" (+{len(res.failed_checks) - 1} more)" if len(res.failed_checks) > 1 else ""
        return f"{c['name']}: {c['detail']}{more}"
    if res.exit_code == 124:
        return "timed out"
    try:
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        lines = []
    tail = lines[-1] if lines else "no output"
    return f"exit code {res.exit_code}: {tail[-300:]}"


# ------------------------------------------------------------------ summary

def write_summary(run_dir: Path, meta: dict[str, Any], results: list[TaskResult]) -> Path:
    """summary.md: each gate, its status, duration, why it failed or was skipped."""
    lines = [f"# gauntlet run {meta['run_id']}: {meta['status']}", "",
             f"- profile: `{meta['profile']}`", f"- started: {meta['started']}, finished: {meta['finished']}",
             f"- wall time: {meta['wall_s']:.1f} s; inside the gates' subprocesses: {meta['in_steps_s']:.1f} s; "
             f"waiting for an engine's background build: {meta.get('build_wait_s', 0.0):.1f} s; "
             f"runner overhead: {meta['overhead_s']:.2f} s ({meta['overhead_pct']:.2f}% of wall)",
             f"- engine start-ups: {meta.get('engine_startups_s') or 'none'} (seconds until /v1/models answered)",
             f"- engines stopped by the exit guarantee: {meta['stopped_engines'] or 'none left running'}", "",
             "| gate | task | status | verdict | duration | detail |", "|---|---|---|---|---:|---|"]
    for r in results:
        detail = r.reason or ", ".join(f"{n} {st}" for st, n in sorted(r.counts.items()))
        detail = detail.replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {r.gate} | `{r.path}` | {r.phase} | {r.verdict or '-'} | {r.duration_s:.1f} s | {detail} |")
    failed = [r for r in results if r.failed_checks]
    if failed:
        lines += ["", "## Failing checks", ""]
        for r in failed:
            where = f" ({verdict_path(Path(r.out))})" if r.out else ""
            lines.append(f"### `{r.path}`{where}")
            for c in r.failed_checks:
                lines.append(f"- **{c['name']}** ({c['status']}): {c['detail']} - expected `{c['expected']}`, "
                             f"observed `{c['observed']}`")
    skipped = [r for r in results if r.skipped_checks]
    if skipped:
        lines += ["", "## Checks skipped, with their reason", ""]
        for r in skipped:
            for c in r.skipped_checks:
                lines.append(f"- `{r.path}` **{c['name']}**: {c['detail']}")
    lines.append("")
    path = run_dir / "summary.md"
    path.write_text("\n".join(lines))
    return path


# ------------------------------------------------------------------ entry

def _startups(run_dir: Path) -> dict[str, float]:
    """{deploy path: start-up seconds} of every engine the run started (Gate 2 and Gate 6 deploys)."""
    out = {}
    layout = RunLayout(run_dir)
    for f in layout.verdict_files("deploy"):
        try:
            s = Verdict.read(f).metrics.get("startup_s")
        except CorruptVerdict:
            continue
        if isinstance(s, (int, float)):
            out[layout.relative(f)] = s
    return out


def _mins(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def _plan(graph: Graph, profile: Profile) -> Plan | None:
    """The run's plan, for the progress lines; None (no lines) when the plan cannot be made."""
    from gauntlet.params import load_images
    from gauntlet.workflows.plan import image_fixes, plan_graph
    try:
        return plan_graph(graph, profile, "local", image_fixes(profile, load_images()))
    except (UsageError, ValueError, OSError):
        return None


def _run_id() -> str:
    return datetime.now(UTC).strftime("%Y%m%d-%H%M%S")


def run_local(profile: Profile, profile_file: Path, *, runs_dir: Path = Path("runs"), run_id: str | None = None,
              engines: str | None = None, gates: set[str] | None = None, run: Run = "qualification",
              **runner_overrides: Any) -> int:
    """`gauntlet run`: the whole graph for ``profile`` (read from ``profile_file``, which every step is
    given) on this machine, of one ``run`` (the qualification or the nightly); 0 when no gate failed.
    ``runner_overrides`` go to :class:`Runner`."""
    from gauntlet.steps.backends import BACKENDS, require
    from gauntlet.steps.backends.protocol import RunnerGuard
    local = BACKENDS["local"]
    guard = require(local, RunnerGuard, "gauntlet run")

    graph = build_graph(profile, "local", run)
    run_id = run_id or _run_id()
    run_dir = (Path(runs_dir) / run_id).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    params = {k: v[0] for k, v in graph.parameters.items()}
    params["run-dir"] = str(run_dir)
    if engines:
        params["engines"] = engines
    profile_file = Path(profile_file).resolve()
    started = now_iso()
    runner = Runner(graph, profile_file, run_dir, params, gates=gates, **runner_overrides)
    runner.say(f"run {run_id}: profile {profile.name}, the {run} run, evidence in {run_dir}")
    plan = _plan(graph, profile)
    if plan is not None:
        runner.follow_plan({r.path: r.end_s for r in plan.rows}, plan.total_s)
        runner.say(f"plan: ~{_mins(plan.total_s)} for the whole run (gauntlet plan --profile {profile.name})")
    # the local janitor: engines of earlier runs whose runner was killed (kill -9) are stopped first
    _, swept = local.janitor(run_dir / ".janitor", runs_dir=run_dir.parent, exclude=run_dir)
    for name, what in swept["released"].items():
        runner.say(f"janitor: run {name}'s runner is gone; stopped its engines {what['stopped']}")
    guard.mark_runner(run_dir)
    status = runner.run()
    stopped = guard.stop_all(run_dir)
    guard.clear_runner(run_dir)
    if stopped:
        runner.say(f"stopped {len(stopped)} engine group(s) the gates left running: {stopped}")
    wall = time.monotonic() - runner.t0
    overhead = max(0.0, wall - runner.in_steps_s - runner.build_wait_s)
    meta = {"run_id": run_id, "profile": str(profile_file), "status": status, "started": started,
            "finished": now_iso(), "wall_s": round(wall, 2), "in_steps_s": round(runner.in_steps_s, 2),
            "build_wait_s": round(runner.build_wait_s, 2),
            "overhead_s": round(overhead, 3), "overhead_pct": round(100 * overhead / wall, 3) if wall else 0.0,
            "interrupted": runner.interrupted, "parameters": params,
            "stopped_engines": [{k: v for k, v in s.items() if k != "dir"} for s in stopped],
            "engine_startups_s": _startups(run_dir)}
    write_json_atomic(run_dir / "run.json", {**meta, "tasks": [asdict(r) for r in runner.results]})
    summary = write_summary(run_dir, meta, runner.results)
    runner.say(f"{status.upper()} in {wall:.1f}s (runner overhead {overhead:.2f}s, "
               f"{meta['overhead_pct']:.2f}%); {summary}")
    if runner.interrupted:
        return 130
    return 0 if status == "Succeeded" and not any(r.phase == "Failed" for r in runner.results) else 1
