"""Gate 6: one variant = the baseline with exactly one change, on its own engine.

The order in the engine sequence (workflows/graph.py), so that no two engines
hold the GPUs at once: after perf (and confirm), the baseline, still up,
measures every phase a variant needs of it (task ``baseline-phases``,
steps/gates/experiment_baseline.py); Gate 5 runs; the baseline is released
(``release-baseline``: teardown of the baseline only); then each variant, one
after the other, is this step: it validates the variant (the deployed
EngineArgs differ from the baseline's in exactly one variable), deploys it
through the same deploy back end as Gate 2 (local subprocess or Kubernetes,
labelled ``gauntlet.dev/variant``), re-runs the Gate 4 cases this run's
``perf`` measured, and always tears down that variant only. The sequence's own
``teardown`` ends it. No later gate needs the baseline again, so it is not
redeployed. An engine without variants keeps its baseline up until that
teardown.

Like for like: every phase the variant runs, the baseline runs too, on the
same cases and the same requests, and each phase is compared on its own.

- ``measure`` (every variant without phases, e.g. speculative decoding): the
  baseline is this run's perf evidence (the sequence's ``perf`` and
  ``perf-<case>`` tasks), same seeds; the variant's acceptance length, draft
  tokens and memory sit beside the baseline's memory on the same cases.
- Prefix cache: *cold* (every round a request set the engine has never seen:
  no gain expected) and *reusable prefix* (each prompt starts with the same
  ``Variant.prefix_len`` tokens: the gain). The baseline ran both phases in
  ``baseline-phases``, before it was released; this step reads them there.

Before it is measured, the variant answers Gate 3's content checks (the smoke
gate's own :func:`gauntlet.steps.gates.smoke.run_checks`, against the variant's
args), and its ranks are watched from its ready to the end of its measurement
(steps/gates/watch_ranks.py, the step runner's rank watch): a variant that
answers wrongly is never measured, and one whose ranks exited or restarted was
not what was measured; either is "reject variant" and fails the gate.

Verdict per phase: "better" when the variant's throughput is better beyond
noise (its worst round beats the baseline's best) with no P99 (TTFT, TPOT,
ITL, E2E) worse beyond noise (the variant's median above the baseline's worst
round), each by more than ``NOISE_FLOOR``. The experiment's decision is the
verdict of the phase the change is for (reusable prefix, else measure), vetoed
by any phase whose throughput or P99 is worse beyond noise, and, for a
speculative variant, by any compared case whose drafts were not shown accepted
(:func:`acceptance_problems`: its acceptance length, from the engine's own
figures, unknown or within noise of 1).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gauntlet.steps.gate import Needs
from gauntlet.params.models import EngineArgs, EngineSpec, Profile, Variant
from gauntlet.contract import Check, CorruptVerdict, UsageError, Verdict, write_json_atomic
from gauntlet.contract.layout import RunLayout, verdict_path
from gauntlet.steps.gates import perf
from gauntlet.steps.gates.shared_options import backend_option, engine_option
from gauntlet.steps.engines.commands import apply_change
from gauntlet.steps.options import option
from gauntlet.steps.gates.perf import BenchOptions, bench_fields, case_checks, case_table, run_matrix
from gauntlet.steps.gates.watch_ranks import check as watched, snapshot
from gauntlet.steps.client.http import EngineClient
from gauntlet.steps.evidence.stats import speculation, summarize

NAME = "experiment"
HELP = "Gate 6: deploy one variant (baseline + one change), re-run the Gate 4 cases, compare, tear down"
NEEDS = Needs(model_cache="read", results_secret=True, api="manage", image="bench")

__all__ = ["Options", "perf_options", "args_diff", "one_change_problems", "compare", "verdict", "baseline_cases", "run", "NOISE_FLOOR",
           "phase_plan", "phase_verdicts", "decision", "EXPECTATION", "PERF_TASK", "BASELINE_TASK", "baseline_phases", "case_names",
           "speculation", "speculative_figures", "acceptance_problems", "rejection", "content_checks", "P99_METRICS",
           "REJECT"]

NOISE_FLOOR = 0.02
# the tails the variant may not worsen: first token, per output token, between tokens, whole request
P99_METRICS = ("p99_ttft_ms", "p99_tpot_ms", "p99_itl_ms", "p99_e2el_ms")
REJECT = "reject variant"
COLD_SEED_STRIDE = 7919
PERF_TASK = "perf"                       # the sequence's Gate 4 task: the measure phase's baseline
BASELINE_TASK = "baseline-phases"        # the sequence's task where the baseline runs the variants' other phases
# what each phase is expected to show; the report prints it beside the phase's verdict
EXPECTATION = {"cold": "no gain expected: every request is new to the cache",
               "reusable_prefix": "the gain: every prompt starts with the same prefix",
               "measure": "the gain of the one change"}


@dataclass(frozen=True, kw_only=True)
class Options(BenchOptions):
    engine: str = option(help="engine name in the profile")
    variant: str = option(help="experiment name from profile.experiments")
    backend: str | None = backend_option("deploy back end (default: the profile's hardware.kind)")
    run_id: str | None = option(None, help="run id / workflow uid (labels what the variant's deploy creates)")
    baseline_dir: Path | None = option(None, help="the perf evidence dir (default: the sequence's perf task)")
    baseline_phases: Path | None = option(None, help="the evidence dir of the baseline's own run of the variant's "
                                                     "other phases (default: the sequence's baseline-phases task)")
    nccl_env: str | None = option(None, help="Gate 1's per-node NCCL/GLOO env for the engine it deploys (as deploy's "
                                  "--nccl-env: network's nccl_env output)")

    def __post_init__(self) -> None:
        super().__post_init__()
        engine_option(self, self.engine)
        self.variant_spec()

    def the_variant(self) -> Variant:
        return _variant(self.the_profile, self.variant)

    def variant_spec(self) -> EngineSpec:
        """The baseline engine's spec with the variant's one change; UsageError naming the variant otherwise."""
        v = self.the_variant()
        try:
            return apply_change(self.the_profile.engine(self.engine), v.change)
        except ValueError as exc:
            raise UsageError(f"variant {v.name}: {exc}".splitlines()[0]) from None


def perf_options(opts: BenchOptions, engine: str, endpoint: str, cases: Sequence[str]) -> perf.Options:
    """Gate 4's options for measuring ``cases`` of ``engine`` at ``endpoint`` with ``opts``' bench options."""
    return perf.Options(**bench_fields(opts), engine=engine, endpoint=endpoint, cases=tuple(cases))


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict) and d:
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: d}


def args_diff(base: EngineArgs, other: EngineArgs) -> dict[str, tuple[Any, Any]]:
    """Top-level EngineArgs variables that differ -> (baseline, variant) (pure)."""
    a, b = base.model_dump(), other.model_dump()
    return {k: (a[k], b.get(k)) for k in a if a[k] != b.get(k)}


def one_change_problems(base: EngineArgs, other: EngineArgs) -> list[str]:
    d = args_diff(base, other)
    if len(d) == 1:
        return []
    if not d:
        return ["the variant's engine args equal the baseline's: nothing to compare"]
    return [f"the variant changes {len(d)} variables ({', '.join(sorted(d))}); a variant changes exactly one"]


def compare(base: dict[str, dict[str, Any]], var: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per case: variant vs baseline rounds (tables as :func:`gauntlet.steps.gates.perf.case_table`), judged against noise.

    The noise is the rounds' own range: throughput is *better* only when the variant's worst round beats
    the baseline's best by more than ``NOISE_FLOOR``; a P99 is *worse* when the variant's median is above
    the baseline's worst round by more than ``NOISE_FLOOR``. Medians alone would crown whichever set of
    rounds happened to share the machine with less.
    """
    rows = []
    for case in sorted(set(base) & set(var)):
        b, v = base[case], var[case]
        row: dict[str, Any] = {"case": case}
        for m in ("output_throughput", *P99_METRICS):
            bt, vt = b.get(m) or {}, v.get(m) or {}
            bm, vm = bt.get("median"), vt.get("median")
            rel = (vm - bm) / bm if bm and vm is not None else None
            noise = max(NOISE_FLOOR, bt.get("spread_rel") or 0.0, vt.get("spread_rel") or 0.0)
            row[m] = {"baseline": bm, "variant": vm, "change_rel": rel, "noise_rel": noise,
                      "baseline_range": [bt.get("min"), bt.get("max")], "variant_range": [vt.get("min"), vt.get("max")]}
        t = row["output_throughput"]
        bmax, vmin = t["baseline_range"][1], t["variant_range"][0]
        row["throughput_better"] = (bmax is not None and vmin is not None and vmin > bmax * (1 + NOISE_FLOOR)
                                    and t["change_rel"] is not None)
        bmin, vmax = t["baseline_range"][0], t["variant_range"][1]
        row["throughput_worse"] = (bmin is not None and vmax is not None and vmax < bmin * (1 - NOISE_FLOOR))
        row["p99_worse"] = [m for m in P99_METRICS if row[m]["variant"] is not None
                            and row[m]["baseline_range"][1] is not None
                            and row[m]["variant"] > row[m]["baseline_range"][1] * (1 + NOISE_FLOOR)]
        rows.append(row)
    return rows


