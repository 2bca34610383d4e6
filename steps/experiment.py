"""Gate 6: one variant = the baseline with exactly one change, on a restarted engine.

The step validates the variant (the deployed EngineArgs differ from the
baseline's in exactly one variable), deploys it through the same deploy back
end as Gate 2 (local subprocess or Kubernetes), re-runs the Gate 4 cases this
run's ``perf`` measured, and always tears it down. The baseline numbers are
that perf evidence (``<out>/../perf/verdict.json`` and ``perf-<case>``).

- Prefix cache variants are measured twice, reported separately: *cold* (every
  round a request set the engine has never seen; this phase is compared with
  the baseline) and *reusable prefix* (each prompt starts with the same
  ``Variant.prefix_len`` tokens, several KV blocks, before the case's input;
  reported with the engine's prefix-cache hit rate).
- Speculative decoding records draft tokens, acceptance length and rate (the
  bench client's JSON) and memory.
- Verdict: "keep baseline" unless, in every compared case, the variant's
  throughput is better beyond noise (its worst round beats the baseline's best)
  and no P99 latency (TTFT, E2E) is worse beyond noise (the variant's median
  above the baseline's worst round), each by more than ``NOISE_FLOOR``.
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path
from typing import Any

from params.models import EngineArgs, EngineSpec, Profile, Variant
from steps._evidence import Check, UsageError, write_json_atomic
from steps.engine_cmd import apply_change
from steps.perf import bench_options, case_checks, case_table, run_matrix, selected_cases

NAME = "experiment"
HELP = "Gate 6: deploy one variant (baseline + one change), re-run the Gate 4 cases, compare, tear down"
NEEDS_PROFILE = True

__all__ = ["args_diff", "one_change_problems", "compare", "verdict", "baseline_cases", "run", "NOISE_FLOOR"]

NOISE_FLOOR = 0.02
P99_METRICS = ("p99_ttft_ms", "p99_e2el_ms")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", required=True)
    p.add_argument("--variant", required=True, help="experiment name from profile.experiments")
    p.add_argument("--backend", choices=("local", "kubernetes"), default=None, help="deploy back end (default: profile)")
    p.add_argument("--run-id", default=None)
    p.add_argument("--baseline-dir", default=None, help="the perf evidence dir (default: <out>/../perf)")
    bench_options(p)


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
    """Per case: variant vs baseline rounds (tables as :func:`steps.perf.case_table`), judged against noise.

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


def baseline_cases(perf_dir: Path) -> dict[str, dict[str, Any]]:
    """case -> the case record from this run's perf evidence (perf and perf-<case> siblings)."""
    out: dict[str, dict[str, Any]] = {}
    for d in [perf_dir, *sorted(perf_dir.parent.glob(f"{perf_dir.name}-*"))]:
        v = d / "verdict.json"
        if not v.is_file():
            continue
        try:
            cases = json.loads(v.read_text()).get("metrics", {}).get("cases", {})
        except ValueError:
            continue
        out.update({k: c for k, c in cases.items() if isinstance(c, dict)})
    return out


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


