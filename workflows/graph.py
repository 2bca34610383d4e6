"""The gate graph as plain data: the one source of truth both back ends read.

:func:`build_graph` turns a profile into a :class:`Graph` of DAG templates for one back end:
``"argo"`` (the cluster: per-node prewarm, Gate 1's node and network checks) or ``"local"`` (one
machine: the model is prepared locally, no cluster-wide gates). Nothing in a graph is dropped later.
A profile runs on the back end of its ``hardware.kind``.
The Argo renderer (:mod:`gauntlet.workflows.render`) writes each task's :class:`Need` tuple and
:class:`When` as Argo's ``depends``/``when`` strings; the local runner (:mod:`gauntlet.workflows.local`)
evaluates the same structures directly (:meth:`Need.met`, :meth:`When.holds`), in the same order,
with the same exit handler.

Conventions every step relies on:

- each task runs ``gauntlet step <step> --profile <profile> --out <RUN>/<task-path>``
  where ``<RUN>`` is the ``run-dir`` workflow parameter (``/runs/<workflow uid>`` on Argo,
  ``runs/<run-id>`` locally) and ``<task-path>`` is what :class:`gauntlet.contract.layout.RunLayout`
  maps the task to (``<task>``, or ``<engine>/<task>`` in an engine sequence);
- a step's output parameters are files under ``<out>/outputs/`` (``verdict`` always), read with
  :func:`output_default` when the step wrote none;
- in an engine sequence, later gates get ``--endpoint`` from the deploy task's
  ``endpoint`` output and ``--engine`` from the sequence's input.

A task holds only what differs from task to task: its node and its flags, built from its gate's typed
``Options`` (:func:`gate_args`). What holds for every task of a gate (its image, the host's network, one task
per node on the cluster) is the gate's ``NEEDS`` (gauntlet.steps.gate.Needs), which render reads
(:func:`image_key`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import PurePosixPath
from typing import Any, Literal

from gauntlet.contract import UsageError, param_name
from gauntlet.contract.layout import CLEANUP_TASK, RunLayout, nodes_task, preflight_task
from gauntlet.params.models import Profile
from gauntlet.params.models import EngineName, Variant
from gauntlet.steps import Needs, load_step, needs_of
from gauntlet.steps.gates.experiment import BASELINE_TASK
from gauntlet.steps.gates.experiment_baseline import needs_baseline
from gauntlet.steps.gates.pull import DEADLINE_S as PULL_DEADLINE_S
from gauntlet.steps.gates.regress import DEFAULT_RULE
from gauntlet.steps.options import to_argv
from gauntlet.workflows import refs
from gauntlet.workflows.refs import Ref

__all__ = ["Task", "Dag", "Graph", "Need", "When", "ConditionError", "build_graph", "ORCHESTRATORS", "Orchestrator", "PHASES",
           "Run", "RUNS",
           "SUCCEEDED", "SUCCEEDED_OR_SKIPPED", "SUCCEEDED_OR_FAILED", "REACHED", "ANY_OUTCOME", "RUN_DIR",
           "ENGINE_SEQUENCE",
           "RETRY_LIMIT", "DEFAULT_TIMEOUT_S", "RetryPolicy", "retry_policy", "gate_args", "image_key",
           "STEP_IMAGE", "BENCH_IMAGE", "output_default",
           "dag_engine"]

# which back end runs the graph (not where the engine runs: that is gauntlet.steps.backends)
Orchestrator = Literal["argo", "local"]
ORCHESTRATORS: tuple[Orchestrator, ...] = ("argo", "local")
# which run of the one graph: the qualification (every gate, submitted by hand) or the nightly (the scheduled
# regression run: Gate 0, Gate 1, deploy, smoke, the profile's nightly.cases, regress, report; params NightlySpec)
Run = Literal["qualification", "nightly"]
RUNS: tuple[Run, ...] = ("qualification", "nightly")
RUN_DIR = str(refs.parameter("run-dir"))
ENGINE_SEQUENCE = "engine-sequence"
# The image keys (params/images.yaml) of a gate's NEEDS.image (image_key): the project's step image, and the step
# image built on the pinned vLLM image: the one bench client, CUDA torch for the GPU probe.
STEP_IMAGE = "steps"
BENCH_IMAGE = "steps-vllm"
# Every step's retry policy, on both back ends: only exit gauntlet.contract.EXIT_TRANSIENT (a transient
# infrastructure error) is retried, at most RETRY_LIMIT more times; a failed verdict (exit 1) is a result, never retried.
RETRY_LIMIT = 3
# The exit handler's first wait before a retry: fixed, never the user's retry-backoff (a value Argo cannot parse
# in the exit handler's retryStrategy turns its retry into an Error and leaves the GPUs held).
EXIT_BACKOFF = "10s"
# A task's deadline (activeDeadlineSeconds on Argo, the local runner's kill) when neither the graph nor the
# profile's timeouts_s sets one.
DEFAULT_TIMEOUT_S = 4 * 3600



@dataclass(frozen=True)
class RetryPolicy:
    """How a task's attempts are retried, the one rule both back ends follow: only exit
    gauntlet.contract.EXIT_TRANSIENT is retried, at most ``limit`` more times, the n-th retry after
    ``backoff * factor**(n-1)``. ``backoff`` is an Argo duration or a reference to a workflow parameter."""

    limit: int
    backoff: str
    factor: int = 2


def retry_policy(task: Task, needs: Needs | None = None) -> RetryPolicy | None:
    """The task's retry policy; None when its gate never exits 75 (``Needs.transient`` False), which Argo then
    runs without a retryStrategy (so its template ``timeout`` can fire while the pod is Pending) and the local
    runner runs once. The exit handler waits a fixed EXIT_BACKOFF, every other step the ``retry-backoff``
    parameter. ``needs``: the step's (default: the registered gate's)."""
    if not task.step or not (needs or needs_of(task.step)).transient:
        return None
    return RetryPolicy(RETRY_LIMIT, EXIT_BACKOFF if task.gate == "exit" else str(refs.parameter("retry-backoff")))


# The phases Argo's `depends` can ask of an upstream task.
PHASES = ("Succeeded", "Failed", "Errored", "Skipped", "Omitted", "Daemoned")
SUCCEEDED = ("Succeeded",)
SUCCEEDED_OR_SKIPPED = ("Succeeded", "Skipped")      # an optional predecessor: its when may be false
SUCCEEDED_OR_FAILED = ("Succeeded", "Failed")        # runs on either verdict
# Reached: it ran (whatever its verdict) or its when was false; not Omitted (something before it did not pass).
# Gate 1 after Gate 0's engine checks, a Gate 6 variant after the one before it (each judged on its own).
REACHED = ("Succeeded", "Failed", "Errored", "Skipped")
# Whatever happened: the task after it runs once it is decided. What must run after a failure: the sequence's
# teardown (the engine's GPUs back before the next engine deploys), the next engine's sequence, regress, report.
# Such a task fails itself when a task before it did not pass (its --upstream, shared_options.upstream_check):
# Argo judges a DAG by its leaf tasks only (workflow/controller/dag.go assessDAGPhase: a leaf that completed sets
# its branch's phase), and its RETRY resets a failed node only when none of its descendants Succeeded
# (workflow/util/util.go FormulateRetryWorkflow, isDescendantNodeSucceeded).
ANY_OUTCOME = ("Succeeded", "Failed", "Errored", "Skipped", "Omitted")


class ConditionError(ValueError):
    """A condition that cannot be evaluated (Argo would fail the task too)."""


@dataclass(frozen=True)
class Need:
    """One upstream task and the phases of it that let this task run; a task's needs are ANDed."""

    task: str
    phases: tuple[str, ...] = SUCCEEDED

    def __post_init__(self) -> None:
        if not self.phases or len(set(self.phases)) != len(self.phases) or set(self.phases) - set(PHASES):
            raise ValueError(f"need {self.task}: phases {self.phases} must be distinct names from {PHASES}")

    def met(self, phases: Mapping[str, str]) -> bool:
        """Is the upstream task in one of the accepted phases? (``phases``: task name -> its phase)"""
        return phases[self.task] in self.phases

    def __str__(self) -> str:
        return f"{self.task} {' or '.join(self.phases)}"


