"""Gate 4: the profile's benchmark matrix with the pinned client, warmup + N rounds per case.

Each case: one warmup (its own seed, so it never pre-fills a cache with the
measured prompts), then ``bench.rounds`` rounds of the same seeded request set.
A round counts only if ``completed == num_prompts`` and ``failed == 0``; the
case table is the median of the rounds with min/max and IQR, never the best.
Every round goes to the results store with the run's metadata.

A case that others depend on (``requires_stable``) unlocks them through the
output parameter ``unlock_<case>``: true only when it was stable (all rounds
valid, output-throughput spread <= ``bench.spread_max_rel``) and the memory
headroom at its peak was >= the dependant's ``headroom_min``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from gauntlet.steps.gate import Needs
from gauntlet.params.models import BenchCase, EngineSpec, Profile
from gauntlet.steps.client.bench import (LATENCY_METRICS, THROUGHPUT_METRICS, BenchRequest, parse_result, preload_client,
                          run_client)
from gauntlet.contract import Check, UsageError, param_name, write_json_atomic
from gauntlet.steps.client.sampler import Sampler, headroom
from gauntlet.steps.engines import diagnostic_clients as engine_diagnostics
from gauntlet.steps.gates.shared_options import ResultsOptions, check_endpoint
from gauntlet.steps.gates.shared_options import engine_option
from gauntlet.steps.options import option
from gauntlet.steps.evidence.stats import Stability, client_bound, cold_start, round_validity, stability, summarize

NAME = "perf"
# the diagnostic clients the engines ship (label -> engine; SGLang's sglang.bench_serving)
DIAGNOSTIC_CLIENTS = tuple(engine_diagnostics())
HELP = "Gate 4: benchmark matrix (vllm bench serve), warmup + rounds, median and spread, results store"
# api manage: a retry finds the engine released and redeploys it (steps/gates/engine_present.py)
NEEDS = Needs(model_cache="read", results_secret=True, engine_ranks=True, api="manage", image="bench")

__all__ = ["CaseResult", "measure_case", "case_table", "unlocks", "BenchOptions", "Options", "bench_fields", "run",
           "run_matrix", "selected_cases", "TABLE_METRICS", "diagnostic_clients", "run_diagnostics"]

TABLE_METRICS = (*THROUGHPUT_METRICS, *LATENCY_METRICS, "success_rate")
WARMUP_SEED_OFFSET = 1000


@dataclass(frozen=True, kw_only=True)
class BenchOptions(ResultsOptions):
    """Options shared by every step that runs the bench client (perf, experiment)."""

    tokenizer: str | None = option(None, help="tokenizer path (default: the model's mount or cache path)")
    bench_python: str | None = option(None, help="run the client as a subprocess of this Python "
                                                 "(default: in-process when vLLM is importable)")
    sample_interval: float = option(1.0, ge=0.05, le=600, help="seconds between resource samples (0.05 to 600)")
    no_store: bool = option(False, help="do not append rounds to the results store")
    no_ceiling: bool = option(False, help="skip the client's ceiling (the same requests against a zero-cost "
                                          "loopback server)")


def bench_fields(opts: BenchOptions) -> dict[str, Any]:
    """The :class:`BenchOptions` part of ``opts`` (profile included), to build another gate's options from."""
    return {f.name: getattr(opts, f.name) for f in fields(BenchOptions)}


@dataclass(frozen=True, kw_only=True)
class Options(BenchOptions):
    engine: str = option(help="engine name in the profile")
    endpoint: str = option(help="engine base URL, e.g. http://127.0.0.1:8765 (with or without /v1)")
    cases: tuple[str, ...] = option(csv=True, help="comma-separated case names from profile.bench.cases")
    phase: str = option("measure", choices=("measure", "confirm"),
                        help="confirm: fresh rounds of cases the nightly suspects (steps/gates/regress.py), kept apart "
                             "in the store")
    rounds: int | None = option(None, ge=1, le=100, help="rounds after the warmup, 1 to 100 (default: the profile's)")
    diagnostic_clients: tuple[str, ...] = option(
        (), csv=True, help="another client run once per case after the main rounds on the same requests, "
        f"reported apart and never in the A/B table: {', '.join(DIAGNOSTIC_CLIENTS)}, or none "
        "(default: the profile's bench.diagnostic_clients; never in the confirm phase)")
    diagnostic_python: str | None = option(None, help="the Python that has sglang, for the diagnostic client "
                                                      "(default: this one)")

    def __post_init__(self) -> None:
        super().__post_init__()
        engine_option(self, self.engine)
        check_endpoint(self.endpoint)
        selected_cases(self.the_profile, self.cases)
        if self.phase not in ("measure", "confirm"):
            raise UsageError(f"--phase {self.phase}: measure or confirm")
        bad = [c for c in self.diagnostic_clients if c not in (*DIAGNOSTIC_CLIENTS, "none")]
        if bad or ("none" in self.diagnostic_clients and len(self.diagnostic_clients) > 1):
            raise UsageError(f"--diagnostic-clients {','.join(self.diagnostic_clients)}: "
                             f"{', '.join(DIAGNOSTIC_CLIENTS)}, or none alone")


