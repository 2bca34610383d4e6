"""Gate 4: the profile's benchmark matrix with the pinned client, warmup + N rounds per case.

Each case: one warmup (its own seed, so it never pre-fills a cache with the
measured prompts), then ``bench.rounds`` rounds of the same seeded request set.
A round counts only if ``completed == num_prompts`` and ``failed == 0``; the
case table is the median of the rounds with min/max and IQR, never the best.
Every round goes to the results store with the run's metadata.

A case that others depend on (``requires_stable``) unlocks them through the
output parameter ``unlock_<case>``: true only when it was stable (all rounds
valid, output-throughput spread <= ``bench.spread_max_rel``) and the KV cache
left free at its peak, read from the engine's own KV usage gauge, was >= the
dependant's ``headroom_min`` (no reading: locked, saying why).

Each round records the digest of the request set the client sent
(steps/client/request_set.py), so the A/B table compares engines on the same
requests, checked; a round whose engine processes no token for
``bench.hang_timeout_s`` while holding requests stops and fails the gate naming the
hang (steps/client/stall.py); the cases after it are not measured.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from gauntlet.steps.gate import Needs
from gauntlet.params.models import BenchCase, EngineSpec, Profile, SloSpec
from gauntlet.steps.client.bench import (LATENCY_METRICS, THROUGHPUT_METRICS, BenchRequest, client_available,
                                         goodput_args, parse_result, preload_client, run_client)
from gauntlet.contract import Check, UsageError, param_name, write_json_atomic
from gauntlet.steps.client.request_set import requests_digest, sample_requests
from gauntlet.steps.client.sampler import Sampler
from gauntlet.steps.client.stall import EngineHang, watch as stall_watch
from gauntlet.steps.engines import diagnostic_clients as engine_diagnostics
from gauntlet.steps.engines import engine as engine_of
from gauntlet.steps.engines.adapter import Engine
from gauntlet.steps.gates.shared_options import ResultsOptions, check_endpoint
from gauntlet.steps.gates.shared_options import engine_option
from gauntlet.steps.options import option
from gauntlet.steps.evidence.stats import (ENGINE_COLUMNS, Stability, client_bound, cold_start, engine_figures,
                                           round_validity, stability, summarize, token_counts)

NAME = "perf"
# the diagnostic clients the engines ship (label -> engine; SGLang's sglang.bench_serving)
DIAGNOSTIC_CLIENTS = tuple(engine_diagnostics())
HELP = "Gate 4: benchmark matrix (vllm bench serve), warmup + rounds, median and spread, results store"
# api manage: a retry finds the engine released and redeploys it (steps/gates/engine_present.py)
NEEDS = Needs(model_cache="read", results_secret=True, engine_ranks=True, api="manage", image="bench")

__all__ = ["CaseResult", "measure_case", "case_table", "unlocks", "BenchOptions", "Options", "bench_fields", "run",
           "run_matrix", "selected_cases", "TABLE_METRICS", "diagnostic_clients", "run_diagnostics", "ClimbStep",
           "ClimbDecision", "climb_decision", "climb_cases", "run_climb", "slo_met", "case_slo"]

TABLE_METRICS = (*THROUGHPUT_METRICS, *LATENCY_METRICS, "success_rate", "request_goodput")
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
    phase: str = option("measure", choices=("measure", "confirm", "climb"),
                        help="confirm: fresh rounds of cases the nightly suspects (steps/gates/regress.py), kept apart "
                             "in the store; climb: the highest concurrency meeting bench.slo, climbing bench.slo.climb "
                             "on the shape of the one case --cases names (the qualification's)")
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
        if self.phase not in ("measure", "confirm", "climb"):
            raise UsageError(f"--phase {self.phase}: measure, confirm or climb")
        slo = self.the_profile.bench.slo
        if self.phase == "climb" and (slo is None or not slo.climb):
            raise UsageError(f"--phase climb: profile {self.the_profile.name} states no bench.slo.climb to climb")
        if self.phase == "climb" and len(self.cases) != 1:
            raise UsageError(f"--phase climb --cases {','.join(self.cases)}: name the one case whose shape the "
                             "climb uses (bench.slo.climb_case)")
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
    hang: str | None = None                          # why a round stopped: the engine made no progress
    headroom_note: str = ""                          # why there is no headroom reading, when there is none
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
                 telemetry: tuple[list[Any], str] | None = None, experts: Any = None,
                 trust_remote_code: bool = False, kv_names: Sequence[str] = (),
                 ranks: Callable[[], Any] | None = None, engine: Engine | None = None) -> CaseResult:
    """Warmup then ``bench.rounds`` rounds of one case; each round parsed, judged and sampled.

    ``prefix_len`` prepends a prefix shared by every request (the client derives it from the seed)
    to the case's ``input_len`` random tokens. With ``null_url`` (a zero-cost server, steps/client/null_server.py)
    the same client first runs the same requests against it: the client's own ceiling; a round reaching
    half of it is flagged client-bound, and on a cluster profile that makes the round invalid.
    ``telemetry``: the engine ranks' samplers (steps/cluster/rank_telemetry.py ``targets``) and why there are none;
    each round's window is fetched from every rank after the round. ``experts``: the engine's expert
    distribution recorder (steps/cluster/expert_load.py ``Recorder``), started before the measured rounds and
    stopped, dumped and summarised after them. ``trust_remote_code``: the engine's args say so, and the client
    loads the same tokenizer. ``kv_names``: the engine's KV usage gauges (its adapter's), named when none was
    read. ``ranks``: reads the engine's ranks now (the back end's), asked only when a round stalls; a stall
    of ``bench.hang_timeout_s`` stops the round and the case (``res.hang``). ``engine``: the engine's adapter, whose
    metric names say why a reading is missing (and whose counters may appear at their first count).

    Every round carries the engine's own figures over its window (steps/evidence/stats.py ``engine_figures``:
    running/waiting, KV usage, prefix hit rate, preemptions, speculative acceptance, its prompt and generated
    tokens) and is invalid when the client's token counts and the engine's differ by more than
    ``bench.token_count_tolerance``. With ``bench.slo`` the client computes its goodput against it.
    """
    b = profile.bench
    goodput = goodput_args(b.slo.ttft_p99_ms, b.slo.tpot_p99_ms) if b.slo is not None else ()
    n = case.num_prompts or b.prompts_per_concurrency * case.concurrency
    seeds = seeds or [b.seed] * b.rounds
    res = CaseResult(case.name, case.concurrency, case.input_len, case.output_len, n)
    raw = Path(out) / "raw"
    tag = f"{case.name}{'-' + phase_tag if phase_tag else ''}"

    def request(label: str, seed: int, num: int) -> BenchRequest:
        return BenchRequest(endpoint, profile.model.served_name, tokenizer, case.input_len,
                            case.output_len, case.concurrency, num, seed, raw / f"{tag}-{label}.json",
                            prefix_len=prefix_len, keep_alive=profile.bench_keep_alive,
                            trust_remote_code=trust_remote_code, goodput=goodput)

    digests: dict[int, tuple[str | None, str | None]] = {}     # seed -> (request-set digest, why none)

    def one(label: str, seed: int, num: int, measured: bool = True) -> dict[str, Any]:
        req = request(label, seed, num)
        if measured and seed not in digests:     # drawn before the round, outside its window
            digests[seed] = _request_digest(req, bench_python is None and client_available())
        t0, wall0 = time.perf_counter(), time.time()
        hung: str | None = None
        # on a cluster this pod has no GPU and its network is the client's: GPUs come from the ranks only
        with Sampler(endpoint, interval_s=sample_interval, nvidia_smi=None if cluster else "auto",
                     engine_metrics=engine.metrics if engine is not None else None,
                     counters_from_first_count=engine is not None and engine.counters_from_first_count) as s:
            check = stall_watch(lambda: s.samples, b.hang_timeout_s, ranks or (lambda: "not read here"))
            try:
                run = run_client(req, python=bench_python, watch=check)
            except EngineHang as exc:      # a failed round, never a retry: the engine would hang again
                hung = str(exc)
        wall1 = time.time()
        rec = parse_result({} if hung else run.result, num)
        ok, why = (False, f"engine hang: {hung}") if hung else round_validity(rec, num)
        bound, bound_why = client_bound(rec, res.client_ceiling)
        if bound and cluster and ok:
            ok, why = False, bound_why
        res_s = s.summary()
        rank_tel = _ranks_of(telemetry, wall0, wall1, res_s, cluster)
        # wall_s: the whole wrapped round (sampler, client, parsing) against the client's own time
        rec.update(valid=ok, invalid_reason=None if ok else why, client_s=None if hung else run.client_s,
                   wall_s=time.perf_counter() - t0,
                   client_mode=None if hung else run.mode, seed=seed, resources=res_s, headroom=res_s["headroom"],
                   client_ceiling=res.client_ceiling, client_bound=bound, client_bound_detail=bound_why,
                   telemetry=rank_tel, window=[round(wall0, 3), round(wall1, 3)], hang=hung)
        figures, notes = engine_figures(rec)
        agree, agree_why = (None, "the round stopped: not compared") if hung else token_counts(rec, b.token_count_tolerance)
        rec.update(figures, engine_notes=notes, token_counts_agree=agree, token_counts_detail=agree_why)
        if agree is False and ok:
            rec.update(valid=False, invalid_reason=f"the client's and the engine's token counts disagree: {agree_why}")
        if measured:
            rec["requests_sha256"], rec["requests_note"] = digests[seed]
        if hung:
            res.hang = f"{label}: {hung}"
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
                             b.seed + WARMUP_SEED_OFFSET if warmup_seed is None else warmup_seed, warm_n,
                             measured=False)
        res.rounds = []
        start_err = experts.start() if experts is not None and not res.hang else None   # clears the last record
        for i, seed in enumerate(seeds, start=1):
            if res.hang:        # the engine is stuck: every further round would hang as well
                break
            rec = one(f"round{i}{'' if attempt == 1 else f'-again{attempt}'}", seed, n)
            rec["round"] = i
            rec["cold_start"], rec["cold_start_detail"] = cold_start(rec, b.cold_start_factor)
            res.rounds.append(rec)
        # a cold start that persists into the first round after the warmup: lengthen the warmup, measure again
        if attempt == 1 and warmup and warm_n > 0 and res.rounds and res.rounds[0]["cold_start"] and not res.hang:
            res.cold_start_retry = {"warmup_prompts": warm_n, "rounds": res.rounds,
                                    "why": res.rounds[0]["cold_start_detail"]}
            warm_n *= 2
            continue
        break
    res.warmup_prompts = warm_n if warmup else 0
    if experts is not None:
        res.expert_load = ({"skipped": "the engine hung: its recorder was not asked"} if res.hang else
                           {"error": start_err} if start_err else experts.finish())
    res.stability = stability(res.rounds, b.spread_max_rel, b.rounds)
    heads = [r["headroom"] for r in res.rounds if r.get("headroom") is not None]
    res.headroom = min(heads) if heads else None
    if res.headroom is None:
        res.headroom_note = (f"the engine's /metrics had none of {', '.join(kv_names)} during the rounds"
                             if kv_names else "the engine's adapter declares no KV-cache usage gauge")
    return res


def _request_digest(req: BenchRequest, in_process: bool) -> tuple[str | None, str | None]:
    """(the digest of the request set the client sends for ``req``, why there is none): drawn by vLLM's own
    dataset code in this interpreter, as the in-process client draws it (steps/client/request_set.py)."""
    if not in_process:
        return None, "the client ran in another interpreter (--bench-python): its request set was not drawn here"
    if not Path(req.tokenizer).is_dir():      # never a hub download: the pipeline's tokenizer is the model's mount
        return None, f"the tokenizer {req.tokenizer!r} is not a local directory: its request set was not drawn"
    try:
        return requests_digest(sample_requests(req)), None
    except Exception as exc:  # noqa: BLE001 - an unknown digest is recorded as such; the round still runs
        return None, f"not drawn: {type(exc).__name__}: {exc}".splitlines()[0][:200]


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
               prefix_len: int = 0, slo: SloSpec | None = None) -> list[dict[str, Any]]:
    """One row per measured round: the client's figures, the engine's own beside them (:data:`ENGINE_COLUMNS`,
    the same for every engine, with ``engine_notes`` saying why one is null), the round's machine and the SLO it
    was judged against."""
    import json
    rows = []
    for cr in results:
        for rec in cr.rounds:
            r = {**meta, **{k: v for k, v in rec.items() if k not in ("resources", "telemetry")}}
            res = rec.get("resources") or {}
            if not any(k in rec for k in ENGINE_COLUMNS):      # a record measured before the engine's figures
                figures, notes = engine_figures(rec)
                r.update(figures, engine_notes=notes)
            met, _ = slo_met(rec, slo)
            r.update(case=cr.case, input_len=cr.input_len, output_len=cr.output_len, concurrency=cr.concurrency,
                     prefix_len=prefix_len, phase=phase,
                     cpu_util_mean=res.get("cpu_util_mean"), gpu_util_mean=res.get("gpu_util_mean"),
                     gpu_mem_used_frac_max=res.get("gpu_mem_used_frac_max"),
                     gpu_power_w_max=res.get("gpu_power_w_max"),
                     engine_rss_bytes_max=res.get("engine_tree_rss_bytes_max") or res.get("engine_engine_rss_bytes_max"),
                     net_rx_bytes=res.get("net_rx_bytes"), net_tx_bytes=res.get("net_tx_bytes"),
                     engine_notes=json.dumps(r.get("engine_notes") or {}, sort_keys=True),
                     slo_ttft_p99_ms=slo.ttft_p99_ms if slo else None, slo_tpot_p99_ms=slo.tpot_p99_ms if slo else None,
                     slo_met=met)
            rows.append(r)
    return rows


def slo_met(t: Mapping[str, Any], slo: SloSpec | None) -> tuple[bool | None, str]:
    """Whether p99 TTFT and TPOT meet ``slo`` (pure): ``t`` is a round record or a case's median p99s. None
    without an SLO; a p99 not measured misses it."""
    if slo is None:
        return None, "no SLO stated (bench.slo)"
    misses, meets = [], []
    for key, limit, label in (("p99_ttft_ms", slo.ttft_p99_ms, "TTFT"), ("p99_tpot_ms", slo.tpot_p99_ms, "TPOT")):
        v = t.get(key)
        if v is None:
            misses.append(f"{label} p99 not measured")
        elif v > limit:
            misses.append(f"{label} p99 {v:.4g} ms > {limit:g} ms")
        else:
            meets.append(f"{label} p99 {v:.4g} ms <= {limit:g} ms")
    return (False, "; ".join(misses + meets)) if misses else (True, "; ".join(meets))


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
            # GPU memory is the engine's static pool and host memory is not the GPUs': neither stands in
            ok, note = need <= 0, req.headroom_note or "no reading"
            out[c.name] = (ok, f"{c.requires_stable} stable; KV-cache headroom unknown ({note})"
                               + ("" if ok else f": {c.name} stays locked (headroom_min {need:.0%})"))
            continue
        if req.headroom < need:
            out[c.name] = (False, f"{c.requires_stable} stable but KV-cache headroom {req.headroom:.1%} < {need:.0%}")
            continue
        out[c.name] = (True, f"{c.requires_stable} stable ({req.stability.reason}), KV-cache headroom "
                             f"{req.headroom:.1%} >= {need:.0%}")
    return out


def case_slo(rounds: list[dict[str, Any]], slo: SloSpec | None) -> dict[str, Any]:
    """A case's goodput and SLO verdict over its valid rounds (pure): the median p99s against ``slo``, the median
    of the client's own goodput and the share of requests it counts as meeting the SLO."""
    t = case_table(rounds)
    med = {k: t[k]["median"] for k in ("p99_ttft_ms", "p99_tpot_ms", "request_goodput", "request_throughput")}
    met, why = slo_met(med, slo)
    gp, rt = med["request_goodput"], med["request_throughput"]
    return {"met": met, "why": why, "request_goodput": gp,
            "good_share": gp / rt if gp is not None and rt else None,
            "ttft_p99_ms": slo.ttft_p99_ms if slo else None, "tpot_p99_ms": slo.tpot_p99_ms if slo else None}