_WORD = re.compile(r"[A-Za-z0-9_-]+")                 # a one-of value: a plain word, the same as a regex
_BARE = re.compile(r"[A-Za-z0-9_.:/+-]+")             # one unquoted operand of a `when` expression


@dataclass(frozen=True)
class When:
    """A condition on one value: a workflow parameter, a DAG input or an earlier task's output.

    ``equals`` with a bool compares the value as Argo's ``true``/``false`` literal (an output whose
    default is ``false``); with a str, as quoted text (any text, an empty default included).
    ``one-of`` is true when one comma-separated item of the text is exactly one of ``value``'s words
    (``engines=sglang,vllm`` runs both sequences; ``sglangx`` or ``xboth`` match nothing): rendered as the
    anchored ``=~ '(^|,)(a|b)(,|$)'`` (render.argo_when); the ``params`` step refuses any item that is not an
    allowed value before anything runs.
    """

    subject: Ref
    op: Literal["equals", "one-of"]
    value: bool | str | tuple[str, ...]

    def __post_init__(self) -> None:
        if self.subject.kind == "workflow":
            raise ValueError(f"when on {self.subject}: workflow variables are not known before the run ends")
        if self.op == "equals":
            ok = isinstance(self.value, (bool, str)) and "'" not in str(self.value)
        else:
            ok = (self.op == "one-of" and isinstance(self.value, tuple) and bool(self.value)
                  and all(isinstance(v, str) and _WORD.fullmatch(v) for v in self.value))
        if not ok:
            raise ValueError(f"when {self.subject} {self.op} {self.value!r}: not a condition this graph can state")

    @classmethod
    def equals(cls, subject: Ref, value: bool | str) -> When:
        return cls(subject, "equals", value)

    @classmethod
    def one_of(cls, subject: Ref, *values: str) -> When:
        return cls(subject, "one-of", values)

    def holds(self, text: str) -> bool:
        """Is the condition true of the subject's value ``text``, as Argo evaluates the rendered expression?"""
        if isinstance(self.value, bool):
            # rendered unquoted: ``true``/``false`` is a boolean; any other single word is text (Argo turns
            # govaluate's variables into strings), never equal to a boolean; nothing, or several words, does
            # not parse
            lit = text.strip()
            if lit in ("true", "false"):
                return (lit == "true") is self.value
            if not _BARE.fullmatch(lit):
                raise ConditionError(f"{self.subject} is {text!r}: the expression `{lit} == ...` does not parse")
            return False
        if "'" in text:
            raise ConditionError(f"{self.subject} is {text!r}: a quote cannot be compared inside quotes")
        if self.op == "one-of":
            return any(item in self.value for item in text.split(","))   # as the rendered anchored `=~`
        return text == self.value

    def __str__(self) -> str:
        if self.op == "one-of" and isinstance(self.value, tuple):     # one-of always holds a tuple
            return f"{self.subject.path} one of {'|'.join(self.value)}"
        value = ("true" if self.value else "false") if isinstance(self.value, bool) else repr(self.value)
        return f"{self.subject.path} == {value}"


