"""`gauntlet plan`: the run's schedule before anyone submits it (pure arithmetic over a Graph and its Profile).

Every task of the graph gets an estimated duration from the profile's rates, keyed by its **step**
(:data:`ESTIMATES`; a step without an entry is a :class:`PlanError` naming it, so a new gate is a one-line
addition). The plan is the longest run the template allows: ``prewarm=true``, ``engines=both``, every
gated case and rung unlocked, the confirm stage re-measuring every case, every variant run. Tasks start
when their upstream tasks end (per-node tasks in parallel, the engine sequences in series); each is
compared with its deadline (``timeout_s``, the template's ``activeDeadlineSeconds``) and the whole with the
workflow's (``active_deadline_s``).

The model (docs/plan.md):

- a load (deploy, a variant, a long-context restart) reads ``weight_bytes / nodes`` on each node at
  ``hardware.storage.read_gbps`` (the nodes in parallel), then ``engines.E.plan.init_s``;
- a bench case of ``n`` prompts at concurrency ``C`` runs ``ceil(n / C)`` waves, each ``C x input`` tokens
  of prefill at ``prefill_tps`` and ``output`` tokens at ``decode_tps`` per stream; a case listed in
  ``engines.E.plan.case_tps`` takes ``prompts x (input + output) / case_tps`` instead. Per case: the
  client's ceiling run, the warmup, ``rounds`` rounds; a cold first round (which measures again) is not
  counted;
- a long-context rung: one restart when it is above the deployed ``context_length`` (up to
  ``max_position_embeddings``; a rung above that is refused at once): the engine stopped (the teardown
  figure) and loaded again, then per needle depth its prefill and the whole reply budget (the answer and a
  reasoning model's thinking, steps/gates/longctx.py ``reply_budget``); a vLLM rung at or above
  ``longctx_blocked_from_tokens`` is skipped;
- a Gate 6 variant: one load, Gate 3's requests (its content checks), then each of its phases re-runs the
  Gate 4 base cases, plus the baseline's extra phases for a prefix-cache variant; the variant uses its
  engine's rates.

GPUs held: the engine's (``gpus_per_node x nodes``) from deploy to teardown, every GPU of its node for a
``nodes-*`` probe and of the pool for ``network``; none in Gate 0 or the report. ``gpu_h_spent`` at a task
is the GPU-hours the run has spent when that task ends: what a failure found there costs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from gauntlet.contract import UsageError
from gauntlet.params.models import BenchCase, Profile
from gauntlet.steps.gates.experiment import phase_plan
from gauntlet.steps.gates.experiment_baseline import variants_for
from gauntlet.steps.gates.longctx import blocked_reason, plan_context, reply_budget
from gauntlet.steps.gates.perf import climb_cases
from gauntlet.workflows.graph import DEFAULT_TIMEOUT_S, Graph, Orchestrator, Run, Task, build_graph

__all__ = ["Assumption", "Row", "Plan", "PlanError", "ESTIMATES", "plan_profile", "plan_graph", "too_short",
           "format_table", "format_plans", "suggested_timeout", "image_fixes"]


class PlanError(UsageError):
    """The plan cannot be made: a step with no estimate, a missing figure; one line."""


@dataclass(frozen=True)
class Assumption:
    name: str
    value: float
    unit: str
    source: str          # the profile field it came from, or "default: why"


@dataclass(frozen=True)
class Row:
    path: str            # task, or <engine>/<task> inside an engine sequence
    step: str
    gate: str
    seconds: float
    deadline_s: int
    start_s: float
    gpus: int
    gpu_h_spent: float   # when this task ends
    detail: str

    @property
    def end_s(self) -> float:
        return self.start_s + self.seconds


@dataclass(frozen=True)
class Plan:
    profile: str
    orchestrator: str
    rows: tuple[Row, ...]
    total_s: float
    workflow_deadline_s: int
    gpu_h_total: float
    assumptions: tuple[Assumption, ...]
    notes: tuple[str, ...] = ()
    run: str = "qualification"
    gpu_h_budget: float | None = None    # the nightly's nightly.gpu_hours (None: no budget but the window)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for r, row in zip(d["rows"], self.rows):
            r["end_s"] = row.end_s
            r["suggested_timeout_s"] = suggested_timeout(row.seconds)
        d["suggested_active_deadline_s"] = suggested_timeout(self.total_s)
        return d


# Margin for a deadline set from the plan: 1.5x the estimate, rounded up to the next half hour.
MARGIN = 1.5
ROUND_S = 1800


def suggested_timeout(seconds: float) -> int:
    """A deadline from an estimate: :data:`MARGIN` times it, up to the next :data:`ROUND_S` (docs/plan.md)."""
    return max(ROUND_S, math.ceil(seconds * MARGIN / ROUND_S) * ROUND_S)


# ---- rates: each from the profile when it states it, else a default whose reason is printed

# (value, why) per orchestrator. argo: a cluster pod's start, the step, its evidence; local: docs/performance.md
# (`make run` on the 2-core VM: engine-check 11.2 s importing vLLM, every other small step under 3 s).
_FIXED: dict[str, dict[str, tuple[float, str]]] = {
    "argo": {
        "preflight": (120, "pod start + headers of every shard on NVMe (0.6 s on the 96-shard layout locally)"),
        "preflight-compare": (60, "pod start + two JSON files"),
        "engine-check": (600, "engine image pull on a cold node + importing the engine"),
        "nodes": (600, "GPU probe: HBM copy, BF16 matmul, 1-rank NCCL on every GPU"),
        "network": (900, "NCCL probe Jobs: every node alone, then across nodes"),
        "pull": (600, "engine image pull on a cold node (steps/gates/pull.py), beside the probes"),
        "regress": (120, "pod start + the results store (2.1 s for 1,000 rounds locally)"),
        "report": (120, "pod start + report.md and plots"),
        "teardown": (300, "logs saved, StatefulSet scaled to 0, pods gone"),
        "cleanup": (300, "logs, scale to 0, delete by the run label"),
        "smoke": (60, "pod start, on top of its requests"),
        "client": (60, "bench client start and tokenizer load, once per step"),
        "ceiling": (15, "the client's ceiling run against a zero-cost server, per case"),
        "refused": (5, "a rung over max_position_embeddings: a 4xx at once"),
    },
    "local": {
        "prewarm": (1, "the model prepared already (0.46 s; 30 s the first time)"),
        "preflight": (3, "docs/performance.md: make run, every small step under 3 s"),
        "engine-check": (12, "docs/performance.md: make run, 11.2 s importing vLLM"),
        "regress": (3, "docs/performance.md: 2.1 s for 1,000 rounds"),
        "report": (3, "docs/performance.md: 2.1 s for 1,000 rounds"),
        "teardown": (3, "docs/performance.md: make run, every small step under 3 s"),
        "cleanup": (3, "docs/performance.md: make run, every small step under 3 s"),
        "smoke": (1, "process start, on top of its requests"),
        "client": (8, "docs/performance.md: importing the bench client, 7.8 s"),
        "ceiling": (1, "docs/performance.md: the ceiling run, 20 to 60 ms of requests"),
        "refused": (1, "a 4xx at once"),
    },
}
_ENGINE_DEFAULTS: dict[str, dict[str, tuple[float, str]]] = {
    "argo": {"init_s": (900, "unmeasured guess for a large model: pod start, weight processing, graphs"),
             "prefill_tps": (2000, "unmeasured guess"), "decode_tps": (20, "unmeasured guess")},
    "local": {"init_s": (25, "docs/performance.md: vLLM CPU ready in 23.8 s"),
              "prefill_tps": (150, "unmeasured guess for a CPU engine"),
              "decode_tps": (20, "docs/performance.md: 42.8 out tok/s at concurrency 2")},
}
_STORAGE_DEFAULTS: dict[str, dict[str, tuple[float, str]]] = {
    "argo": {"read_gbps": (3.0, "one local PCIe 4.0 NVMe through safetensors, unmeasured: state yours"),
             "copy_gbps": (1.0, "a network file system to NVMe, unmeasured: state yours")},
    "local": {"read_gbps": (1.5, "docs/performance.md: prewarm copies 4 GB at 1.51 GB/s here"),
              "copy_gbps": (1.5, "docs/performance.md: prewarm copies 4 GB at 1.51 GB/s here")},
}
# Gate 3's requests (steps/gates/smoke.py): the arithmetic probes plus reasoning, tools, streaming, two-turn,
# image, refusals: each may think up to smoke.max_tokens.
_SMOKE_EXTRA_REQUESTS = 8


class _Rates:
    """The rates one plan uses, each recorded once with its source."""

    def __init__(self, profile: Profile, orch: Orchestrator) -> None:
        self.profile, self.orch = profile, orch
        self.used: dict[str, Assumption] = {}

    def _take(self, key: str, given: float | None, field_path: str, default: tuple[float, str], unit: str) -> float:
        if key not in self.used:
            if given is not None:
                self.used[key] = Assumption(key, float(given), unit, field_path)
            else:
                self.used[key] = Assumption(key, float(default[0]), unit, f"default: {default[1]}")
        return self.used[key].value

    def fixed(self, what: str) -> float:
        table = _FIXED[self.orch]
        if what not in table:
            return 0.0
        return self._take(f"{what} (s)", None, "", table[what], "s")

    def storage(self, what: str) -> float:
        st = self.profile.hardware.storage
        return self._take(f"hardware.storage.{what}", getattr(st, what), f"hardware.storage.{what}",
                          _STORAGE_DEFAULTS[self.orch][what], "GB/s per node")

    def engine(self, engine: str, what: str) -> float:
        p = self.profile.engines[engine].plan  # type: ignore[index]
        unit = {"init_s": "s", "prefill_tps": "tok/s", "decode_tps": "tok/s per stream"}[what]
        return self._take(f"engines.{engine}.plan.{what}", getattr(p, what), f"engines.{engine}.plan.{what}",
                          _ENGINE_DEFAULTS[self.orch][what], unit)

    def case_tps(self, engine: str, case: str) -> float | None:
        v = self.profile.engines[engine].plan.case_tps.get(case)  # type: ignore[index]
        if v is None:
            return None
        return self._take(f"engines.{engine}.plan.case_tps.{case}", v, f"engines.{engine}.plan.case_tps.{case}",
                          (0, ""), "tok/s (input+output)")


@dataclass(frozen=True)
class _Est:
    seconds: float
    detail: str


@dataclass
class _Ctx:
    profile: Profile
    rates: _Rates
    fixes: dict[str, list[str]]                              # engine -> fixes its image lists
    served: dict[str, int] = field(default_factory=dict)     # engine -> the context it serves now
    run: str = "qualification"

    @property
    def nodes(self) -> int:
        return max(1, len(self.profile.hardware.nodes))

    def load(self, engine: str) -> float:
        wb = self.profile.model.weight_bytes or 0
        read = wb / (self.nodes * self.rates.storage("read_gbps") * 1e9)
        return read + self.rates.engine(engine, "init_s")

    def case(self, engine: str, c: BenchCase, *, rounds: int, prefix_len: int = 0, warmup: bool = True) -> float:
        b = self.profile.bench
        n = c.num_prompts or b.prompts_per_concurrency * c.concurrency
        prompts = (b.warmup_prompts if warmup else 0) + rounds * n
        tps = self.rates.case_tps(engine, c.name)
        inp = c.input_len + prefix_len
        if tps is not None:
            body = prompts * (inp + c.output_len) / tps
        else:
            waves = math.ceil((b.warmup_prompts if warmup else 0) / c.concurrency) + rounds * math.ceil(n / c.concurrency)
            wave = (min(c.concurrency, n) * inp / self.rates.engine(engine, "prefill_tps")
                    + c.output_len / self.rates.engine(engine, "decode_tps"))
            body = waves * wave
        return self.rates.fixed("ceiling") + body


def _fixed(ctx: _Ctx, task: Task, engine: str | None) -> _Est:
    s = ctx.rates.fixed(task.step or "")
    return _Est(s, "fixed")


def _prewarm(ctx: _Ctx, task: Task, engine: str | None) -> _Est:
    if ctx.rates.orch == "local":
        return _fixed(ctx, task, engine)
    if not ctx.profile.model.source_path:
        return _Est(0.0, "never: the profile names no model.source_path (prewarm=false only)")
    wb = ctx.profile.model.weight_bytes or 0
    s = wb / (ctx.rates.storage("copy_gbps") * 1e9)
    return _Est(s, f"{wb / 1e12:.3g} TB copied to this node (only with prewarm=true)")


def _deploy(ctx: _Ctx, task: Task, engine: str | None) -> _Est:
    assert engine is not None
    return _Est(ctx.load(engine), "one load")


def _smoke(ctx: _Ctx, task: Task, engine: str | None) -> _Est:
    assert engine is not None
    sm = ctx.profile.smoke
    n = len(sm.arithmetic) + _SMOKE_EXTRA_REQUESTS
    s = ctx.rates.fixed("smoke") + n * sm.max_tokens / ctx.rates.engine(engine, "decode_tps")
    return _Est(s, f"{n} requests of up to {sm.max_tokens} tokens")


def _cases(ctx: _Ctx, task: Task) -> list[BenchCase]:
    names = task.flag("--cases")
    if names is None or "{{" in names:           # the confirm stage: whatever was suspected, at most every case
        return ctx.profile.nightly_cases() if ctx.run == "nightly" else list(ctx.profile.bench.cases)
    by = {c.name: c for c in ctx.profile.bench.cases}
    return [by[n] for n in names.split(",") if n in by]


def _perf(ctx: _Ctx, task: Task, engine: str | None) -> _Est:
    assert engine is not None
    if task.flag("--phase") == "climb":
        return _climb(ctx, task, engine)
    rounds = int(task.flag("--rounds") or ctx.profile.bench.rounds)
    cases = _cases(ctx, task)
    s = ctx.rates.fixed("client") + sum(ctx.case(engine, c, rounds=rounds) for c in cases)
    return _Est(s, f"{len(cases)} case(s) x (ceiling + {ctx.profile.bench.warmup_prompts} warmup + {rounds} rounds)")


def _climb(ctx: _Ctx, task: Task, engine: str) -> _Est:
    """Every step of ``bench.slo.climb`` measured (the worst case: none misses the SLO or saturates), on the
    climb case's shape, ``climb_rounds`` rounds each; only the first step has a warmup (steps/gates/perf.py)."""
    slo = ctx.profile.bench.slo
    assert slo is not None
    shape = _cases(ctx, task)[0]
    steps = climb_cases(shape, slo)
    s = ctx.rates.fixed("client") + sum(ctx.case(engine, c, rounds=slo.climb_rounds, warmup=i == 0)
                                        for i, c in enumerate(steps))
    return _Est(s, f"{len(steps)} concurrencies (C{steps[0].concurrency}-C{steps[-1].concurrency}) x "
                   f"{slo.climb_rounds} round(s) on {shape.name}'s shape, all climbed")