def verdict(rows: list[dict[str, Any]]) -> tuple[str, str]:
    """("adopt variant" | "keep baseline", why) (pure)."""
    if not rows:
        return "keep baseline", "no case measured on both the baseline and the variant"
    slower = [r["case"] for r in rows if not r["throughput_better"]]
    worse = [f"{r['case']} {m}" for r in rows for m in r["p99_worse"]]
    if worse:
        return "keep baseline", "worse P99 beyond noise: " + ", ".join(worse)
    if slower:
        return "keep baseline", "throughput not better beyond noise in " + ", ".join(slower)
    gains = ", ".join(f"{r['case']} {r['output_throughput']['change_rel']:+.1%}" for r in rows)
    return "adopt variant", f"throughput better beyond noise ({gains}) with no worse P99"


def phase_plan(variant: Variant, profile: Profile) -> dict[str, dict[str, Any]]:
    """phase -> run_matrix keyword arguments, the same for the variant and the baseline (pure)."""
    b = profile.bench
    if not (variant.change.get("prefix_cache") or variant.reusable_prefix):
        return {"measure": {}}
    plan: dict[str, dict[str, Any]] = {
        "cold": {"seeds": [b.seed + COLD_SEED_STRIDE * i for i in range(1, b.rounds + 1)], "phase_tag": "cold",
                 "phase": "measure"}}
    if variant.reusable_prefix:
        # the warmup uses the rounds' seed, so it sends the same shared prefix and primes the cache
        plan["reusable_prefix"] = {"prefix_len": variant.prefix_len, "phase_tag": "prefix", "phase": "prefix-warm",
                                   "warmup_seed": b.seed}
    return plan