@dataclass(frozen=True)
class Task:
    """One node of a DAG: a `gauntlet step` container, or a call of another DAG template."""

    name: str
    step: str | None = None                 # gauntlet step name; None when `dag` is set
    dag: str | None = None                  # name of a DAG template to call
    args: tuple[str, ...] = ()              # its gate's flags (gate_args); may hold references (workflows/refs.py)
    depends: tuple[Need, ...] = ()          # all must be met, else the task is Omitted
    when: When | None = None                # false: the task is Skipped
    node: str | None = None                 # pin the pod to this node
    outputs: tuple[str, ...] = ()           # output parameter names beyond `verdict`
    inputs: dict[str, str] = field(default_factory=dict)  # DAG call arguments
    gate: str = ""                          # the plan's gate label (gate0..gate7, exit)
    timeout_s: int | None = None

    @property
    def upstream(self) -> tuple[str, ...]:
        """The tasks this one depends on."""
        return tuple(n.task for n in self.depends)

    def flag(self, name: str) -> str | None:
        """The word after ``name`` (e.g. ``--engine``) in the task's flags; None when it has no such flag."""
        a = list(self.args)
        return a[a.index(name) + 1] if name in a and a.index(name) + 1 < len(a) else None

    def step_name(self) -> str:
        """The step this container task runs; ValueError for a task that calls a DAG (it runs none)."""
        if self.step is None:
            raise ValueError(f"task {self.name}: calls DAG {self.dag}, not a step")
        return self.step


def gate_args(step: str, **values: Any) -> tuple[str, ...]:
    """A task's flags: ``values`` (fields of its gate's ``Options``) as the gate's command line, in the order
    given. A :class:`Ref` stands for one value, filled in when the task runs. TypeError on a field the gate does
    not have, a value of the wrong type, or a required option left out (steps/options.py to_argv)."""
    return to_argv(load_step(step).Options, values, opaque=(Ref,))


def image_key(profile: Profile, task: Task) -> str:
    """The image key (params/images.yaml) of the task's container, from its gate's ``NEEDS.image``: the step
    image, the bench client's, or the image of the engine the task's ``--engine`` names (a literal engine of
    the profile; ValueError otherwise)."""
    if not task.step:
        raise ValueError(f"task {task.name} calls DAG {task.dag}: it has no container of its own")
    role = needs_of(task.step).image
    if role == "engine":
        engine = task.flag("--engine")
        if engine is None or engine not in profile.engines:
            raise ValueError(f"task {task.name}: gate {task.step} runs in its engine's image, so its --engine must "
                             f"name an engine of profile {profile.name} (got {engine!r})")
        return profile.engines[engine].image
    return BENCH_IMAGE if role == "bench" else STEP_IMAGE