def case_checks(cr: CaseResult, spread_max: float, cluster: bool = False, slo: SloSpec | None = None) -> list[Check]:
    checks = []
    if cr.hang:
        checks.append(Check(f"{cr.case}/hang", "fail", "the engine processes tokens while it holds requests",
                            None, cr.hang))
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
    if slo is not None:
        # a case over the SLO is a finding (a long prompt may never meet a TTFT objective), never a broken gate
        v = case_slo(cr.rounds, slo)
        gp = (f"goodput {v['request_goodput']:.4g} req/s, {v['good_share']:.0%} of the requests met both"
              if v["good_share"] is not None else "goodput not reported by the client")
        checks.append(Check(f"{cr.case}/slo", "pass" if v["met"] else "skip",
                            f"p99 TTFT <= {slo.ttft_p99_ms:g} ms, p99 TPOT <= {slo.tpot_p99_ms:g} ms",
                            None if v["request_goodput"] is None else round(v["request_goodput"], 4),
                            f"median of the valid rounds: {v['why']}; {gp}"))
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
               phase: str = "measure", warmup_seed: int | None = None,
               cases: Sequence[BenchCase] | None = None,
               stop: Callable[[dict[str, CaseResult]], bool] | None = None, warm_once: bool = False
               ) -> tuple[dict[str, CaseResult], list[dict[str, Any]]]:
    """Measure ``opts.cases`` (or ``cases``) against ``opts.endpoint`` and append their rounds to the store
    (unless ``no_store``); returns results and store rows. ``stop``: asked after each case with the results so
    far; True measures no further case (the climb's decision). ``warm_once``: only the first case has a warmup
    (the climb's steps share one shape: the engine is warm for the next)."""
    from gauntlet.steps.evidence.runmeta import run_meta

    profile = opts.the_profile
    cases = list(cases) if cases is not None else selected_cases(profile, opts.cases)
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
    eng = engine_of(opts.engine)
    with _ceiling_server(profile, opts.no_ceiling) as null_url:
        for i, c in enumerate(cases):
            results[c.name] = measure_case(c, profile, endpoint=opts.endpoint, tokenizer=tok, out=out, meta=meta,
                                           bench_python=opts.bench_python, sample_interval=opts.sample_interval,
                                           prefix_len=prefix_len, seeds=seeds, phase_tag=phase_tag,
                                           warmup=i == 0 or not warm_once,
                                           warmup_seed=warmup_seed, null_url=null_url, telemetry=telemetry,
                                           experts=experts, trust_remote_code=spec.args.trust_remote_code,
                                           kv_names=eng.metrics.get("kv_usage", ()),
                                           ranks=lambda: _ranks_now(profile, opts.engine, out), engine=eng)
            if experts is None:
                results[c.name].expert_load = {"skipped": no_experts}
            if results[c.name].hang:     # the engine is stuck: the cases after it are not measured
                break
            if stop is not None and stop(results):
                break
    rows = store_rows(list(results.values()), meta, phase=phase, prefix_len=prefix_len, slo=profile.bench.slo)
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