def _longctx(ctx: _Ctx, task: Task, engine: str | None) -> _Est:
    """The gate's own rules (steps/gates/longctx.py): a blocked rung is skipped, a rung over the served context
    restarts the engine at its length (a stop, then a load), a rung over max_position_embeddings is refused at
    once; each needle request may spend the whole reply budget (the answer and the thinking before it)."""
    assert engine is not None
    p, spec = ctx.profile, ctx.profile.engines[engine]  # type: ignore[index]
    rungs = [int(r) for r in (task.flag("--rungs") or "").split(",") if r]
    max_pos = p.model.architecture.max_position_embeddings
    depths = len(p.longctx.needle_depths)
    reply = reply_budget(p)
    s, loads, parts = 0.0, 0, []
    for r in rungs:
        if blocked_reason(engine, spec, r, ctx.fixes.get(engine, [])):
            parts.append(f"{r} skipped (blocked)")
            continue
        served = ctx.served.setdefault(engine, spec.args.context_length)
        target, _ = plan_context(r, served, max_pos)
        if target is None and r > served:
            s += ctx.rates.fixed("refused")
            parts.append(f"{r} refused")
            continue
        if target is not None:      # a restart: every rank stopped, then the engine loaded at the new context
            s += ctx.rates.fixed("teardown") + ctx.load(engine)
            loads += 1
            ctx.served[engine] = target
        s += depths * (r / ctx.rates.engine(engine, "prefill_tps") + reply / ctx.rates.engine(engine, "decode_tps"))
        parts.append(str(r))
    return _Est(s, f"rungs {', '.join(parts) or 'none'}; {loads} restart(s) x (stop + load); "
                   f"{depths} x {reply}-token replies")


