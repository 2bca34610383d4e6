"""The gate graph as plain data: the one source of truth both back ends read.

:func:`build_graph` turns a profile into a :class:`Graph` of DAG templates.
The Argo renderer (:mod:`gauntlet.workflows.render`) turns it into a WorkflowTemplate;
the local runner (:mod:`gauntlet.workflows.local`) walks the same tasks, in the same
order, with the same ``depends``/``when`` rules and the same exit handler.

Conventions every step relies on:

- each task runs ``gauntlet step <step> --profile <profile> --out <RUN>/<task-path>``
  where ``<RUN>`` is ``/runs/{{workflow.uid}}`` on Argo and ``runs/<run-id>`` locally;
- a step's output parameters are files under ``<out>/outputs/`` (``verdict`` always);
- in an engine sequence, later gates get ``--endpoint`` from the deploy task's
  ``endpoint`` output and ``--engine`` from the sequence's input.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gauntlet.contract import param_name
from gauntlet.params.models import Profile
from gauntlet.steps.regress import DEFAULT_RULE

__all__ = ["Task", "Dag", "Graph", "build_graph", "param_name", "RUN_DIR", "ENGINE_SEQUENCE",
           "ENGINES_CHOICES",
           "TRANSIENT_EXIT", "RETRY_LIMIT"]

RUN_DIR = "{{workflow.parameters.run-dir}}"
ENGINE_SEQUENCE = "engine-sequence"
ENGINES_CHOICES = ("both", "sglang", "vllm")
# The step image built on the pinned vLLM image: the one bench client, CUDA torch for the GPU probe.
BENCH_IMAGE = "steps-vllm"
# Every step's retry policy, on both back ends: only exit 75 (a transient infrastructure error) is
# retried, at most RETRY_LIMIT more times; a failed verdict (exit 1) is a result, never retried.
TRANSIENT_EXIT = 75
RETRY_LIMIT = 3


@dataclass(frozen=True)
class Task:
    """One node of a DAG: a `gauntlet step` container, or a call of another DAG template."""

    name: str
    step: str | None = None                 # gauntlet step name; None when `dag` is set
    dag: str | None = None                  # name of a DAG template to call
    args: tuple[str, ...] = ()              # extra CLI args; may hold {{...}} references
    depends: str | None = None              # Argo depends expression
    when: str | None = None                 # Argo when expression
    gpus: int = 0                           # nvidia.com/gpu requested by the step's own pod
    node: str | None = None                 # pin the pod to this node
    image: str = "steps"                    # key into images/engines.yaml, or "{{inputs.parameters.engine}}"
    outputs: tuple[str, ...] = ()           # output parameter names beyond `verdict`
    inputs: dict[str, str] = field(default_factory=dict)  # DAG call arguments
    gate: str = ""                          # the plan's gate label (gate0..gate7, exit)
    cluster_only: bool = False              # not run by the local back end
    local_only: bool = False                # not rendered for Argo
    timeout_s: int | None = None
    host_network: bool = False              # see the node's own NICs (Gate 1)


@dataclass(frozen=True)
class Dag:
    name: str
    tasks: tuple[Task, ...]
    inputs: tuple[str, ...] = ()

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


def _ok(*tasks: str, skipped: bool = False) -> str:
    if skipped:
        return " && ".join(f"({t}.Succeeded || {t}.Skipped)" for t in tasks)
    return " && ".join(f"{t}.Succeeded" for t in tasks)


def _engine_sequence(profile: Profile) -> Dag:
    """Gates 2-6 for one engine, then teardown. The engine is the DAG's input."""
    eng = "{{inputs.parameters.engine}}"
    endpoint = "{{tasks.deploy.outputs.parameters.endpoint}}"
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
                          when=f"{{{{tasks.perf.outputs.parameters.unlock_{param_name(c.name)}}}}} == true",
                          args=(*common, "--cases", c.name)))
        last = name
    # Confirm before alarm (docs/regression.md): while this engine is still up, the nightly's suspicion
    # is measured again on fresh rounds of the same requests; regress then labels only a confirmed one.
    tasks.append(Task("suspect", step="regress", gate="gate4", depends=_ok(last, skipped=last != "perf"),
                      args=("--engine", eng, "--stage", "suspect"), outputs=("suspect", "suspect_cases")))
    tasks.append(Task("confirm", step="perf", gate="gate4", depends=_ok("suspect"), **bench,
                      when="'{{tasks.suspect.outputs.parameters.suspect}}' == 'true'",
                      args=(*common, "--cases", "{{tasks.suspect.outputs.parameters.suspect_cases}}",
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
                          when="{{tasks.longctx.outputs.parameters.unlock_all_lower}} == true",
                          args=(*common, "--rungs", str(r.tokens))))
        last = name
    prev_ok = _ok(last, skipped=last != "longctx")
    # Gate 6: one variant per restart; the experiment step redeploys the variant itself.
    for v in profile.experiments:
        name = f"exp-{v.name}"
        when = None
        if v.engine is not None:
            when = f"'{eng}' == '{v.engine}'"
        tasks.append(Task(name, step="experiment", gate="gate6", depends=prev_ok, when=when, **bench,
                          args=("--engine", eng, "--variant", v.name, "--baseline-endpoint", endpoint)))
        prev_ok = _ok(name, skipped=True)
    tasks.append(Task("teardown", step="teardown", gate="gate2", depends=prev_ok, args=("--engine", eng)))
    return Dag(ENGINE_SEQUENCE, tuple(tasks), inputs=("engine",))


def build_graph(profile: Profile) -> Graph:
    """The whole plan for one profile, as data."""
    cluster = profile.hardware.kind == "kubernetes"
    nodes = [n.name for n in profile.hardware.nodes] if cluster else []
    tasks: list[Task] = []
    pre_names: list[str] = []

    if cluster:
        for i, node in enumerate(nodes):
            pw = f"prewarm-{i}"
            tasks.append(Task(pw, step="prewarm", gate="gate0", node=node, cluster_only=True,
                              when="{{workflow.parameters.prewarm}} == true"))
            pf = f"preflight-{i}"
            tasks.append(Task(pf, step="preflight", gate="gate0", node=node, depends=_ok(pw, skipped=True)))
            pre_names.append(pf)
    else:
        tasks.append(Task("prewarm", step="prewarm", gate="gate0", local_only=True))
        tasks.append(Task("preflight", step="preflight", gate="gate0", depends=_ok("prewarm")))
        pre_names.append("preflight")
    join = pre_names
    if cluster:
        tasks.append(Task("preflight-compare", step="preflight-compare", gate="gate0",
                          depends=_ok(*pre_names), args=("--inputs", *(f"{RUN_DIR}/{p}" for p in pre_names))))
        join = ["preflight-compare"]
    for engine in profile.engine_order():
        tasks.append(Task(f"engine-check-{engine}", step="engine-check", gate="gate0", image=profile.engines[engine].image,
                          args=("--engine", engine), depends=_ok(*join),
                          when=f"'{{{{workflow.parameters.engines}}}}' =~ '{engine}|both'"))
    checks = [f"engine-check-{e}" for e in profile.engine_order()]
    gate1: list[str] = []
    if cluster:
        for i, node in enumerate(nodes):
            t = f"nodes-{i}"
            tasks.append(Task(t, step="nodes", gate="gate1", node=node, depends=_ok(*checks, skipped=True),
                              args=("--node", node), cluster_only=True, gpus=profile.hardware.gpus_per_node,
                              image=BENCH_IMAGE, host_network=True))
            gate1.append(t)
        tasks.append(Task("network", step="network", gate="gate1", depends=_ok(*gate1), cluster_only=True))
        gate1 = ["network"]
    prev = gate1 or checks
    prev_skippable = not gate1
    for engine in profile.engine_order():
        tasks.append(Task(engine, dag=ENGINE_SEQUENCE, gate="gate7" if profile.engines[engine].role != "baseline"
                          else "gate2-6", inputs={"engine": engine}, depends=_ok(*prev, skipped=prev_skippable),
                          when=f"'{{{{workflow.parameters.engines}}}}' =~ '{engine}|both'"))
        prev, prev_skippable = [engine], True
    tasks.append(Task("regress", step="regress", gate="report", depends=_ok(*prev, skipped=True)))
    # the leaf Argo judges the workflow by: it fails (after writing the report) when regress did not pass
    tasks.append(Task("report", step="report", gate="report", depends="regress.Succeeded || regress.Failed",
                      args=("--regress-verdict", "{{tasks.regress.outputs.parameters.verdict}}")))
    exit_handler = Task("cleanup", step="cleanup", gate="exit",
                        args=("--workflow-status", "{{workflow.status}}",
                              "--failures", "{{workflow.failures}}"))
    params = {
        "engines": ("both" if len(profile.engines) > 1 else profile.baseline_engine,
                    ENGINES_CHOICES if len(profile.engines) > 1 else (profile.baseline_engine,),
                    "which engine sequences run: the baseline, the experimental engine, or both"),
        "prewarm": ("false", ("false", "true"), "copy the model from CFS to each node's NVMe cache first"),
        "run-dir": ("/runs/{{workflow.uid}}", None, "where every gate writes its evidence"),
        "results-uri": (profile.results_uri, None, "results store (pyarrow filesystem URI)"),
        "retry-backoff": ("30s", None, "first wait before Argo retries a step that exited 75 (then x2 per retry)"),
    }
    return Graph(profile.name, Dag("main", tuple(tasks)), (_engine_sequence(profile),), exit_handler, params)