@dataclass
class CaseResult:
    case: str
    concurrency: int
    input_len: int
    output_len: int
    num_prompts: int
    rounds: list[dict[str, Any]] = field(default_factory=list)
    warmup: dict[str, Any] | None = None
    stability: Stability | None = None
    headroom: float | None = None
    client_ceiling: float | None = None      # output tok/s of the same requests against a zero-cost server
    client_ceiling_note: str = ""
    warmup_prompts: int = 0
    cold_start_retry: dict[str, Any] | None = None   # the first attempt, when its first round started cold
    expert_load: dict[str, Any] | None = None        # SGLang's recorder over the measured rounds (steps/cluster/expert_load.py)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["table"] = case_table(self.rounds)
        return d


def case_table(rounds: list[dict[str, Any]], metrics: tuple[str, ...] = TABLE_METRICS) -> dict[str, Any]:
    """metric -> summary (median, min, max, q1, q3, iqr, spread_rel) over the valid rounds (pure)."""
    valid = [r for r in rounds if r.get("valid")]
    return {m: summarize(r.get(m) for r in valid).to_dict() for m in metrics}


def tokenizer_for(profile: Profile, explicit: str | None) -> str:
    if explicit:
        return explicit
    for base in (profile.model.mount_path, profile.model.host_cache_path):
        if (Path(base) / "tokenizer_config.json").is_file():
            return str(Path(base).resolve())
    raise UsageError(f"no tokenizer at {profile.model.mount_path} or {profile.model.host_cache_path}; "
                     "prepare the model or pass --tokenizer PATH")


