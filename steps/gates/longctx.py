"""Gate 5: the long-context ladder, one rung at a time, stopping at the first rung that does not pass.

A rung of N tokens is a needle-in-a-haystack chat request whose prompt plus
answer fills N tokens (counted with the engine's own ``/tokenize`` where it
has one), sent once per needle depth at concurrency 1; the answer must contain
the passcode and be sane (no repetition, NaN or garbage: Gate 3's judge).

Each rung's outcome is ``passed``, ``missed`` (needle not found or insane
text), ``refused`` (the engine answered 4xx: the prompt is over its max
length) or ``error`` (5xx, no response, timeout: a crash). The profile says
what each rung should do (``Rung.expect``):

- ``pass``: anything but ``passed`` fails the gate;
- ``fail``: a *known* capability limit (SmolLM2-135M finds this needle at 1K and
  2K and misses it at 10% depth at 4K on vLLM and llama.cpp alike): ``missed``/``refused`` are recorded as
  "beyond capability (known)" and pass; ``passed`` also passes, with a note to
  raise the expectation;
- ``refused``: over the engine's max length: a 4xx is "beyond capability:
  refused by the engine" and passes; a 200 or a crash fails.

The local ladder is 1K/2K ``pass``, 4K and 8K ``fail`` (the known limit) and 16K
``refused`` behind ``requires_all_lower``. The ladder stops after the first rung
that did not pass (higher rungs are recorded "not run"; within a rung, after its
first missed depth), except after a known miss (``expect: fail`` and missed:
the profile declared it, so the next rung of the task still runs: the local 8192
rung after the 4096 miss). ``unlock_all_lower`` (the gate for
``requires_all_lower`` rungs) is true only when every rung this step ran passed,
so a 1M request never follows a miss. Rungs at or above the engine's
``longctx_blocked_from_tokens`` (kimi-k3-h20: vLLM's) are refused before sending (skipped with the
reason) unless the image lists ``longctx_fix`` in ``fixes``. Ladder results
never enter the throughput tables.

A rung longer than the context the engine serves restarts it first, at the
rung's tokens (:func:`plan_context`; same args otherwise), through Gate 2's back
end (steps/gates/_ladder_restart.py): the served context is read from the running
deployment's record (the local state file, the StatefulSet), so the restart
persists into the next longctx task. A blocked rung is skipped before any
restart; a rung beyond the model's max_position_embeddings is sent without one
(the engine refuses it); a restart that fails is the rung's ``error`` and stops
the ladder. Each restart is in ``ladder.json``, a ``restart-<context>`` check
and ``metrics.engine_restarts``.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from collections.abc import Callable
from typing import Any

import httpx

from gauntlet.steps.gate import Needs
from gauntlet.params.models import EngineSpec, Rung
from gauntlet.steps.client.answers import sanity_problems
from gauntlet.steps.gates._ladder_restart import EngineContext
from gauntlet.contract import Check, Status, TransientError, UsageError, write_json_atomic
from gauntlet.steps.gates.shared_options import check_endpoint
from gauntlet.steps.gates.shared_options import engine_option
from gauntlet.steps.client.http import EngineClient
from gauntlet.steps.engines import engine as engine_of
from gauntlet.steps.options import GateOptions, option

NAME = "longctx"
HELP = "Gate 5: long-context ladder (needle in a haystack at several depths), stop at the first failure"
NEEDS = Needs(engine_ranks=True, api="manage")     # restarts the engine for a longer rung

__all__ = ["Options", "RungResult", "build_haystack", "judge_answer", "rung_outcome", "judge_rung", "blocked_reason",
           "plan_context", "known_miss", "run_ladder", "run"]

_WORDS = ("river mountain window garden copper lantern harbor meadow violet engine quiet silver market "
          "thunder pocket ribbon canyon marble pepper saddle timber velvet walnut anchor bridge candle desert "
          "feather glacier island jungle kettle ladder mirror needle orchard pillow quartz rocket shadow "
          "tunnel umbrella valley wagon yellow zipper autumn basket circle dolphin ember forest granite").split()
QUESTION = "What is the secret passcode mentioned in the text above? Reply with the passcode only."
ANSWER_MARGIN_TOKENS = 16       # chat template / special tokens the count may miss


@dataclass(frozen=True, kw_only=True)
class Options(GateOptions):
    engine: str = option(help="engine name in the profile")
    endpoint: str = option(help="engine base URL, e.g. http://127.0.0.1:8765 (with or without /v1)")
    rungs: str = option(help="comma-separated rung sizes (tokens) from profile.longctx.ladder")
    backend: str | None = option(None, choices=("local", "kubernetes"),
                                 help="deploy back end that restarts the engine for a longer rung (default: profile)")
    run_id: str | None = option(None, help="run id / workflow uid (labels the restarted engine; default "
                                "$GAUNTLET_RUN_ID)")
    run_dir: str | None = option(None, help="the engine sequence's directory, where its deploy recorded the "
                                 "engine (local back end; default: the parent of --out)")
    nccl_env: str | None = option(None, help="Gate 1's per-node NCCL/GLOO env for a restarted engine (as deploy's "
                                  "--nccl-env: network's nccl_env output)")

    def __post_init__(self) -> None:
        super().__post_init__()
        engine_option(self, self.engine)
        check_endpoint(self.endpoint)
        self.ladder()

    def ladder(self) -> list[Rung]:
        """The profile's rungs ``--rungs`` names, in its order; UsageError naming the flag otherwise."""
        ladder = {r.tokens: r for r in self.the_profile.longctx.ladder}
        try:
            wanted = [int(x) for x in self.rungs.split(",") if x.strip()]
        except ValueError:
            raise UsageError(f"--rungs {self.rungs!r}: comma-separated token counts") from None
        unknown = [w for w in wanted if w not in ladder]
        if unknown or not wanted:
            raise UsageError(f"--rungs {self.rungs!r}: not in the ladder {sorted(ladder)}: {unknown}")
        return [ladder[w] for w in wanted]