def phase_verdicts(comparisons: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, str]]:
    """phase -> {verdict, why, expected} (pure); a phase's verdict never borrows another phase's numbers."""
    out = {}
    for phase, rows in comparisons.items():
        d, why = verdict(rows)
        worse = [r["case"] for r in rows if r.get("throughput_worse")]
        if worse:
            d, why = "worse", "throughput worse beyond noise in " + ", ".join(worse)
        elif d == "adopt variant":
            d = "better"
        elif rows and not any(r["p99_worse"] for r in rows):
            d = "no gain beyond noise"
        else:
            d = "worse" if rows else "not compared"
        out[phase] = {"verdict": d, "why": why, "expected": EXPECTATION.get(phase, "")}
    return out


def decision(verdicts: dict[str, dict[str, str]], vetoes: Sequence[str] = ()) -> tuple[str, str, str | None]:
    """(decision, why, the phase it rests on): the target phase's verdict, vetoed by a worse phase and by each of
    ``vetoes`` (a speculative variant's :func:`acceptance_problems`) (pure)."""
    target = next((p for p in ("reusable_prefix", "measure") if p in verdicts), None)
    worse = [f"{p}: {v['why']}" for p, v in verdicts.items() if v["verdict"] == "worse"]
    if target is None:
        return "keep baseline", "no phase the change is for was compared with the baseline", None
    if worse:
        return "keep baseline", "; ".join(worse), target
    v = verdicts[target]
    if v["verdict"] == "better" and vetoes:
        return "keep baseline", f"{target}: {v['why']}, but " + "; ".join(vetoes), target
    return ("adopt variant" if v["verdict"] == "better" else "keep baseline"), f"{target}: {v['why']}", target