def measure_case(case: BenchCase, profile: Profile, *, endpoint: str, tokenizer: str, out: Path,
                 meta: dict[str, Any], bench_python: str | None = None, sample_interval: float = 1.0,
                 prefix_len: int = 0, seeds: list[int] | None = None, phase_tag: str = "",
                 warmup: bool = True, warmup_seed: int | None = None, null_url: str | None = None,
                 telemetry: tuple[list[Any], str] | None = None, experts: Any = None) -> CaseResult:
    """Warmup then ``bench.rounds`` rounds of one case; each round parsed, judged and sampled.

    ``prefix_len`` prepends a prefix shared by every request (the client derives it from the seed)
    to the case's ``input_len`` random tokens. With ``null_url`` (a zero-cost server, steps/client/null_server.py)
    the same client first runs the same requests against it: the client's own ceiling; a round reaching
    half of it is flagged client-bound, and on a cluster profile that makes the round invalid.
    ``telemetry``: the engine ranks' samplers (steps/cluster/rank_telemetry.py ``targets``) and why there are none;
    each round's window is fetched from every rank after the round. ``experts``: the engine's expert
    distribution recorder (steps/cluster/expert_load.py ``Recorder``), started before the measured rounds and
    stopped, dumped and summarised after them.
    """
    b = profile.bench
    n = case.num_prompts or b.prompts_per_concurrency * case.concurrency
    seeds = seeds or [b.seed] * b.rounds
    res = CaseResult(case.name, case.concurrency, case.input_len, case.output_len, n)
    raw = Path(out) / "raw"
    tag = f"{case.name}{'-' + phase_tag if phase_tag else ''}"

    def one(label: str, seed: int, num: int) -> dict[str, Any]:
        req = BenchRequest(endpoint, profile.model.served_name, tokenizer, case.input_len,
                           case.output_len, case.concurrency, num, seed, raw / f"{tag}-{label}.json",
                           prefix_len=prefix_len, keep_alive=profile.bench_keep_alive)
        t0, wall0 = time.perf_counter(), time.time()
        # on a cluster this pod has no GPU and its network is the client's: GPUs come from the ranks only
        with Sampler(endpoint, interval_s=sample_interval, nvidia_smi=None if cluster else "auto") as s:
            run = run_client(req, python=bench_python)
        wall1 = time.time()
        rec = parse_result(run.result, num)
        ok, why = round_validity(rec, num)
        bound, bound_why = client_bound(rec, res.client_ceiling)
        if bound and cluster and ok:
            ok, why = False, bound_why
        res_s = s.summary()
        ranks = _ranks_of(telemetry, wall0, wall1, res_s, cluster)
        # wall_s: the whole wrapped round (sampler, client, parsing) against the client's own time
        rec.update(valid=ok, invalid_reason=None if ok else why, client_s=run.client_s,
                   wall_s=time.perf_counter() - t0,
                   client_mode=run.mode, seed=seed, resources=res_s, headroom=res_s["headroom"],
                   client_ceiling=res.client_ceiling, client_bound=bound, client_bound_detail=bound_why,
                   telemetry=ranks, window=[round(wall0, 3), round(wall1, 3)])
        return rec

    cluster = profile.hardware.kind == "kubernetes"
    if null_url:
        try:
            req = BenchRequest(null_url, profile.model.served_name, tokenizer, case.input_len, case.output_len,
                               case.concurrency, n, seeds[0], raw / f"{tag}-ceiling.json", prefix_len=prefix_len,
                               keep_alive=profile.bench_keep_alive)
            ceil = parse_result(run_client(req, python=bench_python).result, n)
            res.client_ceiling = ceil.get("output_throughput")
            res.client_ceiling_note = f"{n} requests at concurrency {case.concurrency} in {ceil.get('duration_s'):.3g} s"
        except Exception as exc:  # a ceiling we could not measure is unknown, never a failed case
            res.client_ceiling_note = f"not measured: {type(exc).__name__}: {exc}".splitlines()[0][:200]
    warm_n = b.warmup_prompts
    for attempt in (1, 2):
        if warmup and warm_n > 0:
            res.warmup = one(f"warmup{'' if attempt == 1 else attempt}",
                             b.seed + WARMUP_SEED_OFFSET if warmup_seed is None else warmup_seed, warm_n)
        res.rounds = []
        start_err = experts.start() if experts is not None else None     # clears the previous record
        for i, seed in enumerate(seeds, start=1):
            rec = one(f"round{i}{'' if attempt == 1 else f'-again{attempt}'}", seed, n)
            rec["round"] = i
            rec["cold_start"], rec["cold_start_detail"] = cold_start(rec, b.cold_start_factor)
            res.rounds.append(rec)
        # a cold start that persists into the first round after the warmup: lengthen the warmup, measure again
        if attempt == 1 and warmup and warm_n > 0 and res.rounds and res.rounds[0]["cold_start"]:
            res.cold_start_retry = {"warmup_prompts": warm_n, "rounds": res.rounds,
                                    "why": res.rounds[0]["cold_start_detail"]}
            warm_n *= 2
            continue
        break
    res.warmup_prompts = warm_n if warmup else 0
    if experts is not None:
        res.expert_load = {"error": start_err} if start_err else experts.finish()
    res.stability = stability(res.rounds, b.spread_max_rel, b.rounds)
    heads = [r["headroom"] for r in res.rounds if r.get("headroom") is not None]
    res.headroom = min(heads) if heads else None
    return res