@dataclass
class Probe:
    depth: float
    passcode: str
    prompt_tokens: int | None = None
    status: int | None = None
    found: bool = False
    problems: list[str] = field(default_factory=list)
    answer: str = ""
    error: str | None = None
    seconds: float = 0.0


@dataclass
class RungResult:
    tokens: int
    expect: str
    outcome: str                    # passed | missed | refused | error | blocked | not-run
    status: Status = "skip"         # the check's status
    label: str = ""                 # what a person reads in the ladder table
    detail: str = ""
    probes: list[Probe] = field(default_factory=list)
    context: int | None = None      # the context the engine served when the rung was sent (None: unknown)


def passcode_for(tokens: int, depth: float) -> str:
    rng = random.Random(tokens * 1000 + int(depth * 100))
    return f"{rng.randint(1000, 9999)}-{rng.choice(['ALPHA', 'BRAVO', 'DELTA', 'ECHO', 'KILO', 'OSCAR'])}"


def _sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = rng.sample(_WORDS, 9)
        out.append(f"The {words[0]} near the {words[1]} held a {words[2]} {words[3]} and a {words[4]} "
                   f"{words[5]} while the {words[6]} {words[7]} watched the {words[8]}.")
    return out


def build_haystack(n_sentences: int, depth: float, passcode: str) -> str:
    """Filler with the needle after ``depth`` of the sentences, then the question (pure)."""
    s = _sentences(n_sentences)
    at = min(len(s), max(0, round(depth * len(s))))
    s.insert(at, f"Remember this: the secret passcode is {passcode}.")
    return " ".join(s) + "\n\n" + QUESTION


def judge_answer(text: str | None, finish_reason: str | None, passcode: str) -> tuple[bool, list[str]]:
    """(needle found, sanity problems) for one answer (pure)."""
    problems = sanity_problems(text, finish_reason, allowed_finish=("stop", "length"))
    found = passcode.split("-")[0] in (text or "") and passcode.split("-")[1].lower() in (text or "").lower()
    return found and not problems, problems