def output_default(name: str) -> str:
    """An output parameter's value when its step wrote no such file (a crash, a skipped branch): Argo's
    ``valueFrom.default`` (render) and the local runner's value alike. ``verdict``: ``error``; ``unlock_*``:
    ``false`` (the gated case or rung stays locked); any other: empty."""
    return "error" if name == "verdict" else "false" if name.startswith("unlock") else ""


def dag_engine(dag_name: str, inputs: Mapping[str, str]) -> str | None:
    """The engine directory the tasks of DAG ``dag_name`` write under (RunLayout's ``<engine>/<task>``):
    an engine sequence's ``engine`` input (a value locally, its reference when rendering); None for the
    main DAG, whose tasks write at the run's root."""
    return inputs["engine"] if dag_name == ENGINE_SEQUENCE else None


@dataclass(frozen=True)
class Dag:
    name: str
    tasks: tuple[Task, ...]
    inputs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # both back ends walk the tasks in this order: a task may only name tasks before it
        seen: set[str] = set()
        for t in self.tasks:
            later = [n.task for n in t.depends if n.task not in seen]
            if t.when is not None and t.when.subject.kind == "output" and t.when.subject.task not in seen:
                later.append(t.when.subject.task)
            # an output or a status read in its flags or DAG arguments is an earlier task's (Argo resolves only an
            # ancestor's: lint checks that, workflows/lint.py)
            later += [r.task for text in (*t.args, *t.inputs.values()) for p in refs.find(text)
                      if (r := refs.parse(p)) is not None and r.kind in ("output", "status") and r.task not in seen]
            if later:
                raise ValueError(f"dag {self.name}: task {t.name} names {later}, not earlier tasks of the dag")
            if t.name in seen:
                raise ValueError(f"dag {self.name}: task {t.name} appears twice")
            seen.add(t.name)

    def task(self, name: str) -> Task:
        return next(t for t in self.tasks if t.name == name)


@dataclass(frozen=True)
class Graph:
    profile: str
    main: Dag
    sequences: tuple[Dag, ...]
    exit_handler: Task
    parameters: dict[str, tuple[str, tuple[str, ...] | None, str]]  # name -> (default, enum, description)
    run: Run = "qualification"

    @property
    def dags(self) -> tuple[Dag, ...]:
        return (self.main, *self.sequences)

    def dag(self, name: str) -> Dag:
        return next(d for d in self.dags if d.name == name)


def _ok(*tasks: str, skipped: bool = False) -> tuple[Need, ...]:
    return tuple(Need(t, SUCCEEDED_OR_SKIPPED if skipped else SUCCEEDED) for t in tasks)


def _statuses(tasks: list[Task]) -> tuple[str, ...]:
    """``--upstream``: ``name={{tasks.<name>.status}}`` for each of ``tasks`` (every one an ancestor of the
    reader: the tasks before it in a DAG it depends on the last of, or on all of)."""
    return tuple(f"{t.name}={refs.status(t.name)}" for t in tasks)


RELEASE_TASK = "release-baseline"
PARAMS_TASK = "params"
# every parameter Argo (or the local runner) was given, undeclared ones included: Argo's JSON list of {name, value}
ALL_PARAMETERS = refs.parameter("json")
# how a parameter without an enum is checked (steps/gates/params.py RULES)
PARAMETER_RULES = {"run-dir": "path", "results-uri": "uri", "retry-backoff": "duration"}


def _on_engines(variants: list[Variant]) -> When | None:
    """Only in the sequences of an engine one of ``variants`` runs on (None: every engine's)."""
    engines = sorted({v.engine for v in variants if v.engine is not None})
    if any(v.engine is None for v in variants) or not engines:
        return None
    eng = refs.input_param("engine")
    return When.equals(eng, engines[0]) if len(engines) == 1 else When.one_of(eng, *engines)


NCCL_ENV_INPUT = "nccl-env"      # the engine sequence's input on the cluster: Gate 1's per-node NCCL/GLOO env