def _ranks_of(telemetry: tuple[list[Any], str] | None, since: float, until: float, res_s: dict[str, Any],
              cluster: bool) -> dict[str, Any]:
    """Every rank's telemetry for the round's window; the round's GPU columns (``res_s``) taken from the ranks,
    never from this pod (on a cluster it has no GPU)."""
    from gauntlet.steps.cluster.rank_telemetry import aggregate, round_telemetry
    tgts, why = telemetry if telemetry is not None else ([], "not collected")
    ranks = round_telemetry(tgts, since, until) if tgts else []
    agg = aggregate(ranks)
    if agg["gpu_source"] and agg["gpu_util_mean"] is not None:
        res_s.update(gpu_util_mean=agg["gpu_util_mean"], gpu_mem_used_frac_max=agg["gpu_mem_used_frac_max"],
                     gpu_power_w_max=agg["gpu_power_w_max"], gpu_source=f"engine ranks ({agg['gpu_source']})")
        res_s["headroom"] = headroom(res_s)
    elif cluster:
        res_s["gpu_source"] = ("not sampled on the engine's nodes: " + ("; ".join(agg["unreachable"]) or why or
                               ", ".join(sorted({str(r.get('gpu_source')) for r in ranks}))))
    return {"ranks": ranks, "note": why, "unreachable": agg["unreachable"]}


def telemetry_rows(results: list[CaseResult], meta: dict[str, Any], phase: str = "measure") -> list[dict[str, Any]]:
    """One row per measured round and engine rank, for the store's ``telemetry`` table."""
    rows = []
    for cr in results:
        for rec in cr.rounds:
            for rk in (rec.get("telemetry") or {}).get("ranks") or []:
                rows.append({**meta, **{k: v for k, v in rk.items() if k not in ("series", "rdma_ports", "url")},
                             "case": cr.case, "input_len": cr.input_len, "output_len": cr.output_len,
                             "concurrency": cr.concurrency, "round": rec.get("round"), "valid": rec.get("valid"),
                             "phase": phase})
    return rows


def expert_rows(results: list[CaseResult], meta: dict[str, Any], phase: str = "measure") -> list[dict[str, Any]]:
    """One row per case whose expert load was recorded (or failed to be), for the store's ``expert_load`` table."""
    import json
    rows = []
    for cr in results:
        e = cr.expert_load or {}
        if not e or "skipped" in e:
            continue
        rows.append({**meta, **{k: v for k, v in e.items() if k not in ("hottest", "window")},
                     "hottest": json.dumps(e.get("hottest")) if e.get("hottest") else None,
                     "case": cr.case, "input_len": cr.input_len, "output_len": cr.output_len,
                     "concurrency": cr.concurrency, "phase": phase})
    return rows


def store_rows(results: list[CaseResult], meta: dict[str, Any], phase: str = "measure",
               prefix_len: int = 0) -> list[dict[str, Any]]:
    rows = []
    for cr in results:
        for rec in cr.rounds:
            r = {**meta, **{k: v for k, v in rec.items() if k not in ("resources", "telemetry")}}
            res = rec.get("resources") or {}
            r.update(case=cr.case, input_len=cr.input_len, output_len=cr.output_len, concurrency=cr.concurrency,
                     prefix_len=prefix_len, phase=phase,
                     cpu_util_mean=res.get("cpu_util_mean"), gpu_util_mean=res.get("gpu_util_mean"),
                     gpu_mem_used_frac_max=res.get("gpu_mem_used_frac_max"),
                     gpu_power_w_max=res.get("gpu_power_w_max"),
                     engine_rss_bytes_max=res.get("engine_tree_rss_bytes_max") or res.get("engine_engine_rss_bytes_max"),
                     engine_kv_usage_max=res.get("engine_kv_usage_max"),
                     engine_running_max=res.get("engine_running_max"),
                     engine_waiting_max=res.get("engine_waiting_max"),
                     prefix_cache_hit_rate=res.get("prefix_cache_hit_rate"),
                     net_rx_bytes=res.get("net_rx_bytes"), net_tx_bytes=res.get("net_tx_bytes"))
            rows.append(r)
    return rows


def unlocks(profile: Profile, results: dict[str, CaseResult]) -> dict[str, tuple[bool, str]]:
    """For every case gated on another: (unlocked, why). A requirement not measured here does not unlock."""
    out = {}
    for c in profile.bench.cases:
        if c.requires_stable is None:
            continue
        req = results.get(c.requires_stable)
        if req is None or req.stability is None:
            out[c.name] = (False, f"{c.requires_stable} was not measured in this step")
            continue
        if not req.stability.stable:
            out[c.name] = (False, f"{c.requires_stable} unstable: {req.stability.reason}")
            continue
        need = c.headroom_min or 0.0
        if req.headroom is None:
            ok = need <= 0
            out[c.name] = (ok, f"{c.requires_stable} stable; memory headroom unknown (no KV/GPU/host reading)")
            continue
        if req.headroom < need:
            out[c.name] = (False, f"{c.requires_stable} stable but headroom {req.headroom:.1%} < {need:.0%}")
            continue
        out[c.name] = (True, f"{c.requires_stable} stable ({req.stability.reason}), headroom "
                             f"{req.headroom:.1%} >= {need:.0%}")
    return out


