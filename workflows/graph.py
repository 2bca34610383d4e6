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
  ``runs/<run-id>`` locally);
- a step's output parameters are files under ``<out>/outputs/`` (``verdict`` always);
- in an engine sequence, later gates get ``--endpoint`` from the deploy task's
  ``endpoint`` output and ``--engine`` from the sequence's input.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from gauntlet.contract import UsageError, param_name
from gauntlet.params.models import Profile
from gauntlet.steps.regress import DEFAULT_RULE
from gauntlet.workflows import refs
from gauntlet.workflows.refs import Ref

__all__ = ["Task", "Dag", "Graph", "Need", "When", "ConditionError", "build_graph", "ORCHESTRATORS", "Orchestrator", "PHASES",
           "SUCCEEDED", "SUCCEEDED_OR_SKIPPED", "SUCCEEDED_OR_FAILED", "RUN_DIR", "ENGINE_SEQUENCE",
           "RETRY_LIMIT"]

# which back end runs the graph (not where the engine runs: that is gauntlet.steps.backends)
Orchestrator = Literal["argo", "local"]
ORCHESTRATORS: tuple[Orchestrator, ...] = ("argo", "local")
RUN_DIR = str(refs.parameter("run-dir"))
ENGINE_SEQUENCE = "engine-sequence"
# The step image built on the pinned vLLM image: the one bench client, CUDA torch for the GPU probe.
BENCH_IMAGE = "steps-vllm"
# Every step's retry policy, on both back ends: only exit gauntlet.contract.EXIT_TRANSIENT (a transient
# infrastructure error) is retried, at most RETRY_LIMIT more times; a failed verdict (exit 1) is a result, never retried.
RETRY_LIMIT = 3

# The phases Argo's `depends` can ask of an upstream task.
PHASES = ("Succeeded", "Failed", "Errored", "Skipped", "Omitted", "Daemoned")
SUCCEEDED = ("Succeeded",)
SUCCEEDED_OR_SKIPPED = ("Succeeded", "Skipped")      # an optional predecessor: its when may be false
SUCCEEDED_OR_FAILED = ("Succeeded", "Failed")        # runs on either verdict (report after regress)


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
    ``one-of`` is true when one of ``value``'s words matches the text (Argo's regex ``=~``).
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
            return re.search("|".join(self.value), text) is not None
        return text == self.value

    def __str__(self) -> str:
        if self.op == "one-of":
            return f"{self.subject.path} one of {'|'.join(self.value)}"
        value = ("true" if self.value else "false") if isinstance(self.value, bool) else repr(self.value)
        return f"{self.subject.path} == {value}"


@dataclass(frozen=True)
class Task:
    """One node of a DAG: a `gauntlet step` container, or a call of another DAG template."""

    name: str
    step: str | None = None                 # gauntlet step name; None when `dag` is set
    dag: str | None = None                  # name of a DAG template to call
    args: tuple[str, ...] = ()              # extra CLI args; may hold references (workflows/refs.py)
    depends: tuple[Need, ...] = ()          # all must be met, else the task is Omitted
    when: When | None = None                # false: the task is Skipped
    node: str | None = None                 # pin the pod to this node
    image: str = "steps"                    # key into images/engines.yaml
    outputs: tuple[str, ...] = ()           # output parameter names beyond `verdict`
    inputs: dict[str, str] = field(default_factory=dict)  # DAG call arguments
    gate: str = ""                          # the plan's gate label (gate0..gate7, exit)
    timeout_s: int | None = None
    host_network: bool = False              # see the node's own NICs (Gate 1)

    @property
    def upstream(self) -> tuple[str, ...]:
        """The tasks this one depends on."""
        return tuple(n.task for n in self.depends)


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

    @property
    def dags(self) -> tuple[Dag, ...]:
        return (self.main, *self.sequences)

    def dag(self, name: str) -> Dag:
        return next(d for d in self.dags if d.name == name)


def _ok(*tasks: str, skipped: bool = False) -> tuple[Need, ...]:
    return tuple(Need(t, SUCCEEDED_OR_SKIPPED if skipped else SUCCEEDED) for t in tasks)