def speculative_figures(rounds: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """The median of each :func:`speculation` figure over the valid rounds (pure)."""
    per = [speculation(r) for r in rounds if r.get("valid")]
    keys = ("acceptance_length", "acceptance_rate_pct", "draft_tokens", "accepted_tokens", "drafts")
    return {k: summarize(p[k] for p in per).median for k in keys}


def acceptance_problems(figures: dict[str, dict[str, Any]], cases: Sequence[str]) -> list[str]:
    """Why a speculative variant's drafts are not shown accepted in ``cases`` (pure): no acceptance length from
    the engine's own figures, or one within ``NOISE_FLOOR`` of 1 (every draft rejected: one token per verify)."""
    out = []
    for case in cases:
        length = (figures.get(case) or {}).get("acceptance_length")
        if length is None:
            out.append(f"{case}: no acceptance length in the engine's own figures (its speculative counters were "
                       "not read)")
        elif length <= 1 + NOISE_FLOOR:
            out.append(f"{case}: acceptance length {length:.3f}: the drafts were not accepted")
    return out


def rejection(content: Sequence[Check], ranks: Check | None) -> str | None:
    """Why the variant is rejected before any comparison, or None (pure): a Gate 3 content check failed (it
    answers wrongly: never measured), or a rank exited or restarted while it was checked or measured."""
    bad = [f"{c.name}: {c.detail}" for c in content if c.status in ("fail", "error")]
    if bad:
        return "Gate 3's content checks failed on the variant, so it was not measured: " + "; ".join(bad[:3]) + (
            f" (+{len(bad) - 3} more)" if len(bad) > 3 else "")
    if ranks is not None and ranks.status == "fail":
        return f"its ranks did not stay up: {ranks.detail}"
    return None


def baseline_cases(perf_dir: Path) -> dict[str, dict[str, Any]]:
    """case -> the case record from this run's perf evidence (perf and perf-<case> siblings)."""
    out: dict[str, dict[str, Any]] = {}
    for d in RunLayout.with_continuations(perf_dir):
        try:
            cases = Verdict.read(d).metrics.get("cases", {})
        except CorruptVerdict:
            continue
        if isinstance(cases, dict):
            out.update({k: c for k, c in cases.items() if isinstance(c, dict)})
    return out


def case_names(profile: Profile, base: dict[str, dict[str, Any]]) -> list[str]:
    """The cases a variant (and the baseline's run of its phases) measures: those perf measured, else the
    ungated cases; the same list on both sides, so every phase is like for like."""
    names = list(base) or [c.name for c in profile.bench.cases if c.requires_stable is None]
    perf.selected_cases(profile, names)
    return names


def baseline_phases(evidence: Path, variant: str) -> dict[str, dict[str, Any]]:
    """phase -> {tables, prefix_cache_hit_rate} the baseline measured for ``variant`` (``baseline_phases.json`` in
    the ``baseline-phases`` task's evidence dir ``evidence``); empty when it has none."""
    try:
        doc = json.loads((evidence / "baseline_phases.json").read_text())
    except (OSError, ValueError):
        return {}
    got = doc.get(variant) if isinstance(doc, dict) else None
    return {p: r for p, r in got.items() if isinstance(r, dict) and "tables" in r} if isinstance(got, dict) else {}


def _variant(profile: Profile, name: str) -> Variant:
    for v in profile.experiments:
        if v.name == name:
            return v
    raise UsageError(f"--variant {name}: not in profile {profile.name} (has "
                     f"{', '.join(v.name for v in profile.experiments) or 'none'})")


def _deployed_args(deploy_metrics: dict[str, Any], fallback: EngineSpec) -> EngineArgs:
    """The args the back end says it deployed, when it says; else the spec we asked for."""
    for key in ("engine_args", "args"):
        d = deploy_metrics.get(key)
        if isinstance(d, dict):
            try:
                return EngineArgs.model_validate(d)
            except ValueError:
                break
    return fallback.args


def _memory(rounds: list[dict[str, Any]]) -> tuple[float | None, float | None]:
    """(engine RSS max, GPU memory used fraction max) over the valid rounds' resource samples."""
    res = [r.get("resources") or {} for r in rounds if r.get("valid")]
    rss = [x.get("engine_tree_rss_bytes_max") or x.get("engine_engine_rss_bytes_max") for x in res]
    gpu = [x.get("gpu_mem_used_frac_max") for x in res]
    return max((m for m in rss if m), default=None), max((g for g in gpu if g is not None), default=None)


def _spec_and_memory(results: dict[str, Any], base: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per case: the variant's speculative-decoding figures and memory beside the baseline's memory."""
    out = {}
    for name, cr in results.items():
        rs = [r for r in cr.rounds if r.get("valid")]
        rss, gpu = _memory(rs)
        b_rss, b_gpu = _memory((base.get(name) or {}).get("rounds") or [])
        out[name] = {**speculative_figures(rs), "engine_rss_bytes_max": rss, "gpu_mem_used_frac_max": gpu,
                     "baseline_engine_rss_bytes_max": b_rss, "baseline_gpu_mem_used_frac_max": b_gpu}
    return out


def run(opts: Options, out: Path) -> tuple[list[Check], dict[str, Any]]:
    from gauntlet.steps.gates import deploy as deploy_step
    from gauntlet.steps.gates import teardown as teardown_step

    profile = opts.the_profile
    engine = profile.engine_name(opts.engine)
    variant = opts.the_variant()
    if variant.engine is not None and variant.engine != engine:
        return [Check("variant-engine", "skip", variant.engine, engine,
                      f"variant {variant.name} is for {variant.engine} only")], {"variant": variant.name}
    base_spec = profile.engine(engine)
    var_spec = opts.variant_spec()
    problems = one_change_problems(base_spec.args, var_spec.args)
    diff = {k: {"baseline": a, "variant": b} for k, (a, b) in args_diff(base_spec.args, var_spec.args).items()}
    checks = [Check("variant-one-change", "fail" if problems else "pass", "exactly one engine arg differs",
                    sorted(diff), "; ".join(problems) or f"changes {next(iter(diff))}: "
                    f"{next(iter(diff.values()))['baseline']!r} -> {next(iter(diff.values()))['variant']!r}")]
    metrics: dict[str, Any] = {"variant": variant.name, "engine": engine, "change": variant.change, "diff": diff}
    if problems:
        return checks, metrics

    perf_dir = opts.baseline_dir if opts.baseline_dir else RunLayout.sibling(out, PERF_TASK)
    base = baseline_cases(perf_dir)
    names = case_names(profile, base)
    if not base:
        checks.append(Check("baseline-evidence", "skip", str(verdict_path(perf_dir)), None,
                            f"no baseline perf evidence at {perf_dir}: the variant is measured, not compared"))

    plan = phase_plan(variant, profile)
    base_tables: dict[str, dict[str, Any]] = {}
    base_hit: dict[str, dict[str, list[Any]]] = {}
    if "measure" in plan and base:
        base_tables["measure"] = {n: c.get("table", {}) for n, c in base.items()}
    extra = [p for p in plan if p != "measure"]
    phases_dir = opts.baseline_phases or RunLayout.sibling(out, BASELINE_TASK)
    measured = baseline_phases(phases_dir, variant.name) if extra else {}
    for phase in extra:
        if phase in measured:      # the baseline ran this phase, on the same requests, before it was released
            base_tables[phase] = measured[phase]["tables"]
            base_hit[phase] = measured[phase].get("prefix_cache_hit_rate") or {}
    if [p for p in extra if p not in measured]:
        checks.append(Check("baseline-phases", "skip", f"baseline measured on {', '.join(extra)}", sorted(measured),
                            f"no baseline evidence for {variant.name} at {phases_dir}: the variant's phases are "
                            "measured, not compared"))

    dopts = deploy_step.Options(profile=profile, engine=engine, backend=opts.backend, run_id=opts.run_id,
                                variant=variant.name, nccl_env=opts.nccl_env)
    # this variant's objects only: the baseline was released before, and a teardown never touches the other
    topts = teardown_step.Options(profile=profile, engine=engine, backend=opts.backend, run_id=opts.run_id,
                                  variant=variant.name)
    dchecks, dmetrics = deploy_step.run(dopts, out / "deploy")
    checks += [Check(f"deploy/{c.name}", c.status, c.expected, c.observed, c.detail) for c in dchecks]
    phases: dict[str, Any] = {}
    content: list[Check] = []
    ranks: Check | None = None
    try:
        endpoint = (dmetrics.get("outputs") or {}).get("endpoint")
        if any(c.status in ("fail", "error") for c in dchecks) or not endpoint:
            checks.append(Check("variant-deployed", "fail", "engine ready", None,
                                "the variant did not come up; see deploy/ checks"))
            return checks, metrics
        deployed = _deployed_args(dmetrics, var_spec)
        again = one_change_problems(base_spec.args, deployed)
        checks.append(Check("deployed-one-change", "fail" if again else "pass", "deployed args = baseline + 1 change",
                            sorted(args_diff(base_spec.args, deployed)), "; ".join(again) or "verified on the deployed spec"))
        if again:
            return checks, metrics
        # the variant's ranks from its ready to the end of its measurement, read where its own deploy put them
        before = snapshot(profile, engine, out / "deploy", variant.name)
        content = content_checks(profile, engine, var_spec, endpoint, out / "content")
        ranks = watched(f"variant {variant.name}", before, snapshot(profile, engine, out / "deploy", variant.name))
        if rejection(content, ranks) is None:       # one that answers wrongly or lost a rank is never measured
            vopts = perf_options(opts, engine, endpoint, names)
            for phase, kw in plan.items():
                phases[phase], _ = run_matrix(vopts, out, var_spec, variant.name, **kw)
            ranks = watched(f"variant {variant.name}", before, snapshot(profile, engine, out / "deploy", variant.name))
    finally:
        tchecks, _ = teardown_step.run(topts, out / "teardown")
        checks += [Check(f"teardown/{c.name}", c.status, c.expected, c.observed, c.detail) for c in tchecks]
    checks += [Check(f"content/{c.name}", c.status, c.expected, c.observed, c.detail) for c in content]
    checks += [ranks] if ranks is not None else []
    for res in phases.values():
        for cr in res.values():
            checks += [c for c in case_checks(cr, profile.bench.spread_max_rel) if c.name.endswith("rounds-valid")]
    rule = ("Gate 3's content checks pass and the ranks stay up; then keep baseline unless throughput is better "
            "with no P99 (TTFT, TPOT, ITL, E2E) worse and, for a speculative variant, its drafts accepted")
    rejected = rejection(content, ranks)
    if rejected:
        checks.append(Check("verdict", "fail", rule, REJECT, rejected))
        metrics.update(verdict=REJECT, verdict_reason=rejected, endpoint=endpoint,
                       phases={p: {n: cr.to_dict() for n, cr in res.items()} for p, res in phases.items()})
        write_json_atomic(out / "comparison.json", {"verdict": REJECT, "why": rejected, "phases": {}, "comparisons": {}})
        return checks, metrics
    tables = {p: {n: case_table(cr.rounds) for n, cr in res.items()} for p, res in phases.items()}
    comparisons = {p: compare(base_tables[p], tables[p]) for p in tables if p in base_tables}
    verdicts = phase_verdicts(comparisons)
    for p, pv in verdicts.items():
        checks.append(Check(f"phase/{p}", "pass", pv["expected"], pv["verdict"], pv["why"]))
    main_phase = next((p for p in ("reusable_prefix", "measure") if p in phases), next(iter(phases)))
    speculative = _spec_and_memory(phases[main_phase], base)
    vetoes = (acceptance_problems(speculative, [r["case"] for r in comparisons.get(main_phase, [])])
              if "speculative" in diff and var_spec.args.speculative is not None else [])
    dec, why, target = decision(verdicts, vetoes)
    checks.append(Check("verdict", "pass", rule, dec, why))
    hit = {p: {n: [r.get("resources", {}).get("prefix_cache_hit_rate") for r in cr.rounds] for n, cr in res.items()}
           for p, res in phases.items()}
    main_phase = target or main_phase
    metrics.update(phases={p: {n: cr.to_dict() for n, cr in res.items()} for p, res in phases.items()},
                   tables=tables, baseline_tables=base_tables, comparisons=comparisons, phase_verdicts=verdicts,
                   comparison=comparisons.get(main_phase, []), verdict=dec, verdict_reason=why, main_phase=main_phase,
                   prefix_cache_hit_rate=hit, baseline_prefix_cache_hit_rate=base_hit,
                   speculative=speculative, acceptance_vetoes=vetoes,
                   baseline_dir=str(perf_dir), baseline_phases_dir=str(phases_dir), endpoint=endpoint)
    write_json_atomic(out / "comparison.json", {"verdict": dec, "why": why, "phases": verdicts,
                                                "comparisons": comparisons})
    return checks, metrics


def content_checks(profile: Profile, engine: str, spec: EngineSpec, endpoint: str, out: Path) -> list[Check]:
    """Gate 3's content checks (steps/gates/smoke.py ``run_checks``) against the variant at ``endpoint``, judged
    with the variant's own args (its over-long prompt is over the variant's context); its exchanges in ``out``."""
    from gauntlet.steps.gates.smoke import run_checks
    as_deployed = profile.model_copy(update={"engines": {**profile.engines, engine: spec}})
    with EngineClient(endpoint, profile.smoke.request_timeout_s, keep_log=True, keep_alive=spec.keep_alive) as client:
        checks, _ = run_checks(client, as_deployed, engine)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "exchanges.jsonl").open("w") as fh:
        for ex in client.log:
            fh.write(json.dumps(ex.to_record()) + "\n")
    return checks