def case_checks(cr: CaseResult, spread_max: float, cluster: bool = False) -> list[Check]:
    checks = []
    bad = [r for r in cr.rounds if not r["valid"]]
    checks.append(Check(f"{cr.case}/rounds-valid", "fail" if bad else "pass", f"{len(cr.rounds)} valid rounds",
                        f"{len(cr.rounds) - len(bad)} valid",
                        "; ".join(f"round {r['round']}: {r['invalid_reason']}" for r in bad) or
                        f"every round completed {cr.num_prompts}/{cr.num_prompts} with 0 failed"))
    bound = [r for r in cr.rounds if r.get("client_bound")]
    if cr.client_ceiling is None:
        checks.append(Check(f"{cr.case}/client-headroom", "skip", "< 50% of the client's ceiling", None,
                            f"client ceiling {cr.client_ceiling_note or 'not measured'}"))
    else:
        worst = max((r.get("output_throughput") or 0.0 for r in cr.rounds), default=0.0)
        checks.append(Check(f"{cr.case}/client-headroom", "fail" if bound and cluster else "skip" if bound else "pass",
                            "< 50% of the client's ceiling", round(worst / cr.client_ceiling, 4),
                            (bound[0]["client_bound_detail"] + ("" if cluster else "; flagged: the client, not "
                             "only the engine, set this number")) if bound else
                            f"client ceiling {cr.client_ceiling:.4g} tok/s ({cr.client_ceiling_note}); fastest round "
                            f"{worst:.4g} tok/s = {worst / cr.client_ceiling:.1%} of it"))
    cold = [r for r in cr.rounds if r.get("cold_start")]
    retry = cr.cold_start_retry
    again = (f"; round 1 started cold after {retry['warmup_prompts']} warmup prompts ({retry['why']}), so the warmup "
             f"was lengthened to {cr.warmup_prompts} and the case measured again") if retry else ""
    checks.append(Check(f"{cr.case}/warm", "skip" if cold else "pass", "first requests' TTFT < factor x median",
                        len(cold), ("; ".join(f"round {r['round']}: {r['cold_start_detail']}" for r in cold)
                                    + "; flagged: a cold start inside the measured window") if cold else
                        f"no round paid a cold start{again}"))
    st = cr.stability
    t = case_table(cr.rounds)["output_throughput"]
    med = f"median {t['median']:.2f} tok/s (min {t['min']:.2f}, max {t['max']:.2f})" if t["median"] else "no data"
    # an unstable case is a finding, not a broken gate: it only keeps its dependants from running
    checks.append(Check(f"{cr.case}/stable", "pass" if st and st.stable else "skip", f"spread <= {spread_max:.0%}",
                        None if st is None or st.spread_rel is None else round(st.spread_rel, 4),
                        f"{med}; {st.reason if st else 'not judged'}"))
    return checks


def selected_cases(profile: Profile, names: Sequence[str]) -> list[BenchCase]:
    by = {c.name: c for c in profile.bench.cases}
    wanted = [n.strip() for n in names if n.strip()]
    unknown = [n for n in wanted if n not in by]
    if unknown or not wanted:
        raise UsageError(f"--cases {','.join(names)!r}: unknown {unknown or 'none given'}; "
                         f"profile has {', '.join(by)}")
    return [by[n] for n in wanted]