def _engine_sequence(profile: Profile) -> Dag:
    """Gates 2-6 for one engine, then teardown. The engine is the DAG's input."""
    eng = str(refs.input_param("engine"))
    endpoint = str(refs.output("deploy", "endpoint"))
    common = ("--engine", eng, "--endpoint", endpoint)
    # One client for every engine: `vllm bench serve` from the vLLM image, on a pool node whose
    # NVMe cache holds the tokenizer (the model is never read over the network file system).
    bench = {"image": BENCH_IMAGE, "node": profile.hardware.nodes[0].name if profile.hardware.nodes else None}
    tasks: list[Task] = [
        Task("deploy", step="deploy", gate="gate2", args=("--engine", eng), outputs=("endpoint",),
             timeout_s=max(e.startup_timeout_s for e in profile.engines.values()) + 600),
        Task("smoke", step="smoke", gate="gate3", args=common, depends=_ok("deploy")),
    ]
    base_cases = [c for c in profile.bench.cases if c.requires_stable is None]
    gated_cases = [c for c in profile.bench.cases if c.requires_stable is not None]
    tasks.append(Task("perf", step="perf", gate="gate4", depends=_ok("smoke"), **bench,
                      args=(*common, "--cases", ",".join(c.name for c in base_cases)),
                      outputs=tuple(f"unlock_{param_name(c.name)}" for c in gated_cases)))
    last = "perf"
    for c in gated_cases:
        name = f"perf-{c.name}"
        tasks.append(Task(name, step="perf", gate="gate4", depends=_ok(last, skipped=last != "perf"), **bench,
                          when=When.equals(refs.output("perf", f"unlock_{param_name(c.name)}"), True),
                          args=(*common, "--cases", c.name)))
        last = name
    # Confirm before alarm (docs/regression.md): while this engine is still up, the nightly's suspicion
    # is measured again on fresh rounds of the same requests; regress then labels only a confirmed one.
    tasks.append(Task("suspect", step="regress", gate="gate4", depends=_ok(last, skipped=last != "perf"),
                      args=("--engine", eng, "--stage", "suspect"), outputs=("suspect", "suspect_cases")))
    tasks.append(Task("confirm", step="perf", gate="gate4", depends=_ok("suspect"), **bench,
                      when=When.equals(refs.output("suspect", "suspect"), "true"),
                      args=(*common, "--cases", str(refs.output("suspect", "suspect_cases")),
                            "--phase", "confirm", "--rounds", str(DEFAULT_RULE.confirm_rounds))))
    after_perf = _ok("confirm", skipped=True)      # Skipped: nothing suspected
    base_rungs = [r for r in profile.longctx.ladder if not r.requires_all_lower]
    gated_rungs = [r for r in profile.longctx.ladder if r.requires_all_lower]
    tasks.append(Task("longctx", step="longctx", gate="gate5", depends=after_perf,
                      args=(*common, "--rungs", ",".join(str(r.tokens) for r in base_rungs)),
                      outputs=("unlock_all_lower",)))
    last = "longctx"
    for r in gated_rungs:
        name = f"longctx-{r.tokens}"
        tasks.append(Task(name, step="longctx", gate="gate5", depends=_ok(last, skipped=last != "longctx"),
                          when=When.equals(refs.output("longctx", "unlock_all_lower"), True),
                          args=(*common, "--rungs", str(r.tokens))))
        last = name
    prev_ok = _ok(last, skipped=last != "longctx")
    # Gate 6: one variant per restart; the experiment step redeploys the variant itself.
    for v in profile.experiments:
        name = f"exp-{v.name}"
        when = When.equals(refs.input_param("engine"), v.engine) if v.engine is not None else None
        tasks.append(Task(name, step="experiment", gate="gate6", depends=prev_ok, when=when, **bench,
                          args=("--engine", eng, "--variant", v.name, "--baseline-endpoint", endpoint)))
        prev_ok = _ok(name, skipped=True)
    tasks.append(Task("teardown", step="teardown", gate="gate2", depends=prev_ok, args=("--engine", eng)))
    return Dag(ENGINE_SEQUENCE, tuple(tasks), inputs=("engine",))