def _ranks_now(profile: Profile, engine: str, out: Path) -> Any:
    """The engine's ranks now, through the profile's back end (as the rank watch reads them), or why not."""
    from gauntlet.steps.backends import backend_for
    try:
        return backend_for(profile).ranks(profile, engine, out)
    except Exception as exc:  # noqa: BLE001 - the API unreachable, say: the hang is named all the same
        return f"{type(exc).__name__}: {exc}".splitlines()[0][:300]


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
                               Path(out) / "raw" / f"{cr.case}-{client}.json", keep_alive=profile.bench_keep_alive,
                               trust_remote_code=profile.engine(engine).args.trust_remote_code)
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


@dataclass(frozen=True)
class ClimbStep:
    """One concurrency of the climb, as its decision reads it: the median over its valid rounds."""

    concurrency: int
    output_throughput: float | None
    p99_ttft_ms: float | None
    p99_tpot_ms: float | None
    invalid: str | None = None          # why it was not measured validly (a failed round, a hang)

    @classmethod
    def of(cls, cr: CaseResult) -> ClimbStep:
        t = case_table(cr.rounds)
        bad = cr.hang or next((f"round {r.get('round')}: {r.get('invalid_reason')}" for r in cr.rounds
                               if not r.get("valid")), None) or (None if cr.rounds else "no round ran")
        return cls(cr.concurrency, t["output_throughput"]["median"], t["p99_ttft_ms"]["median"],
                   t["p99_tpot_ms"]["median"], bad)