def run_matrix(opts: Options, out: Path, spec: EngineSpec, experiment: str,
               *, prefix_len: int = 0, seeds: list[int] | None = None, phase_tag: str = "",
               phase: str = "measure", warmup_seed: int | None = None
               ) -> tuple[dict[str, CaseResult], list[dict[str, Any]]]:
    """Measure ``opts.cases`` against ``opts.endpoint`` and append their rounds to the store (unless
    ``no_store``); returns results and store rows."""
    from gauntlet.steps.evidence.runmeta import run_meta

    profile = opts.the_profile
    cases = selected_cases(profile, opts.cases)
    meta = run_meta(out, profile, opts.engine, spec=spec, experiment=experiment)
    tok = tokenizer_for(profile, opts.tokenizer)
    if opts.bench_python is None:
        preload_client()
    results = {}
    from gauntlet.steps.cluster.rank_telemetry import targets
    telemetry = targets(profile, opts.engine, out, experiment)
    from gauntlet.steps.cluster.expert_load import recorder_for
    experts, no_experts = recorder_for(profile, opts.engine, opts.endpoint,
                                       telemetry[0][0][1] if telemetry[0] else None, spec)
    with _ceiling_server(profile, opts.no_ceiling) as null_url:
        for c in cases:
            results[c.name] = measure_case(c, profile, endpoint=opts.endpoint, tokenizer=tok, out=out, meta=meta,
                                           bench_python=opts.bench_python, sample_interval=opts.sample_interval,
                                           prefix_len=prefix_len, seeds=seeds, phase_tag=phase_tag,
                                           warmup_seed=warmup_seed, null_url=null_url, telemetry=telemetry,
                                           experts=experts)
            if experts is None:
                results[c.name].expert_load = {"skipped": no_experts}
    rows = store_rows(list(results.values()), meta, phase=phase, prefix_len=prefix_len)
    if not opts.no_store:
        from gauntlet.steps.evidence.results import append_rounds, append_telemetry
        append_rounds(rows, opts.results_store)
        trows = telemetry_rows(list(results.values()), meta, phase=phase)
        if trows:
            append_telemetry(trows, opts.results_store)
        erows = expert_rows(list(results.values()), meta, phase=phase)
        if erows:
            from gauntlet.steps.evidence.results import append_expert_load
            append_expert_load(erows, opts.results_store)
    return results, rows


@contextlib.contextmanager
def _ceiling_server(profile: Profile, skip: bool) -> Iterator[str | None]:
    """The zero-cost server for the client's ceiling, or None when it cannot start (the ceiling is then
    unknown: recorded as such, never a failed case)."""
    if skip:
        yield None
        return
    from gauntlet.steps.client.null_server import null_server
    try:
        cm = null_server(profile.model.served_name)
        url = cm.__enter__()
    except Exception:  # noqa: BLE001 - no aiohttp, no port: the ceiling is unknown
        yield None
        return
    try:
        yield url
    finally:
        cm.__exit__(None, None, None)


def diagnostic_clients(opts: Options) -> list[str]:
    """The diagnostic clients this step runs: ``--diagnostic-clients`` else the profile's; none when confirming."""
    if opts.phase != "measure":
        return []
    chosen = opts.diagnostic_clients or tuple(opts.the_profile.bench.diagnostic_clients)
    return [] if chosen == ("none",) else list(chosen)