def _phases_s(ctx: _Ctx, engine: str, phases: list[str], prefix_len: int) -> float:
    """The Gate 4 base cases once per phase (steps/gates/experiment.py phase_plan), each with the client's start."""
    b = ctx.profile.bench
    base = [c for c in b.cases if c.requires_stable is None]
    return sum(ctx.rates.fixed("client") + sum(
        ctx.case(engine, c, rounds=b.rounds, prefix_len=prefix_len if ph == "reusable_prefix" else 0) for c in base)
        for ph in phases)


def _experiment_baseline(ctx: _Ctx, task: Task, engine: str | None) -> _Est:
    """The baseline, still up, runs each variant's phases beyond ``measure`` (steps/gates/experiment_baseline.py)."""
    assert engine is not None
    chosen = variants_for(ctx.profile, engine)
    s, n = 0.0, 0
    for v in chosen:
        phases = [ph for ph in phase_plan(v, ctx.profile) if ph != "measure"]
        s += _phases_s(ctx, engine, phases, v.prefix_len)
        n += len(phases)
    if not chosen:
        return _Est(0.0, "skipped: no variant of this engine needs the baseline")
    return _Est(s, f"{n} phase(s) for {', '.join(v.name for v in chosen)}")


def _experiment(ctx: _Ctx, task: Task, engine: str | None) -> _Est:
    """One variant: one load, Gate 3's content checks on it, its phases (steps/gates/experiment.py phase_plan), its
    teardown."""
    assert engine is not None
    name = task.flag("--variant")
    v = next((x for x in ctx.profile.experiments if x.name == name), None)
    if v is None:
        raise PlanError(f"task {task.name}: --variant {name!r} is not an experiment of profile {ctx.profile.name}")
    if v.engine is not None and v.engine != engine:
        return _Est(0.0, f"skipped: for {v.engine} only")
    phases = list(phase_plan(v, ctx.profile))
    content = _smoke(ctx, task, engine).seconds
    s = ctx.load(engine) + content + _phases_s(ctx, engine, phases, v.prefix_len) + ctx.rates.fixed("teardown")
    return _Est(s, f"one load + content checks + {', '.join(phases)} x "
                   f"{sum(c.requires_stable is None for c in ctx.profile.bench.cases)} case(s)")