@dataclass(frozen=True)
class ClimbDecision:
    go_on: bool                 # measure the next concurrency of the climb
    highest: int | None         # the highest concurrency measured that meets the SLO (None: none does)
    saturated: bool             # the climb stopped because more load added latency, not throughput
    reason: str


def climb_decision(steps: Sequence[ClimbStep], slo: SloSpec) -> ClimbDecision:
    """Whether the climb goes on after ``steps`` (the concurrencies of ``slo.climb`` measured so far, in order),
    and the highest concurrency that meets the SLO (pure). It stops at the first step that was not measured
    validly or misses the SLO (the highest is then the step below), or that saturates the server: output
    throughput gains less than ``slo.saturation_gain_min`` over the step below while its p99 TTFT or TPOT grows
    (the highest is that step: more load buys latency, not throughput, so no GPU-hour is spent above it); else
    it goes on to the next concurrency of the climb, and stops after the last one."""
    highest: int | None = None
    for i, st in enumerate(steps):
        c = f"C{st.concurrency}"
        if st.invalid:
            return ClimbDecision(False, highest, False, f"{c} was not measured validly ({st.invalid})")
        met, why = slo_met(asdict(st), slo)
        if not met:
            return ClimbDecision(False, highest, False, f"{c} misses the SLO: {why}")
        highest = st.concurrency
        prev = steps[i - 1] if i else None
        if prev is not None and prev.output_throughput and st.output_throughput is not None:
            gain = st.output_throughput / prev.output_throughput - 1
            grew = [f"{label} p99 {a:.4g} -> {b:.4g} ms" for label, a, b in
                    (("TTFT", prev.p99_ttft_ms, st.p99_ttft_ms), ("TPOT", prev.p99_tpot_ms, st.p99_tpot_ms))
                    if a is not None and b is not None and b > a]
            if gain < slo.saturation_gain_min and grew:
                return ClimbDecision(False, highest, True,
                                     f"{c} saturates the server: output throughput {gain:+.1%} over "
                                     f"C{prev.concurrency} (< {slo.saturation_gain_min:.0%}) while {', '.join(grew)}")
    if not steps:
        return ClimbDecision(True, None, False, "nothing measured yet")
    last = steps[-1].concurrency
    above = [c for c in slo.climb if c > last]
    if above:
        return ClimbDecision(True, highest, False, f"C{last} meets the SLO; next C{above[0]}")
    return ClimbDecision(False, highest, False, f"C{last}, the climb's top, meets the SLO: the highest load meeting "
                                                "it is at least that (bench.slo.climb goes no higher)")