def rung_outcome(probes: list[Probe]) -> str:
    if any(p.status is not None and 400 <= p.status < 500 for p in probes):
        return "refused"
    if any(p.status is None or p.status >= 500 for p in probes):
        return "error"
    return "passed" if all(p.found for p in probes) else "missed"


def judge_rung(rung: Rung, outcome: str, probes: list[Probe]) -> tuple[Status, str, str]:
    """(check status, label, detail) for a rung's outcome against its expectation (pure)."""
    n = rung.tokens
    missed = [f"{p.depth:.0%}" for p in probes if not p.found]
    why = "; ".join(sorted({x for p in probes for x in p.problems}))[:200]
    err = next((p.error or f"HTTP {p.status}" for p in probes if p.status is None or (p.status or 0) >= 400), "")
    if outcome == "error":
        return "fail", "crash", f"{n} tokens: engine error ({err}), not a clean refusal"
    if rung.expect == "pass":
        if outcome == "passed":
            return "pass", "passed", f"needle found at every depth ({len(probes)}) at {n} tokens"
        if outcome == "refused":
            return "fail", "refused", f"{n} tokens refused ({err}) where the profile expects a pass"
        return "fail", "missed", f"needle missed at depth {', '.join(missed)} at {n} tokens" + (
            f" ({why})" if why else "")
    if rung.expect == "fail":
        if outcome == "passed":
            return "pass", "passed", (f"passed at {n} tokens, beyond the known capability: "
                                      "raise this rung's expect to pass")
        label = "beyond capability (known)"
        what = f"refused ({err})" if outcome == "refused" else f"missed at depth {', '.join(missed)}"
        return "pass", label, f"{n} tokens {what}, as the profile records (expect: fail)"
    # expect refused
    if outcome == "refused":
        return "pass", "beyond capability (refused)", f"{n} tokens refused by the engine with {err}, as expected"
    return "fail", "accepted", f"{n} tokens answered HTTP 200 where the engine should refuse (over its max length)"


def blocked_reason(engine: str, spec: EngineSpec, tokens: int, fixes: list[str]) -> str | None:
    """Why this rung is refused before sending, or None (pure)."""
    limit = spec.longctx_blocked_from_tokens
    if limit is None or tokens < limit:
        return None
    if spec.longctx_fix and spec.longctx_fix in fixes:
        return None
    return (f"{engine_of(engine).title} rungs >= {limit} tokens are refused until the image lists fix "
            f"{spec.longctx_fix!r} in params/images.yaml (known long-context defect)")


class _Session:
    """The ladder's two requests (token count, chat) over the engine client; /tokenize is given up on
    at its first failure (the engine has none: counts are estimated)."""

    def __init__(self, client: EngineClient, model: str):
        self.client = client
        self.model = model
        self.tokenize_ok = True

    def count(self, content: str) -> int | None:
        if not self.tokenize_ok:
            return None
        ex = self.client.tokenize({"model": self.model, "messages": [{"role": "user", "content": content}],
                                   "add_generation_prompt": True})
        if ex.status != 200 or not isinstance(ex.body, dict) or "count" not in ex.body:
            self.tokenize_ok = False
            return None
        return int(ex.body["count"])

    def chat(self, content: str, max_tokens: int) -> tuple[int | None, Any, str | None, float]:
        ex = self.client.chat({"model": self.model, "messages": [{"role": "user", "content": content}],
                               "max_tokens": max_tokens, "temperature": 0})
        return ex.status, ex.body, ex.error[:200] if ex.error else None, ex.seconds