# step name -> estimator: one line per gate; a step missing here fails plan_graph naming it
ESTIMATES: dict[str, Callable[[_Ctx, Task, str | None], _Est]] = {
    "params": _fixed,
    "prewarm": _prewarm,
    "preflight": _fixed,
    "preflight-compare": _fixed,
    "engine-check": _fixed,
    "nodes": _fixed,
    "network": _fixed,
    "pull": _fixed,
    "deploy": _deploy,
    "smoke": _smoke,
    "perf": _perf,
    "regress": _fixed,
    "longctx": _longctx,
    "experiment": _experiment,
    "experiment-baseline": _experiment_baseline,
    "teardown": _fixed,
    "report": _fixed,
    "cleanup": _fixed,
}


def _gpus(profile: Profile, task: Task, in_engine: bool) -> int:
    hw = profile.hardware
    if in_engine:
        return hw.total_gpus if hw.gpus_per_node else 0
    if task.step == "nodes":
        return hw.gpus_per_node
    if task.step == "network":
        return hw.total_gpus if hw.gpus_per_node else 0
    return 0


def plan_graph(graph: Graph, profile: Profile, orchestrator: Orchestrator,
               fixes: dict[str, list[str]] | None = None) -> Plan:
    """The schedule of ``graph`` (built for ``orchestrator`` from ``profile``); PlanError for a step with no
    estimate. ``fixes``: engine -> the fixes its pinned image lists (params/images.yaml)."""
    ctx = _Ctx(profile, _Rates(profile, orchestrator), fixes or {}, run=graph.run)
    seq = {d.name: d for d in graph.sequences}
    placed: list[tuple[str, Task, float, float, int, str]] = []   # path, task, start, seconds, gpus, detail

    def estimate(task: Task, engine: str | None) -> _Est:
        fn = ESTIMATES.get(task.step or "")
        if fn is None:
            raise PlanError(f"task {task.name}: no estimate for step {task.step!r}: add one to ESTIMATES in "
                            "workflows/plan.py")
        return fn(ctx, task, engine)

    def walk(tasks: tuple[Task, ...], t0: float, prefix: str, engine: str | None) -> float:
        ends: dict[str, float] = {}
        for t in tasks:
            start = max((ends[u] for u in t.upstream), default=t0)
            if t.dag is not None:
                ends[t.name] = walk(seq[t.dag].tasks, start, f"{t.name}/", t.inputs.get("engine"))
                continue
            est = estimate(t, engine)
            placed.append((prefix + t.name, t, start, est.seconds, _gpus(profile, t, engine is not None), est.detail))
            ends[t.name] = start + est.seconds
        return max(ends.values(), default=t0)

    end = walk(graph.main.tasks, 0.0, "", None)
    ex = graph.exit_handler
    est = estimate(ex, None)
    placed.append((ex.name, ex, end, est.seconds, 0, est.detail))
    total = end + est.seconds
    spent = sorted((s + d, d * g / 3600) for _, _, s, d, g, _ in placed)
    rows = []
    for path, t, s, d, g, detail in placed:
        gh = sum(h for e, h in spent if e <= s + d + 1e-9)
        rows.append(Row(path, t.step or "", t.gate, d, t.timeout_s or DEFAULT_TIMEOUT_S, s, g, gh, detail))
    order = {r.path: i for i, r in enumerate(rows)}
    rows.sort(key=lambda r: (r.start_s, order[r.path]))
    if graph.run == "nightly":
        notes = [f"the longest night: engines {', '.join(profile.nightly_engines())}, the confirm stage on every "
                 f"nightly case; its deadline is nightly.window_h ({profile.nightly.window_h:g} h); retries and a "
                 "cold first round measured again are not counted",
                 "left out of the nightly: " + "; ".join(what for what, _ in profile.nightly_left_out())]
    else:
        notes = ["the longest run: prewarm=true, engines=both, gated cases and rungs unlocked, the confirm stage "
                 "on every case, every variant; retries and a cold first round measured again are not counted"]
    if profile.model.weight_bytes is None:
        notes.append("model.weight_bytes is null: loads count the engine's init only")
    if profile.experiments and graph.run == "qualification":
        notes.append("Gate 6: the baseline runs the variants' extra phases first, is released before the variants "
                     "and not redeployed; each variant is one load")
    nightly = graph.run == "nightly"
    deadline = int(round(profile.nightly.window_h * 3600)) if nightly else profile.active_deadline_s
    return Plan(profile.name, orchestrator, tuple(rows), total, deadline, sum(h for _, h in spent),
                tuple(ctx.rates.used.values()), tuple(notes), graph.run,
                profile.nightly.gpu_hours if nightly else None)