def climb_cases(shape: BenchCase, slo: SloSpec) -> list[BenchCase]:
    """The climb's steps: ``shape``'s input and output length at each concurrency of ``slo.climb``, with
    ``bench.prompts_per_concurrency`` prompts each (pure)."""
    return [BenchCase(name=f"climb-c{c}", input_len=shape.input_len, output_len=shape.output_len, concurrency=c)
            for c in slo.climb]


def run_climb(opts: Options, out: Path) -> tuple[list[Check], dict[str, Any]]:
    """The qualification's climb: the steps of ``bench.slo.climb`` on the shape of ``--cases``, one after another
    (a warmup before the first only), each judged by :func:`climb_decision` as soon as it is measured."""
    profile = opts.the_profile
    slo = profile.bench.slo
    assert slo is not None          # Options refuses a climb without one
    engine = profile.engine_name(opts.engine)
    shape = selected_cases(profile, opts.cases)[0]
    rounds = opts.rounds or slo.climb_rounds
    tokenizer_for(profile, opts.tokenizer)
    client_import_s = preload_client() if opts.bench_python is None else 0.0
    results, rows = run_matrix(
        opts, out, profile.engine(engine), "baseline", phase="climb", seeds=[profile.bench.seed] * rounds,
        cases=climb_cases(shape, slo), warm_once=True,
        stop=lambda rs: not climb_decision([ClimbStep.of(cr) for cr in rs.values()], slo).go_on)
    steps = [ClimbStep.of(cr) for cr in results.values()]
    d = climb_decision(steps, slo)
    checks: list[Check] = []
    for st, cr in zip(steps, results.values(), strict=True):
        met, why = slo_met(asdict(st), slo)
        checks.append(Check(f"climb/c{st.concurrency}", "fail" if st.invalid else "pass" if met else "skip", "every round valid and the p99s within the SLO",
                            None if st.output_throughput is None else round(st.output_throughput, 2),
                            f"{st.invalid}" if st.invalid else
                            f"{why}; output {_fmt_num(st.output_throughput)} tok/s (median of {len(cr.rounds)} round(s))"))
    not_run = [c for c in slo.climb if c not in {st.concurrency for st in steps}]
    # the answer is a finding: none meeting the SLO is what the reader needs to know, never a broken gate
    checks.append(Check("climb/highest", "pass" if d.highest is not None else "skip",
                        f"the highest of {', '.join(map(str, slo.climb))} meeting the SLO", d.highest,
                        f"{'C' + str(d.highest) if d.highest is not None else 'no concurrency'} meets p99 TTFT <= "
                        f"{slo.ttft_p99_ms:g} ms and TPOT <= {slo.tpot_p99_ms:g} ms on {shape.name}'s shape "
                        f"({shape.input_len}/{shape.output_len}); stopped: {d.reason}"
                        + (f"; not measured: {', '.join(f'C{c}' for c in not_run)}" if not_run else "")))
    write_json_atomic(out / "rounds.json", rows)
    metrics = {
        "engine": engine, "outputs": {}, "run_id": rows[0]["run_id"] if rows else None,
        "climb": {"shape": shape.name, "input_len": shape.input_len, "output_len": shape.output_len,
                  "slo": slo.model_dump(), "rounds": rounds, "highest": d.highest, "saturated": d.saturated,
                  "reason": d.reason, "not_run": not_run, "steps": [asdict(st) for st in steps]},
        "cases": {n: {**cr.to_dict(), "slo": case_slo(cr.rounds, slo)} for n, cr in results.items()},
        "client_import_s": round(client_import_s, 2),
    }
    return checks, metrics