def run_diagnostics(opts: Options, out: Path, results: dict[str, CaseResult], tokenizer: str, engine: str
                    ) -> tuple[dict[str, dict[str, Any]], list[Check]]:
    """Each diagnostic client once per case, on the case's measured requests (its seed), after the main rounds
    of every case in this step (so none of them follows another client's load; a later step's case starts
    with its own warmup). Returns client -> case -> record, and
    one check per case that never fails: a diagnostic that cannot run is a skip naming why. Its rows go to
    the results store's ``diagnostics`` table (steps/evidence/results.py), never to the main ``rounds``."""
    profile = opts.the_profile
    found: dict[str, dict[str, Any]] = {}
    checks: list[Check] = []
    rows: list[dict[str, Any]] = []
    for client in diagnostic_clients(opts):
        for cr in results.values():
            req = BenchRequest(opts.endpoint, profile.model.served_name, tokenizer, cr.input_len, cr.output_len,
                               cr.concurrency, cr.num_prompts, profile.bench.seed,
                               Path(out) / "raw" / f"{cr.case}-{client}.json", keep_alive=profile.bench_keep_alive)
            main_s = sorted(r["client_s"] for r in cr.rounds if r.get("client_s"))
            timeout = 300 + 10 * (main_s[len(main_s) // 2] if main_s else 60)
            name = f"{cr.case}/diagnostic-{client}"
            try:
                bench = engine_diagnostics()[client].diagnostic_bench
                if bench is None:           # engine_diagnostics() keeps only engines that have one
                    raise LookupError(f"{client}: no diagnostic bench")
                rec = bench(req, python=opts.diagnostic_python, timeout_s=timeout).record
            except Exception as exc:  # noqa: BLE001 - a diagnostic never fails the gate: recorded, one line
                why = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
                found.setdefault(client, {})[cr.case] = {"client": client, "error": why}
                checks.append(Check(name, "skip", "ran on the same requests", None, f"not measured: {why}"))
                continue
            ok = rec["completed"] == cr.num_prompts and rec["failed"] == 0
            found.setdefault(client, {})[cr.case] = rec
            # the numbers stay out of the check: they belong to the report's diagnostic section only
            checks.append(Check(name, "pass" if ok else "skip", "ran on the same requests",
                                f"{rec['completed']}/{cr.num_prompts}",
                                f"{client} replayed requests {rec['requests_sha256']}: completed "
                                f"{rec['completed']}/{cr.num_prompts}, failed {rec['failed']}"
                                f"{': ' + rec['first_error'] if rec.get('first_error') else ''} (a diagnostic, "
                                "reported apart from the A/B table)"))
            rows.append({**rec, "case": cr.case, "input_len": cr.input_len, "output_len": cr.output_len,
                         "concurrency": cr.concurrency, "prefix_len": 0, "round": 1, "valid": ok,
                         "invalid_reason": None if ok else "not every request completed"})
    if rows and not opts.no_store:
        from gauntlet.steps.evidence.runmeta import run_meta
        from gauntlet.steps.evidence.results import append_rounds
        try:
            meta = run_meta(out, profile, engine, spec=profile.engine(engine))
            append_rounds([{**meta, "phase": opts.phase, **r} for r in rows], opts.results_store)
        except Exception as exc:  # noqa: BLE001 - the main rounds are stored already; this is a note
            checks.append(Check("diagnostics/stored", "skip", "diagnostics table", None,
                                f"not stored: {type(exc).__name__}: {exc}".splitlines()[0][:300]))
    return found, checks


def run(opts: Options, out: Path) -> tuple[list[Check], dict[str, Any]]:
    profile = opts.the_profile
    engine = profile.engine_name(opts.engine)
    cases = selected_cases(profile, opts.cases)
    rounds = opts.rounds or profile.bench.rounds
    tokenizer_for(profile, opts.tokenizer)       # no tokenizer: a usage error before the client's import
    # the client's import is its own start-up, paid once per step and reported apart from the rounds
    client_import_s = preload_client() if opts.bench_python is None else 0.0
    results, rows = run_matrix(opts, out, profile.engine(engine), "baseline", phase=opts.phase,
                               seeds=[profile.bench.seed] * rounds)
    checks: list[Check] = []
    for cr in results.values():
        checks += case_checks(cr, profile.bench.spread_max_rel, profile.hardware.kind == "kubernetes")
    diagnostics, diag_checks = run_diagnostics(opts, out, results, tokenizer_for(profile, opts.tokenizer), engine)
    checks += diag_checks
    outputs: dict[str, Any] = {}
    for name, (ok, why) in unlocks(profile, results).items():
        outputs[f"unlock_{param_name(name)}"] = ok
        if any(c.name == next(x.requires_stable for x in profile.bench.cases if x.name == name) for c in cases):
            checks.append(Check(f"unlock/{name}", "pass" if ok else "skip", "stable and headroom", ok, why))
    overhead = [(r["wall_s"] - r["client_s"]) / r["client_s"] for cr in results.values() for r in cr.rounds
                if r.get("client_s")]
    write_json_atomic(out / "rounds.json", rows)
    metrics = {
        "engine": engine, "outputs": outputs, "run_id": rows[0]["run_id"] if rows else None,
        "meta": {k: rows[0][k] for k in ("image", "image_digest", "args_hash", "model_fingerprint", "git_rev",
                                         "topology", "context_length", "client", "client_version")} if rows else {},
        "cases": {n: cr.to_dict() for n, cr in results.items()},
        "wrapper_overhead_rel_max": max(overhead) if overhead else None,
        "client_import_s": round(client_import_s, 2),
    }
    if diagnostics:     # another client's numbers: apart from "cases", never in the A/B table
        metrics["diagnostics"] = diagnostics
    return checks, metrics