# the steps that run after the run's window has ended for the gates (their Needs.windowed is False), the exit
# handler apart: what the window keeps for them (steps/window.py)
AFTER_WINDOW = ("teardown", "regress", "report")


def window_reserve_s(profile: Profile) -> int:
    """Seconds the gates leave before Argo's workflow deadline: :data:`MARGIN` times the plan's figures for
    teardown, regress and report on the orchestrator the profile runs on (docs/reliability.md)."""
    orch: Orchestrator = "argo" if profile.hardware.kind == "kubernetes" else "local"
    rates = _Rates(profile, orch)
    return math.ceil(MARGIN * sum(rates.fixed(s) for s in AFTER_WINDOW))


def plan_profile(profile: Profile, run: Run = "qualification") -> Plan:
    """The plan of one run of ``profile`` on the orchestrator its ``hardware.kind`` runs on."""
    from gauntlet.params import load_images
    orch: Orchestrator = "argo" if profile.hardware.kind == "kubernetes" else "local"
    return plan_graph(build_graph(profile, orch, run), profile, orch, image_fixes(profile, load_images()))


def image_fixes(profile: Profile, images: Mapping[str, Any]) -> dict[str, list[str]]:
    """engine -> the fixes its pinned image lists."""
    return {n: list(images[e.image].fixes) if e.image in images else [] for n, e in profile.engines.items()}