def _engine_sequence(profile: Profile, cluster: bool = False, run: Run = "qualification") -> Dag:
    """Gates 2-6 for one engine, then teardown. The engine is the DAG's input.

    The nightly's sequence is deploy, smoke, one perf task over ``nightly.cases`` (ungated: no unlock), the
    confirm-before-alarm stage (suspect, confirm) and teardown: no long context, no Gate 6.

    Gate 6 never holds two engines' GPUs: the baseline runs the phases its variants need of it
    (``baseline-phases``) while still up, before Gate 5; then it is released (``release-baseline``: the
    baseline only) and each variant is deployed, measured and torn down (the variant only) in turn. No
    later gate needs the baseline, so it is not redeployed; ``teardown`` still ends the sequence (it
    passes with nothing to stop). An engine without variants keeps its baseline until ``teardown``.
    """
    eng = refs.input_param("engine")
    common = {"engine": eng, "endpoint": refs.output("deploy", "endpoint")}
    # One client for every engine (the bench image: NEEDS.image): `vllm bench serve`, on a pool node whose
    # NVMe cache holds the tokenizer (the model is never read over the network file system).
    bench: dict[str, Any] = {"node": profile.hardware.nodes[0].name if profile.hardware.nodes else None}
    # on the cluster, deploy exports what Gate 1 resolved per node (network's nccl_env, steps/cluster/fabric.py)
    fabric = {"nccl_env": refs.input_param(NCCL_ENV_INPUT)} if cluster else {}
    tasks: list[Task] = [
        Task("deploy", step="deploy", gate="gate2", args=gate_args("deploy", engine=eng, **fabric),
             outputs=("endpoint",), timeout_s=max(e.startup_timeout_s for e in profile.engines.values()) + 600),
        Task("smoke", step="smoke", gate="gate3", args=gate_args("smoke", **common), depends=_ok("deploy")),
    ]
    nightly = run == "nightly"
    base_cases = profile.nightly_cases() if nightly else [c for c in profile.bench.cases if c.requires_stable is None]
    gated_cases = [] if nightly else [c for c in profile.bench.cases if c.requires_stable is not None]
    tasks.append(Task("perf", step="perf", gate="gate4", depends=_ok("smoke"), **bench,
                      args=gate_args("perf", **common, cases=tuple(c.name for c in base_cases)),
                      outputs=tuple(f"unlock_{param_name(c.name)}" for c in gated_cases)))
    last = "perf"
    for c in gated_cases:
        name = f"perf-{c.name}"
        tasks.append(Task(name, step="perf", gate="gate4", depends=_ok(last, skipped=last != "perf"), **bench,
                          when=When.equals(refs.output("perf", f"unlock_{param_name(c.name)}"), True),
                          args=gate_args("perf", **common, cases=(c.name,))))
        last = name
    # Confirm before alarm (docs/regression.md): while this engine is still up, the nightly's suspicion
    # is measured again on fresh rounds of the same requests; regress then labels only a confirmed one.
    tasks.append(Task("suspect", step="regress", gate="gate4", depends=_ok(last, skipped=last != "perf"),
                      args=gate_args("regress", engine=eng, stage="suspect"), outputs=("suspect", "suspect_cases")))
    tasks.append(Task("confirm", step="perf", gate="gate4", depends=_ok("suspect"), **bench,
                      when=When.equals(refs.output("suspect", "suspect"), "true"),
                      args=gate_args("perf", **common, cases=refs.output("suspect", "suspect_cases"),
                                     phase="confirm", rounds=DEFAULT_RULE.confirm_rounds)))
    after_perf = _ok("confirm", skipped=True)      # Skipped: nothing suspected
    slo = profile.bench.slo
    if not nightly and slo is not None and slo.climb and slo.climb_case:
        # the highest concurrency meeting the SLO (steps/gates/perf.py climb_decision): the qualification only,
        # after the regression cases; it stops at the first step that misses the SLO or saturates the server
        tasks.append(Task("climb", step="perf", gate="gate4", depends=after_perf, **bench,
                          args=gate_args("perf", **common, cases=(slo.climb_case,), phase="climb")))
        after_perf = _ok("climb")
    if nightly:
        tasks.append(Task("teardown", step="teardown", gate="gate2", depends=(Need(tasks[-1].name, ANY_OUTCOME),),
                          args=gate_args("teardown", engine=eng, upstream=_statuses(tasks))))
        return Dag(ENGINE_SEQUENCE, tuple(tasks), inputs=("engine", NCCL_ENV_INPUT) if cluster else ("engine",))
    needing = [v for v in profile.experiments if needs_baseline(v, profile)]
    if needing:
        tasks.append(Task(BASELINE_TASK, step="experiment-baseline", gate="gate6", depends=after_perf,
                          when=_on_engines(needing), args=gate_args("experiment-baseline", **common), **bench))
        after_perf = _ok(BASELINE_TASK, skipped=True)
    base_rungs = [r for r in profile.longctx.ladder if not r.requires_all_lower]
    gated_rungs = [r for r in profile.longctx.ladder if r.requires_all_lower]
    tasks.append(Task("longctx", step="longctx", gate="gate5", depends=after_perf,
                      args=gate_args("longctx", **common, **fabric, rungs=",".join(str(r.tokens) for r in base_rungs)),
                      outputs=("unlock_all_lower",)))
    last = "longctx"
    for r in gated_rungs:
        name = f"longctx-{r.tokens}"
        tasks.append(Task(name, step="longctx", gate="gate5", depends=_ok(last, skipped=last != "longctx"),
                          when=When.equals(refs.output("longctx", "unlock_all_lower"), True),
                          args=gate_args("longctx", **common, **fabric, rungs=str(r.tokens))))
        last = name
    prev_ok = _ok(last, skipped=last != "longctx")
    if profile.experiments:
        # Gate 6: the baseline's GPUs (and host ports) are given back before any variant asks for them
        tasks.append(Task(RELEASE_TASK, step="teardown", gate="gate6", depends=prev_ok,
                          when=_on_engines(profile.experiments), args=gate_args("teardown", engine=eng)))
        prev_ok = _ok(RELEASE_TASK, skipped=True)
    # one variant at a time: the experiment step deploys it, measures it and tears it down itself (steps/gates/
    # experiment.py, in a finally), so the next variant runs after a failed one: each is judged on its own
    for v in profile.experiments:
        name = f"exp-{v.name}"
        when = When.equals(refs.input_param("engine"), v.engine) if v.engine is not None else None
        tasks.append(Task(name, step="experiment", gate="gate6", depends=prev_ok, when=when, **bench,
                          args=gate_args("experiment", engine=eng, variant=v.name, **fabric)))
        prev_ok = (Need(name, REACHED),)
    # whatever happened before it: the engine's GPUs come back before the next engine's sequence deploys, and the
    # teardown, the sequence's leaf, fails when a task before it did not pass, so the sequence does (ANY_OUTCOME)
    tasks.append(Task("teardown", step="teardown", gate="gate2", depends=(Need(tasks[-1].name, ANY_OUTCOME),),
                      args=gate_args("teardown", engine=eng, upstream=_statuses(tasks))))
    return Dag(ENGINE_SEQUENCE, tuple(tasks), inputs=("engine", NCCL_ENV_INPUT) if cluster else ("engine",))