def build_graph(profile: Profile, backend: Orchestrator) -> Graph:
    """The whole plan for one profile, as data, for the back end that runs it.

    ``"argo"`` (a ``kubernetes`` profile): per node an optional prewarm (the ``prewarm`` parameter) and a
    preflight, their comparison, then Gate 1's node and network checks before any engine starts.
    ``"local"`` (a ``local`` profile): the model is prepared, then one preflight. A profile runs on its
    own back end only (UsageError): a kubernetes profile's engines must not start without Gate 1.
    """
    if backend not in ORCHESTRATORS:
        raise ValueError(f"backend {backend!r}: one of {', '.join(ORCHESTRATORS)}")
    cluster = backend == "argo"
    if profile.hardware.kind != ("kubernetes" if cluster else "local"):
        raise UsageError(f"profile {profile.name} has hardware.kind {profile.hardware.kind!r}: "
                         + (f"no Argo graph (run it with `gauntlet run --profile {profile.name}`)" if cluster else
                            f"it runs on the cluster (`gauntlet render`/`submit --profile {profile.name}`), "
                            "not with the local back end"))
    nodes = [n.name for n in profile.hardware.nodes] if cluster else []
    engines_is = {e: When.one_of(refs.parameter("engines"), e, "both") for e in profile.engine_order()}
    tasks: list[Task] = []
    pre_names: list[str] = []

    if cluster:
        for i, node in enumerate(nodes):
            pw = f"prewarm-{i}"
            tasks.append(Task(pw, step="prewarm", gate="gate0", node=node,
                              when=When.equals(refs.parameter("prewarm"), True)))
            pf = f"preflight-{i}"
            tasks.append(Task(pf, step="preflight", gate="gate0", node=node, depends=_ok(pw, skipped=True)))
            pre_names.append(pf)
    else:
        tasks.append(Task("prewarm", step="prewarm", gate="gate0"))
        tasks.append(Task("preflight", step="preflight", gate="gate0", depends=_ok("prewarm")))
        pre_names.append("preflight")
    join = pre_names
    if cluster:
        tasks.append(Task("preflight-compare", step="preflight-compare", gate="gate0",
                          depends=_ok(*pre_names), args=("--inputs", *(f"{RUN_DIR}/{p}" for p in pre_names))))
        join = ["preflight-compare"]
    for engine in profile.engine_order():
        tasks.append(Task(f"engine-check-{engine}", step="engine-check", gate="gate0", image=profile.engines[engine].image,
                          args=("--engine", engine), depends=_ok(*join), when=engines_is[engine]))
    checks = [f"engine-check-{e}" for e in profile.engine_order()]
    gate1: list[str] = []
    if cluster:
        for i, node in enumerate(nodes):
            t = f"nodes-{i}"
            tasks.append(Task(t, step="nodes", gate="gate1", node=node, depends=_ok(*checks, skipped=True),
                              args=("--node", node),
                              image=BENCH_IMAGE, host_network=True))
            gate1.append(t)
        tasks.append(Task("network", step="network", gate="gate1", depends=_ok(*gate1)))
        gate1 = ["network"]
    prev = gate1 or checks
    prev_skippable = not gate1
    for engine in profile.engine_order():
        tasks.append(Task(engine, dag=ENGINE_SEQUENCE, gate="gate7" if profile.engines[engine].role != "baseline"
                          else "gate2-6", inputs={"engine": engine}, depends=_ok(*prev, skipped=prev_skippable),
                          when=engines_is[engine]))
        prev, prev_skippable = [engine], True
    tasks.append(Task("regress", step="regress", gate="report", depends=_ok(*prev, skipped=True)))
    # the leaf Argo judges the workflow by: it fails (after writing the report) when regress did not pass
    tasks.append(Task("report", step="report", gate="report", depends=(Need("regress", SUCCEEDED_OR_FAILED),),
                      args=("--regress-verdict", str(refs.output("regress", "verdict")))))
    exit_handler = Task("cleanup", step="cleanup", gate="exit",
                        args=("--workflow-status", str(refs.workflow("status")),
                              "--failures", str(refs.workflow("failures"))))
    params = {
        "engines": ("both" if len(profile.engines) > 1 else profile.baseline_engine,
                    ("both", *profile.engine_order()) if len(profile.engines) > 1 else (profile.baseline_engine,),
                    "which engine sequences run: the baseline, the experimental engine, or both"),
        "prewarm": ("false", ("false", "true"), "copy the model from CFS to each node's NVMe cache first"),
        "run-dir": (f"/runs/{refs.workflow('uid')}", None, "where every gate writes its evidence"),
        "results-uri": (profile.results_uri, None, "results store (pyarrow filesystem URI)"),
        "retry-backoff": ("30s", None, "first wait before Argo retries a step that exited 75 (then x2 per retry)"),
    }
    return Graph(profile.name, Dag("main", tuple(tasks)), (_engine_sequence(profile),), exit_handler, params)