def _h(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{seconds / 60:.0f} min" if seconds >= 90 \
        else f"{seconds:.0f} s"


def too_short(plan: Plan) -> str | None:
    """The first deadline the estimate does not fit in (a nightly: also its GPU-hour budget), as one line; None
    when every one holds."""
    nightly = plan.run == "nightly"
    who = f"{plan.profile} nightly" if nightly else plan.profile
    see = f"(gauntlet plan --profile {plan.profile}{' --run nightly' if nightly else ''})"
    for r in plan.rows:
        if r.seconds > r.deadline_s:
            return f"{who}: {r.path} needs ~{_h(r.seconds)} by the plan, its deadline is {_h(r.deadline_s)} {see}"
    if plan.total_s > plan.workflow_deadline_s:
        limit = (f"its window nightly.window_h is {_h(plan.workflow_deadline_s)}" if nightly else
                 f"active_deadline_s is {_h(plan.workflow_deadline_s)}")
        return f"{who}: the run needs ~{_h(plan.total_s)} by the plan, {limit} {see}"
    if plan.gpu_h_budget is not None and plan.gpu_h_total > plan.gpu_h_budget:
        return (f"{who}: the run spends ~{plan.gpu_h_total:.1f} GPU-h by the plan, its budget nightly.gpu_hours is "
                f"{plan.gpu_h_budget:g} {see}")
    return None


def format_table(plan: Plan) -> str:
    """The plan as a readable table, its assumptions and notes."""
    head = ("task", "gate", "start", "estimate", "deadline", "GPUs", "GPU-h spent", "")
    lines = [head]
    for r in plan.rows:
        flag = "OVER" if r.seconds > r.deadline_s else ""
        lines.append((r.path, r.gate, _h(r.start_s), _h(r.seconds), _h(r.deadline_s), str(r.gpus),
                      f"{r.gpu_h_spent:.1f}", f"{flag} {r.detail}".strip()))
    widths = [max(len(x[i]) for x in lines) for i in range(len(head) - 1)]
    out = [f"gauntlet plan: {plan.profile}, the {plan.run} run ({plan.orchestrator})", ""]
    out += ["  ".join(x[i].ljust(widths[i]) for i in range(len(widths))) + "  " + x[-1] for x in lines]
    flag = "  OVER" if plan.total_s > plan.workflow_deadline_s else ""
    if plan.run == "nightly":
        over = "  OVER" if plan.gpu_h_budget is not None and plan.gpu_h_total > plan.gpu_h_budget else ""
        budget = f" of nightly.gpu_hours {plan.gpu_h_budget:g}{over}" if plan.gpu_h_budget is not None else ""
        out += ["", f"whole night: ~{_h(plan.total_s)}, window (nightly.window_h) {_h(plan.workflow_deadline_s)}"
                f"{flag}; {plan.gpu_h_total:.1f} GPU-h{budget}", "", "assumptions:"]
    else:
        out += ["", f"whole run: ~{_h(plan.total_s)}, active_deadline_s {_h(plan.workflow_deadline_s)}{flag}; "
                f"{plan.gpu_h_total:.1f} GPU-h; a deadline from the plan: {MARGIN}x, up to the next half hour "
                f"({_h(suggested_timeout(plan.total_s))})", "", "assumptions:"]
    aw = max((len(a.name) for a in plan.assumptions), default=0)
    out += [f"  {a.name.ljust(aw)}  {a.value:g} {a.unit}  ({a.source or 'default'})" for a in plan.assumptions]
    out += ["", "notes:"] + [f"  {n}" for n in plan.notes]
    return "\n".join(out)


def format_plans(plans: list[Plan]) -> str:
    """Several runs' plans (the qualification, then the nightly), one after the other, then one line each."""
    tables = [format_table(p) for p in plans]
    summary = ["", "runs:"] + [
        f"  {p.run:<13}  ~{_h(p.total_s)} of {_h(p.workflow_deadline_s)}, {p.gpu_h_total:.1f} GPU-h"
        + (f" of {p.gpu_h_budget:g}" if p.gpu_h_budget is not None else "")
        + (f"  OVER: {why}" if (why := too_short(p)) else "") for p in plans]
    return ("\n\n" + "=" * 100 + "\n\n").join(tables) + "\n" + "\n".join(summary)