def build_graph(profile: Profile, backend: Orchestrator, run: Run = "qualification") -> Graph:
    """The whole plan for one profile, as data, for the back end that runs it.

    ``run``: the qualification (every gate) or the nightly (:class:`gauntlet.params.models.NightlySpec`): the
    same tasks cut to Gate 0 and Gate 1 for the nightly's engines, their sequences (_engine_sequence), regress
    and report; no prewarm on the cluster (the nightly reads the cache Gate 0 checks).

    ``"argo"`` (a ``kubernetes`` profile): per node an optional prewarm (the ``prewarm`` parameter) and a
    preflight, their comparison, then Gate 1's node and network checks before any engine starts.
    ``"local"`` (a ``local`` profile): the model is prepared, then one preflight. A profile runs on its
    own back end only (UsageError): a kubernetes profile's engines must not start without Gate 1.
    """
    if backend not in ORCHESTRATORS:
        raise ValueError(f"backend {backend!r}: one of {', '.join(ORCHESTRATORS)}")
    if run not in RUNS:
        raise UsageError(f"run {run!r}: one of {', '.join(RUNS)}")
    cluster = backend == "argo"
    if profile.hardware.kind != ("kubernetes" if cluster else "local"):
        raise UsageError(f"profile {profile.name} has hardware.kind {profile.hardware.kind!r}: "
                         + (f"no Argo graph (run it with `gauntlet run --profile {profile.name}`)" if cluster else
                            f"it runs on the cluster (`gauntlet render`/`submit --profile {profile.name}`), "
                            "not with the local back end"))
    nodes = [n.name for n in profile.hardware.nodes] if cluster else []
    nightly = run == "nightly"
    order = profile.nightly_engines() if nightly else profile.engine_order()
    engines_is = {e: When.one_of(refs.parameter("engines"), e, "both") for e in order}
    tasks: list[Task] = []
    pre_names: list[str] = []

    params = _parameters(profile, order, prewarm=not (cluster and nightly))
    # first of all, no GPU, no model cache: every parameter given is declared and allowed (steps/gates/params.py);
    # every other task depends on it, so a bad value fails the workflow before anything is requested
    # on Argo run-dir is no template parameter (render: /runs/{{workflow.uid}}), so giving it is refused
    declared = {k: v for k, v in params.items() if not (cluster and k == "run-dir")}
    tasks.append(Task(PARAMS_TASK, step="params", gate="gate0",
                      args=gate_args("params", given=ALL_PARAMETERS, allowed=tuple(
                          f"{k}={('list-of:' if k == 'engines' else 'one-of:') + '|'.join(v[1]) if v[1] else PARAMETER_RULES[k]}"
                          for k, v in declared.items()))))
    first = _ok(PARAMS_TASK)
    if cluster:
        for i, node in enumerate(nodes):
            pw = f"prewarm-{i}"
            if not nightly:
                tasks.append(Task(pw, step="prewarm", gate="gate0", node=node, depends=first,
                                  when=When.equals(refs.parameter("prewarm"), True)))
            pf = preflight_task(i)
            tasks.append(Task(pf, step="preflight", gate="gate0", node=node,
                              depends=first if nightly else _ok(pw, skipped=True)))
            pre_names.append(pf)
    else:
        tasks.append(Task("prewarm", step="prewarm", gate="gate0", depends=first))
        tasks.append(Task(preflight_task(), step="preflight", gate="gate0", depends=_ok("prewarm")))
        pre_names.append(preflight_task())
    join = pre_names
    if cluster:
        tasks.append(Task("preflight-compare", step="preflight-compare", gate="gate0",
                          depends=_ok(*pre_names), args=gate_args("preflight-compare", inputs=tuple(
                              str(RunLayout(PurePosixPath(RUN_DIR)).task_dir(p)) for p in pre_names))))
        join = ["preflight-compare"]
    for engine in order:
        tasks.append(Task(f"engine-check-{engine}", step="engine-check", gate="gate0",
                          args=gate_args("engine-check", engine=engine), depends=_ok(*join), when=engines_is[engine]))
    checks = [f"engine-check-{e}" for e in order]
    gate1: list[str] = []
    if cluster:
        # once, after every engine check was decided, whatever its verdict: an engine whose check failed stops
        # its own sequence only (each sequence needs its own check below), not the other engine's
        for i, node in enumerate(nodes):
            t = nodes_task(i)
            tasks.append(Task(t, step="nodes", gate="gate1", node=node, depends=tuple(Need(c, REACHED) for c in checks),
                              args=gate_args("nodes", node=node), outputs=("socket_ifname", "nccl_env")))
            gate1.append(t)
        # each node's resolved NCCL/GLOO env (steps/cluster/fabric.py) in, the set of them out to every deploy
        tasks.append(Task("network", step="network", gate="gate1", depends=_ok(*gate1), outputs=("nccl_env",),
                          args=gate_args("network", nccl_env=tuple(f"{node}={refs.output(nodes_task(i), 'nccl_env')}"
                                                                   for i, node in enumerate(nodes)))))
        gate1 = ["network"]
    pulls = _pulls(profile, nodes, engines_is, order) if cluster else {}
    tasks += [t for e in order for t in pulls.get(e, ())]
    # each engine's sequence after Gate 1 and its own engine check, and after the sequence before it whatever
    # happened there (its teardown ran: the GPUs are free; one engine's failure does not stop the other's)
    sequences: list[str] = []
    for engine in order:
        # its image pulled on every pool node first (a skipped pull: the engine does not run)
        pulled = _ok(*(t.name for t in pulls.get(engine, ())), skipped=True)
        tasks.append(Task(engine, dag=ENGINE_SEQUENCE, gate="gate7" if profile.engine(engine).role != "baseline"
                          else "gate2-6", depends=(*_ok(*gate1), Need(f"engine-check-{engine}", SUCCEEDED_OR_SKIPPED),
                                                   *pulled, *(Need(s, ANY_OUTCOME) for s in sequences[-1:])),
                          inputs={"engine": engine, **({NCCL_ENV_INPUT: str(refs.output("network", "nccl_env"))}
                                                       if cluster else {})},
                          when=engines_is[engine]))
        sequences.append(engine)
    # regress and report run whatever happened in Gate 0, Gate 1 and the sequences, once the parameters are valid
    # (they read the results store): regress judges what was measured; each fails when a task before it did not
    # pass. The report is the leaf Argo judges the workflow by: it writes the report, then fails when regress
    # found a regression or a task before it did not pass (naming each).
    tasks.append(Task("regress", step="regress", gate="report",
                      depends=(*_ok(PARAMS_TASK), *(Need(s, ANY_OUTCOME) for s in sequences)),
                      args=gate_args("regress", upstream=_statuses(tasks))))
    tasks.append(Task("report", step="report", gate="report", depends=(*_ok(PARAMS_TASK), Need("regress", ANY_OUTCOME)),
                      args=gate_args("report", regress_verdict=refs.output("regress", "verdict"), run=run,
                                     upstream=_statuses(tasks))))
    exit_handler = Task(CLEANUP_TASK, step="cleanup", gate="exit",
                        args=gate_args("cleanup", workflow_status=refs.workflow("status"),
                                       failures=refs.workflow("failures")))
    return _with_timeouts(profile, Graph(profile.name, Dag("main", tuple(tasks)),
                                         (_engine_sequence(profile, cluster, run),), exit_handler, params, run))