def _fit(client: _Session, target: int, depth: float, passcode: str) -> tuple[str, int | None]:
    """The haystack closest to (not over) ``target`` prompt tokens."""
    per = None
    probe_n = 50
    c = client.count(build_haystack(probe_n, depth, passcode))
    if c:
        base = client.count(build_haystack(0, depth, passcode)) or 0
        per = max(1e-6, (c - base) / probe_n)
        n = max(0, int((target - base) / per))
    else:  # no /tokenize: about 1.3 tokens per word, 18 words a sentence
        n = max(0, int(target / 24))
    text = build_haystack(n, depth, passcode)
    got = client.count(text)
    while got is not None and got > target and n > 0:
        n = max(0, n - max(1, int((got - target) / (per or 24)) + 1))
        text = build_haystack(n, depth, passcode)
        got = client.count(text)
    return text, got


def run_rung(client: _Session, rung: Rung, depths: list[float], max_tokens: int) -> RungResult:
    target = rung.tokens - max_tokens - ANSWER_MARGIN_TOKENS
    probes = []
    for d in depths:
        code = passcode_for(rung.tokens, d)
        text, counted = _fit(client, target, d, code)
        status, body, err, secs = client.chat(text, max_tokens)
        p = Probe(d, code, counted, status, error=err, seconds=round(secs, 2))
        if status == 200 and isinstance(body, dict):
            choice = (body.get("choices") or [{}])[0]
            content = (choice.get("message") or {}).get("content") or ""
            p.answer = content[:300]
            p.prompt_tokens = (body.get("usage") or {}).get("prompt_tokens", counted)
            p.found, p.problems = judge_answer(content, choice.get("finish_reason"), code)
        elif status is not None:
            msg = (body or {}).get("error", {}) if isinstance(body, dict) else {}
            p.error = f"HTTP {status}: {(msg.get('message') if isinstance(msg, dict) else msg) or ''}"[:200]
        probes.append(p)
        if status is None or status >= 400 or not p.found:
            break  # the rung has already not passed: stop at the first failure, here too
    outcome = rung_outcome(probes)
    verdict, label, detail = judge_rung(rung, outcome, probes)
    return RungResult(rung.tokens, rung.expect, outcome, verdict, label, detail, probes)


def plan_context(tokens: int, current: int | None, max_position: int | None) -> tuple[int | None, str]:
    """(the context to restart the engine at, or None; why) for a rung of ``tokens`` (pure).

    The rung's prompt plus its answer's max_tokens fill ``tokens`` less ANSWER_MARGIN_TOKENS, and each engine
    bounds one request by its context: vLLM 0.32's --max-model-len refuses a longer prompt and clamps
    max_tokens to what is left (entrypoints/serve/utils/api_utils.py get_max_tokens); SGLang 0.5.23's
    --context-length refuses a prompt at or over it and a prompt + max_new_tokens over it
    (managers/tokenizer_manager.py); llama.cpp's --ctx-size is one request's whole KV under --kv-unified
    (gauntlet.steps.engines.llamacpp). So a context of ``tokens`` admits the rung with its answer, and the engine
    restarts only when it serves less. Never above the model's max_position_embeddings: such a rung is sent
    at the served context (the engine refuses it, a 4xx)."""
    if current is None:
        return None, "not restarted: no running deployment of the engine is recorded (its context is unknown)"
    if tokens <= current:
        return None, ""
    if max_position is not None and tokens > max_position:
        return None, (f"no restart: {tokens} tokens is beyond the model's max_position_embeddings "
                      f"({max_position}); sent at the served context {current}")
    return tokens, f"the {tokens}-token rung is over the served context {current}"


def run_ladder(rungs: list[Rung], send: Callable[[Rung], RungResult], blocked: Callable[[Rung], str | None],
               prepare: Callable[[Rung], RungResult | None] | None = None) -> list[RungResult]:
    """Walk the rungs in order; stop after the first one that did not pass (pure control flow).

    ``blocked(rung)`` comes first (a skipped rung never restarts the engine), then ``prepare(rung)`` (the
    restart a longer rung needs: a RungResult when it failed, else None), then ``send(rung)``."""
    results: list[RungResult] = []
    stopped_at: int | None = None
    for r in sorted(rungs, key=lambda x: x.tokens):
        if stopped_at is not None:
            results.append(RungResult(r.tokens, r.expect, "not-run", "skip", "not run",
                                      f"not run: the ladder stopped at {stopped_at} tokens"))
            continue
        why = blocked(r)
        if why:
            results.append(RungResult(r.tokens, r.expect, "blocked", "skip", "refused (known defect)", why))
            stopped_at = r.tokens
            continue
        res = (prepare(r) if prepare else None) or send(r)
        results.append(res)
        if res.outcome != "passed" and not known_miss(r, res):
            stopped_at = r.tokens
    return results