def _spec_and_memory(results: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for name, cr in results.items():
        rs = [r for r in cr.rounds if r.get("valid")]
        t = case_table(rs, ("spec_decode_acceptance_rate", "spec_decode_acceptance_length",
                            "spec_decode_draft_tokens", "spec_decode_accepted_tokens", "spec_decode_num_drafts"))
        mem = [((r.get("resources") or {}).get("engine_tree_rss_bytes_max")
                or (r.get("resources") or {}).get("engine_engine_rss_bytes_max")) for r in rs]
        gpu = [(r.get("resources") or {}).get("gpu_mem_used_frac_max") for r in rs]
        out[name] = {"acceptance_rate_pct": t["spec_decode_acceptance_rate"]["median"],
                     "acceptance_length": t["spec_decode_acceptance_length"]["median"],
                     "draft_tokens": t["spec_decode_draft_tokens"]["median"],
                     "accepted_tokens": t["spec_decode_accepted_tokens"]["median"],
                     "engine_rss_bytes_max": max((m for m in mem if m), default=None),
                     "gpu_mem_used_frac_max": max((g for g in gpu if g is not None), default=None)}
    return out


def run(args: argparse.Namespace, out: Path) -> tuple[list[Check], dict[str, Any]]:
    from steps import deploy as deploy_step

    profile: Profile = args.profile_obj
    if args.engine not in profile.engines:
        raise UsageError(f"--engine {args.engine}: not in profile {profile.name}")
    variant = _variant(profile, args.variant)
    if variant.engine is not None and variant.engine != args.engine:
        return [Check("variant-engine", "skip", variant.engine, args.engine,
                      f"variant {variant.name} is for {variant.engine} only")], {"variant": variant.name}
    base_spec = profile.engines[args.engine]
    try:
        var_spec = apply_change(base_spec, variant.change)
    except ValueError as exc:
        raise UsageError(f"variant {variant.name}: {exc}".splitlines()[0]) from None
    problems = one_change_problems(base_spec.args, var_spec.args)
    diff = {k: {"baseline": a, "variant": b} for k, (a, b) in args_diff(base_spec.args, var_spec.args).items()}
    checks = [Check("variant-one-change", "fail" if problems else "pass", "exactly one engine arg differs",
                    sorted(diff), "; ".join(problems) or f"changes {next(iter(diff))}: "
                    f"{next(iter(diff.values()))['baseline']!r} -> {next(iter(diff.values()))['variant']!r}")]
    metrics: dict[str, Any] = {"variant": variant.name, "engine": args.engine, "change": variant.change, "diff": diff}
    if problems:
        return checks, metrics

    perf_dir = Path(args.baseline_dir) if args.baseline_dir else Path(out).resolve().parent / "perf"
    base = baseline_cases(perf_dir)
    names = list(base) or [c.name for c in profile.bench.cases if c.requires_stable is None]
    cases = selected_cases(profile, ",".join(names))
    if not base:
        checks.append(Check("baseline-evidence", "skip", str(perf_dir / "verdict.json"), None,
                            f"no baseline perf evidence at {perf_dir}: the variant is measured, not compared"))

    dargs = copy.copy(args)
    dargs.variant = variant.name
    dargs.backend = getattr(args, "backend", None)
    dargs.run_id = getattr(args, "run_id", None)
    backend = deploy_step.backend_module(dargs)
    dchecks, dmetrics = backend.deploy(dargs, out / "deploy")
    checks += [Check(f"deploy/{c.name}", c.status, c.expected, c.observed, c.detail) for c in dchecks]
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
        margs = copy.copy(args)
        margs.endpoint = endpoint
        phases: dict[str, Any] = {}
        rounds = profile.bench.rounds
        if variant.change.get("prefix_cache") or variant.reusable_prefix:
            cold_seeds = [profile.bench.seed + 7919 * i for i in range(1, rounds + 1)]
            phases["cold"], _ = run_matrix(margs, out, cases, var_spec, variant.name, seeds=cold_seeds,
                                           phase_tag="cold", phase="measure")
            if variant.reusable_prefix:
                # the warmup uses the rounds' seed, so it sends the same shared prefix and primes the cache
                phases["reusable_prefix"], _ = run_matrix(
                    margs, out, cases, var_spec, variant.name, prefix_len=variant.prefix_len, phase_tag="prefix",
                    phase="prefix-warm", warmup_seed=profile.bench.seed)
        else:
            phases["measure"], _ = run_matrix(margs, out, cases, var_spec, variant.name)
    finally:
        tchecks, _ = backend.teardown(dargs, out / "teardown")
        checks += [Check(f"teardown/{c.name}", c.status, c.expected, c.observed, c.detail) for c in tchecks]

    main_phase = "cold" if "cold" in phases else "measure"
    for cr in phases[main_phase].values():
        checks += [c for c in case_checks(cr, profile.bench.spread_max_rel) if c.name.endswith("rounds-valid")]
    tables = {p: {n: case_table(cr.rounds) for n, cr in res.items()} for p, res in phases.items()}
    rows = compare({n: c.get("table", {}) for n, c in base.items()}, tables[main_phase])
    decision, why = verdict(rows) if base else ("keep baseline", "no baseline evidence to compare against")
    checks.append(Check("verdict", "pass", "keep baseline unless better throughput without worse P99",
                        decision, why))
    hit = {p: {n: [r.get("resources", {}).get("prefix_cache_hit_rate") for r in cr.rounds] for n, cr in res.items()}
           for p, res in phases.items()}
    metrics.update(phases={p: {n: cr.to_dict() for n, cr in res.items()} for p, res in phases.items()},
                   tables=tables, comparison=rows, verdict=decision, verdict_reason=why, main_phase=main_phase,
                   prefix_cache_hit_rate=hit, speculative=_spec_and_memory(phases[main_phase]),
                   baseline_dir=str(perf_dir), endpoint=endpoint)
    write_json_atomic(out / "comparison.json", {"verdict": decision, "why": why, "rows": rows})
    return checks, metrics