def _pulls(profile: Profile, nodes: list[str], engines_is: Mapping[EngineName, When],
           order: list[EngineName]) -> dict[str, list[Task]]:
    """Gate 1's pulls: per engine, one ``pull-<engine>-<i>`` per pool node, run in that engine's image pinned to
    that node (steps/gates/pull.py), so every rank of it starts from an image its node holds: the engine's
    ranks then start within one weight load of each other, not one image pull apart. After the engine's own
    check (its image knows the plan), skipped where the ``engines`` parameter does not run the engine; beside
    the node and network probes (they hold no GPU). The bench image needs none: ``nodes-<i>`` runs in it on every
    pool node (its NEEDS.image)."""
    return {e: [Task(f"pull-{e}-{i}", step="pull", gate="gate1", node=node,
                     depends=(Need(f"engine-check-{e}", SUCCEEDED_OR_SKIPPED),),
                     when=engines_is[e], args=gate_args("pull", engine=e, node=node), timeout_s=PULL_DEADLINE_S)
                for i, node in enumerate(nodes)] for e in order}


def _parameters(profile: Profile, order: list[EngineName], prewarm: bool = True
                ) -> dict[str, tuple[str, tuple[str, ...] | None, str]]:
    """The workflow's parameters: name -> (default, enum, description); one without an enum has a
    PARAMETER_RULES entry (the params step checks every value given against one or the other). ``order``: the
    engines the run may start; ``prewarm`` False: no prewarm parameter (the cluster's nightly has no prewarm)."""
    params: dict[str, tuple[str, tuple[str, ...] | None, str]] = {
        "engines": ("both" if len(order) > 1 else order[0],
                    ("both", *order) if len(order) > 1 else (order[0],),
                    "which engine sequences run: the baseline, the experimental engine, or both"),
        # a profile that names no model.source_path has nothing to copy: prewarm=true is refused at submit's
        # first step (params) and offered nowhere in the UI, instead of failing at prewarm after Gate 0 began
        "prewarm": (("false", ("false", "true"), "copy the model from CFS to each node's NVMe cache first")
                    if profile.model.source_path else
                    ("false", ("false",), "copy the model to each node's NVMe cache first: not on this profile "
                                          "(it names no model.source_path)")),
        "run-dir": (f"/runs/{refs.workflow('uid')}", None, "where every gate writes its evidence"),
        "results-uri": (profile.results_uri, None, "results store (pyarrow filesystem URI)"),
        "retry-backoff": ("30s", None, "first wait before Argo retries a step that exited 75 (then x2 per retry)"),
    }
    if not prewarm:
        del params["prewarm"]
    missing = sorted(k for k, v in params.items() if not v[1] and k not in PARAMETER_RULES)
    if missing:
        raise ValueError(f"parameters {missing}: neither an enum nor a PARAMETER_RULES entry")
    return params


def _with_timeouts(profile: Profile, graph: Graph) -> Graph:
    """The profile's ``timeouts_s`` (task name -> seconds) set on every task of that name; UsageError for a
    name no task of the qualification has."""
    names = {t.name for d in graph.dags for t in d.tasks if t.step} | {graph.exit_handler.name}
    unknown = sorted(set(profile.timeouts_s) - names)
    # the qualification holds every task: a name only it has is no error in the nightly
    if unknown and graph.run == "qualification":
        raise UsageError(f"profile {profile.name}: timeouts_s names {', '.join(unknown)}, no task of its graph "
                         f"(tasks: {', '.join(sorted(names))})")
    if not profile.timeouts_s:
        return graph

    def timed(t: Task) -> Task:
        return replace(t, timeout_s=profile.timeouts_s.get(t.name, t.timeout_s))

    def dag(d: Dag) -> Dag:
        return Dag(d.name, tuple(timed(t) for t in d.tasks), d.inputs)

    return replace(graph, main=dag(graph.main), sequences=tuple(dag(d) for d in graph.sequences),
                   exit_handler=timed(graph.exit_handler))