def _fmt_num(x: float | None) -> str:
    return "–" if x is None else f"{x:.4g}"


def run(opts: Options, out: Path) -> tuple[list[Check], dict[str, Any]]:
    if opts.phase == "climb":
        return run_climb(opts, out)
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
        checks += case_checks(cr, profile.bench.spread_max_rel, profile.hardware.kind == "kubernetes",
                              profile.bench.slo)
    hung = next((cr.case for cr in results.values() if cr.hang), None)
    if hung is not None:
        checks += [Check(f"{c.name}/measured", "skip", "measured", False, f"not measured: the engine hung in {hung}")
                   for c in cases if c.name not in results]
    # the GPU figures this gate needs: a sampler that reads no GPU fails it, naming the rank and why
    from gauntlet.steps.cluster.rank_telemetry import gpu_source_check
    gpus = gpu_source_check([rk for cr in results.values() for r in cr.rounds
                             for rk in (r.get("telemetry") or {}).get("ranks") or []], profile.hardware.gpus_per_node)
    checks += [gpus] if gpus else []
    # never against a hung engine: the diagnostic would hang too
    diagnostics, diag_checks = ({}, []) if hung is not None else run_diagnostics(
        opts, out, results, tokenizer_for(profile, opts.tokenizer), engine)
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
        "cases": {n: {**cr.to_dict(), "slo": case_slo(cr.rounds, profile.bench.slo)} for n, cr in results.items()},
        "wrapper_overhead_rel_max": max(overhead) if overhead else None,
        "client_import_s": round(client_import_s, 2),
    }
    if diagnostics:     # another client's numbers: apart from "cases", never in the A/B table
        metrics["diagnostics"] = diagnostics
    return checks, metrics