def known_miss(rung: Rung, res: RungResult) -> bool:
    """A miss the profile declares (``expect: fail``, judged "beyond capability (known)"): the ladder goes on
    to the next rung of the task, as it does after a pass (pure). Anything else that did not pass stops it."""
    return rung.expect == "fail" and res.outcome == "missed" and res.status == "pass"


def run(opts: Options, out: Path) -> tuple[list[Check], dict[str, Any]]:
    from gauntlet.params import load_images

    profile = opts.the_profile
    engine = profile.engine_name(opts.engine)
    spec = profile.engine(engine)
    rungs = opts.ladder()
    image = load_images().get(spec.image)
    fixes = list(image.fixes) if image else []
    lc = profile.longctx
    served = EngineContext(opts, engine, out)
    first_context = served.context
    max_position = profile.model.architecture.max_position_embeddings
    notes: dict[int, str] = {}
    session = _Session(EngineClient(opts.endpoint, lc.timeout_s, keep_alive=spec.keep_alive), profile.model.served_name)

    def prepare(r: Rung) -> RungResult | None:
        target, why = plan_context(r.tokens, served.context, max_position)
        if target is None:
            notes[r.tokens] = why
            return None
        rs = served.restart(target, why, r.tokens)
        if not rs.ok:
            return RungResult(r.tokens, r.expect, "error", "fail", "restart failed",
                              f"restarting {engine} at context {target} for this rung failed after {rs.seconds:.0f}s: "
                              f"{rs.detail} (evidence: {rs.evidence})", context=served.context)
        session.client.close()          # its pooled connections went with the old engine
        session.client = EngineClient(opts.endpoint, lc.timeout_s, keep_alive=spec.keep_alive)
        return None

    def send(r: Rung) -> RungResult:
        res = run_rung(session, r, lc.needle_depths, lc.max_tokens)
        res.context = served.context
        if notes.get(r.tokens):
            res.detail += f"; {notes[r.tokens]}"
        return res

    try:
        try:
            session.client.get("/v1/models", timeout=30).raise_for_status()
        except httpx.HTTPError as exc:
            raise TransientError(f"engine at {opts.endpoint} not answering: {exc}") from None
        results = run_ladder(rungs, send, lambda r: blocked_reason(engine, spec, r.tokens, fixes), prepare)
    finally:
        session.client.close()
    checks = [Check(f"rung-{r.tokens}", r.status, f"expect {r.expect}", r.label, r.detail) for r in results]
    restarts = [asdict(rs) for rs in served.restarts]
    checks += [Check(f"restart-{rs.to_context}", "pass" if rs.ok else "fail", f"{engine} ready at context "
                     f"{rs.to_context}", rs.seconds, f"{rs.why}: {rs.detail}") for rs in served.restarts]
    all_passed = all(r.outcome == "passed" for r in results)
    context = {"served_at_start": first_context, "served_at_end": served.context, "record": (served.record or {}).get(
        "record"), "max_position_embeddings": max_position, "note": notes.get(min(notes), "") if notes else ""}
    doc = {"engine": engine, "context": context, "restarts": restarts, "rungs": [asdict(r) for r in results]}
    write_json_atomic(out / "ladder.json", doc)
    return checks, {"outputs": {"unlock_all_lower": all_passed}, "ladder": doc["rungs"], "engine": engine,
                    "context": context, "engine_restarts": restarts}
