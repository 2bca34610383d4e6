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

**A reasoning model thinks first** (Kimi K3 on SGLang: ``KimiK3Detector(force_reasoning=True)`` in
sglang/srt/parser/reasoning_parser.py; its serving layer files a think channel the model never closed as
reasoning, with an empty ``content``). So each request's ``max_tokens`` is ``longctx.max_tokens`` (the answer)
plus :attr:`~gauntlet.params.models.Profile.longctx_reasoning_tokens` (the thinking budget, derived from
``model.reasoning`` unless the profile states it), and the rung's prompt is that much shorter. The needle is
judged in the final answer (``message.content``) only; the reasoning, in the field the engine names
(``ReplyRules.reasoning_field``: vLLM 0.32 ``reasoning``, SGLang ``reasoning_content``), is kept in the
evidence. A reply cut by the length limit with no final answer is ``exhausted`` ("budget exhausted by
reasoning"), never a miss and never a known capability limit: it fails at any expectation; a needle that is
in the reasoning but not the answer is a miss that says so ("needle only in reasoning").

**A probe rung** (``Rung.probe``: kimi-k3-h20's 256K) is sent and judged like any other, and its checks have
status ``probe``: recorded, shown, never a failure of the gate. It is still a rung of the ladder: one that
did not pass stops the climb, and ``unlock_all_lower`` needs every rung of the step passed, the probe
included, so a probe's pass is needed for a ``requires_all_lower`` rung (1M) but never admits it alone (the
lower non-probe rungs must pass too) and a 1M request never follows a miss.

**Memory must be stable to go on.** After each rung its window is read from every engine rank's telemetry
sampler (steps/cluster/telemetry.py, as Gate 4 reads each round's: ``telemetry_targets`` of the back end,
:func:`~gauntlet.steps.cluster.rank_telemetry.round_telemetry`): each rank's peak GPU memory. A rank whose
peak grew more than ``longctx.memory_growth_max_gib`` since the previous rung fails ``memory-<tokens>`` and
stops the climb; a restart whose logs say the KV pool cannot hold one request of the new context (the
engine's ``kv_pool_capped`` line, e.g. SGLang's "KV pool holds N tokens, fewer than --context-length M")
fails ``restart-<context>`` and its rung is not sent. A GPU profile whose ranks answer no memory gets a
``memory-<tokens>`` skip that says why (the climb goes on, unguarded by memory); one whose rank's sampler
answers but reads no GPU (``no GPU source``) fails ``memory-<tokens>`` naming the rank and the sampler's reason,
and the climb stops; a profile without GPUs one ``memory`` skip.

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
the ladder. Each restart is in ``ladder.json`` (rewritten after every rung, so a deadline that kills the
step keeps what it reached), a ``restart-<context>`` check and ``metrics.engine_restarts``.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from collections.abc import Callable
from typing import Any

import httpx

from gauntlet.steps.gate import Needs
from gauntlet.params.models import EngineSpec, Profile, Rung
from gauntlet.steps.client.answers import sanity_problems
from gauntlet.steps.client.replies import Exchange, chat_answer
from gauntlet.steps.gates._ladder_restart import EngineContext, Restart
from gauntlet.contract import Check, CheckStatus, Status, TransientError, UsageError, write_json_atomic
from gauntlet.steps.gates.shared_options import check_endpoint
from gauntlet.steps.gates.shared_options import engine_option
from gauntlet.steps.client.http import EngineClient
from gauntlet.steps.engines import engine as engine_of
from gauntlet.steps.options import GateOptions, option

NAME = "longctx"
HELP = "Gate 5: long-context ladder (needle in a haystack at several depths), stop at the first failure"
NEEDS = Needs(engine_ranks=True, api="manage")     # restarts the engine for a longer rung

__all__ = ["Options", "RungResult", "build_haystack", "judge_answer", "judge_reply", "rung_outcome", "judge_rung",
           "blocked_reason", "plan_context", "known_miss", "reply_budget", "rank_memory", "judge_memory",
           "check_status", "run_ladder", "run", "EXHAUSTED", "IN_REASONING"]

_WORDS = ("river mountain window garden copper lantern harbor meadow violet engine quiet silver market "
          "thunder pocket ribbon canyon marble pepper saddle timber velvet walnut anchor bridge candle desert "
          "feather glacier island jungle kettle ladder mirror needle orchard pillow quartz rocket shadow "
          "tunnel umbrella valley wagon yellow zipper autumn basket circle dolphin ember forest granite").split()
QUESTION = "What is the secret passcode mentioned in the text above? Reply with the passcode only."
ANSWER_MARGIN_TOKENS = 16       # chat template / special tokens the count may miss
EXHAUSTED = "budget exhausted by reasoning"     # finish_reason 'length' and no final answer
IN_REASONING = "needle only in reasoning"       # the passcode in the thinking, not in the final answer
REASONING_KEPT_CHARS = 600      # the reasoning's tail kept per probe (where a model concludes)


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
    finish_reason: str | None = None
    completion_tokens: int | None = None
    cause: str = ""                 # why it did not pass: EXHAUSTED, IN_REASONING, "needle missed", ...
    reasoning: str = ""             # the reasoning's last REASONING_KEPT_CHARS characters
    reasoning_chars: int = 0
    reasoning_field: str | None = None   # the message field that carried it (`reasoning`, `reasoning_content`)


@dataclass
class RungResult:
    tokens: int
    expect: str
    outcome: str                    # passed | missed | exhausted | refused | error | blocked | not-run
    status: Status = "skip"         # the judged status (a probe's check shows "probe" instead: check_status)
    label: str = ""                 # what a person reads in the ladder table
    detail: str = ""
    probes: list[Probe] = field(default_factory=list)
    context: int | None = None      # the context the engine served when the rung was sent (None: unknown)
    probe: bool = False             # Rung.probe: its checks never fail the gate
    memory: dict[str, Any] = field(default_factory=dict)   # per rank: peak GPU memory in the rung's window
    memory_status: Status = "skip"  # judge_memory's: "fail" stops the climb
    memory_detail: str = ""


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


def _has_needle(text: str | None, passcode: str) -> bool:
    number, word = passcode.split("-")
    return number in (text or "") and word.lower() in (text or "").lower()


def judge_answer(text: str | None, finish_reason: str | None, passcode: str) -> tuple[bool, list[str]]:
    """(needle found, sanity problems) for one final answer (pure)."""
    problems = sanity_problems(text, finish_reason, allowed_finish=("stop", "length"))
    return _has_needle(text, passcode) and not problems, problems


def judge_reply(content: str | None, reasoning: str | None, finish_reason: str | None,
                passcode: str) -> tuple[bool, list[str], str]:
    """(needle found in the final answer, its sanity problems, why not: '' when found) for one reply (pure).

    Only ``content`` can pass. No final answer and finish_reason ``length`` is :data:`EXHAUSTED`: the budget
    ran out while the model was thinking, whatever the thinking held. A passcode in the reasoning alone is
    :data:`IN_REASONING`."""
    found, problems = judge_answer(content, finish_reason, passcode)
    if found:
        return True, [], ""
    if not (content or "").strip() and finish_reason == "length":
        return False, [], EXHAUSTED
    if _has_needle(reasoning, passcode):
        return False, problems, IN_REASONING
    return False, problems, "" if _has_needle(content, passcode) else "needle missed"


def rung_outcome(probes: list[Probe]) -> str:
    if any(p.status is not None and 400 <= p.status < 500 for p in probes):
        return "refused"
    if any(p.status is None or p.status >= 500 for p in probes):
        return "error"
    if all(p.found for p in probes):
        return "passed"
    return "exhausted" if any(p.cause == EXHAUSTED for p in probes) else "missed"


def judge_rung(rung: Rung, outcome: str, probes: list[Probe]) -> tuple[Status, str, str]:
    """(check status, label, detail) for a rung's outcome against its expectation (pure)."""
    n = rung.tokens
    missed = [f"{p.depth:.0%}" for p in probes if not p.found]
    why = "; ".join(sorted({x for p in probes for x in p.problems} | {p.cause for p in probes
                                                                        if p.cause == IN_REASONING}))[:200]
    err = next((p.error or f"HTTP {p.status}" for p in probes if p.status is None or (p.status or 0) >= 400), "")
    if outcome == "error":
        return "fail", "crash", f"{n} tokens: engine error ({err}), not a clean refusal"
    if outcome == "exhausted" and rung.expect != "refused":
        cut = next(p for p in probes if p.cause == EXHAUSTED)
        return "fail", EXHAUSTED, (
            f"{n} tokens, depth {cut.depth:.0%}: finish_reason 'length' after {cut.completion_tokens} completion "
            f"tokens with no final answer ({cut.reasoning_chars} characters of reasoning): the needle was never "
            "answered, not missed; raise longctx.reasoning_tokens")
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

    def chat(self, content: str, max_tokens: int) -> Exchange:
        return self.client.chat({"model": self.model, "messages": [{"role": "user", "content": content}],
                                 "max_tokens": max_tokens, "temperature": 0})


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


def reply_budget(profile: Profile) -> int:
    """Each request's max_tokens: the final answer's (``longctx.max_tokens``) plus the thinking budget a reasoning
    model spends first (``Profile.longctx_reasoning_tokens``); the rung's prompt leaves room for all of it."""
    return profile.longctx.max_tokens + profile.longctx_reasoning_tokens


def _probe(ex: Exchange, depth: float, code: str, counted: int | None) -> Probe:
    """One needle request's evidence and judgement (pure): the final answer, the reasoning (steps/client/replies.py
    chat_answer reads vLLM 0.32's ``reasoning`` and SGLang's ``reasoning_content``), why it did not pass."""
    p = Probe(depth, code, counted, ex.status, error=ex.error[:200] if ex.error else None,
              seconds=round(ex.seconds, 2))
    body = ex.body
    if ex.status == 200 and isinstance(body, dict):
        a = chat_answer(ex)
        p.answer = a.content[:300]
        p.finish_reason = a.finish_reason
        p.reasoning, p.reasoning_chars = a.reasoning[-REASONING_KEPT_CHARS:], len(a.reasoning)
        p.reasoning_field = a.reasoning_field
        usage: dict[str, Any] = body["usage"] if isinstance(body.get("usage"), dict) else {}
        p.prompt_tokens = usage.get("prompt_tokens", counted)
        p.completion_tokens = usage.get("completion_tokens")
        p.found, p.problems, p.cause = judge_reply(a.content, a.reasoning, a.finish_reason, code)
    elif ex.status is not None:
        msg = (body or {}).get("error", {}) if isinstance(body, dict) else {}
        p.error = f"HTTP {ex.status}: {(msg.get('message') if isinstance(msg, dict) else msg) or ''}"[:200]
    return p


def run_rung(client: _Session, rung: Rung, depths: list[float], max_tokens: int) -> RungResult:
    """The rung's needles, one depth at a time; ``max_tokens`` is each reply's whole budget (:func:`reply_budget`)."""
    target = rung.tokens - max_tokens - ANSWER_MARGIN_TOKENS
    probes = []
    for d in depths:
        code = passcode_for(rung.tokens, d)
        text, counted = _fit(client, target, d, code)
        p = _probe(client.chat(text, max_tokens), d, code, counted)
        probes.append(p)
        if p.status is None or p.status >= 400 or not p.found:
            break  # the rung has already not passed: stop at the first failure, here too
    outcome = rung_outcome(probes)
    verdict, label, detail = judge_rung(rung, outcome, probes)
    return RungResult(rung.tokens, rung.expect, outcome, verdict, label, detail, probes, probe=rung.probe)


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


def rank_memory(ranks: list[dict[str, Any]], why_none: str) -> dict[str, Any]:
    """A rung's memory record from each rank's telemetry of its window (rank_telemetry.round_telemetry): peak GPU
    memory used and the card's total per rank, and why a rank has none (pure)."""
    from gauntlet.steps.cluster.rank_telemetry import no_gpu_source
    rows = [{"rank": r.get("rank"), "where": r.get("where"), "reachable": bool(r.get("reachable")),
             "gpu_source": r.get("gpu_source"), "no_gpu_source": no_gpu_source(r), "samples": r.get("samples", 0),
             "used_gib_max": r.get("gpu_mem_used_gib_max"), "total_gib": r.get("gpu_mem_total_gib"),
             "error": r.get("error")} for r in ranks]
    used = [r["used_gib_max"] for r in rows if r["used_gib_max"] is not None]
    missing = [r["error"] or f"rank {r['rank']} ({r['where']}): GPU source {r['gpu_source']}" for r in rows
               if r["used_gib_max"] is None]
    return {"ranks": rows, "used_gib_max": max(used, default=None),
            "none": "; ".join(missing) if missing else ("" if rows else why_none or "no engine rank to ask")}


def judge_memory(cur: dict[str, Any], prev: tuple[int, dict[str, Any]] | None, tolerance_gib: float,
                 tokens: int) -> tuple[Status, str]:
    """(status, detail) of a rung's memory against the last rung that had readings, ``prev`` = (its tokens, its
    record) (pure). Each rank's peak may grow at most ``tolerance_gib`` from one rung to the next; a rank
    without readings is named, never guessed; no readings at all is a skip that says why. A rank whose sampler
    answered but reads no GPU (on a CDI runtime, a container without the GPU allocation) fails: the memory this
    rule needs cannot be had from it, and the climb would go on unguarded (the same rule as Gate 4's
    ``telemetry/gpu-source``, steps/cluster/rank_telemetry.py)."""
    blind = [f"rank {r['rank']} ({r['where']}): no GPU source ({r['no_gpu_source']})" for r in cur.get("ranks") or []
             if r.get("no_gpu_source")]
    if blind:
        return "fail", (f"{'; '.join(blind)}: GPU memory cannot be judged at {tokens} tokens, the climb stops here; "
                        "the sampler runs in the engine container, which holds the GPUs "
                        "(steps/backends/kubernetes/manifests.py sampler_lines): read its line in the rank's log")
    ranks = {r["rank"]: r for r in cur.get("ranks") or [] if r.get("used_gib_max") is not None}
    if not ranks:
        return "skip", f"GPU memory not read at {tokens} tokens: {cur.get('none')}; the climb goes on unguarded by memory"
    top = max(ranks.values(), key=lambda r: r["used_gib_max"])
    peak = (f"peak {top['used_gib_max']:.1f} GiB" + (f" of {top['total_gib']:.0f}" if top.get("total_gib") else "")
            + f" on rank {top['rank']} ({top['where']})")
    unread = f"; not read: {cur['none']}" if cur.get("none") else ""
    if prev is None:
        return "pass", f"{peak}: the first rung with readings, the next is compared with it{unread}"
    before = {r["rank"]: r for r in prev[1].get("ranks") or [] if r.get("used_gib_max") is not None}
    growth = sorted(((ranks[k]["used_gib_max"] - before[k]["used_gib_max"], k) for k in ranks if k in before),
                    reverse=True)
    if not growth:
        return "pass", f"{peak}; no rank read at both {prev[0]} and {tokens} tokens to compare{unread}"
    g, k = growth[0]
    if g > tolerance_gib:
        return "fail", (f"rank {k} ({ranks[k]['where']}): peak GPU memory grew {g:.1f} GiB from the {prev[0]}-token "
                        f"rung ({before[k]['used_gib_max']:.1f} -> {ranks[k]['used_gib_max']:.1f} GiB), over "
                        f"longctx.memory_growth_max_gib {tolerance_gib:g}: the climb stops here{unread}")
    return "pass", f"{peak}; grew at most {g:+.1f} GiB from the {prev[0]}-token rung (tolerance {tolerance_gib:g}){unread}"


def check_status(probe: bool, status: Status) -> CheckStatus:
    """A check's status: a probe rung's judged pass, fail or error is shown as ``probe``, never a failure."""
    return "probe" if probe and status in ("pass", "fail", "error") else status


def run_ladder(rungs: list[Rung], send: Callable[[Rung], RungResult], blocked: Callable[[Rung], str | None],
               prepare: Callable[[Rung], RungResult | None] | None = None,
               record: Callable[[list[RungResult]], None] | None = None) -> list[RungResult]:
    """Walk the rungs in order; stop after the first one that did not pass or whose memory grew (pure control flow).

    ``blocked(rung)`` comes first (a skipped rung never restarts the engine), then ``prepare(rung)`` (the
    restart a longer rung needs: a RungResult when it failed, else None), then ``send(rung)``; ``record`` is
    given the results so far after each rung (the evidence file)."""
    results: list[RungResult] = []
    stopped_at: int | None = None
    for r in sorted(rungs, key=lambda x: x.tokens):
        if stopped_at is not None:
            results.append(RungResult(r.tokens, r.expect, "not-run", "skip", "not run",
                                      f"not run: the ladder stopped at {stopped_at} tokens", probe=r.probe))
            continue
        why = blocked(r)
        if why:
            results.append(RungResult(r.tokens, r.expect, "blocked", "skip", "refused (known defect)", why,
                                      probe=r.probe))
            stopped_at = r.tokens
        else:
            res = (prepare(r) if prepare else None) or send(r)
            res.probe = r.probe
            results.append(res)
            if (res.outcome != "passed" and not known_miss(r, res)) or res.memory_status == "fail":
                stopped_at = r.tokens
        if record:
            record(results)
    return results


def known_miss(rung: Rung, res: RungResult) -> bool:
    """A miss the profile declares (``expect: fail``, judged "beyond capability (known)"): the ladder goes on
    to the next rung of the task, as it does after a pass (pure). Anything else that did not pass stops it."""
    return rung.expect == "fail" and res.outcome == "missed" and res.status == "pass"


def _checks(engine: str, results: list[RungResult], restarts: list[Restart], gpus: bool) -> list[Check]:
    """The verdict's checks: one per rung, one per restart, the memory of each rung sent (pure)."""
    probe = {r.tokens: r.probe for r in results}
    checks = [Check(f"rung-{r.tokens}", check_status(r.probe, r.status), f"expect {r.expect}" +
                    (" (probe: never fails the gate)" if r.probe else ""), r.label, r.detail) for r in results]
    for rs in restarts:
        bad = not rs.ok or bool(rs.kv_pool)
        detail = (f"{rs.why}: the engine came up at context {rs.to_context} but says its KV pool cannot hold one "
                  f"request of it ({rs.kv_pool})" if rs.ok and rs.kv_pool else f"{rs.why}: {rs.detail}")
        checks.append(Check(f"restart-{rs.to_context}", check_status(probe.get(rs.rung, False),
                            "fail" if bad else "pass"), f"{engine} ready at context {rs.to_context}, its KV pool "
                            "holding one request of it", rs.seconds, detail))
    sent = [r for r in results if r.memory]
    if not gpus:
        checks.append(Check("memory", "skip", None, None, "hardware.gpus_per_node is 0: no GPU memory to judge"))
    else:
        checks += [Check(f"memory-{r.tokens}", check_status(r.probe, r.memory_status),
                         "each rank's peak GPU memory within longctx.memory_growth_max_gib of the rung before",
                         r.memory.get("used_gib_max"), r.memory_detail) for r in sent]
    return checks


def run(opts: Options, out: Path) -> tuple[list[Check], dict[str, Any]]:
    from gauntlet.params import load_images
    from gauntlet.steps.cluster.rank_telemetry import round_telemetry

    profile = opts.the_profile
    engine = profile.engine_name(opts.engine)
    spec = profile.engine(engine)
    rungs = opts.ladder()
    image = load_images().get(spec.image)
    fixes = list(image.fixes) if image else []
    lc = profile.longctx
    budget = reply_budget(profile)
    gpus = profile.hardware.gpus_per_node > 0
    served = EngineContext(opts, engine, out)
    first_context = served.context
    max_position = profile.model.architecture.max_position_embeddings
    notes: dict[int, str] = {}
    last_memory: list[tuple[int, dict[str, Any]]] = []       # the last rung with readings: (tokens, record)
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
        if rs.kv_pool:                  # it serves, but would refuse or truncate this rung: not sent
            return RungResult(r.tokens, r.expect, "error", "fail", "KV pool capped",
                              f"not sent: after the restart at context {target} {engine} says its KV pool cannot hold "
                              f"one request of it ({rs.kv_pool}; evidence: {rs.evidence})", context=served.context)
        return None

    def send(r: Rung) -> RungResult:
        t0 = time.time()
        res = run_rung(session, r, lc.needle_depths, budget)
        res.context = served.context
        if notes.get(r.tokens):
            res.detail += f"; {notes[r.tokens]}"
        if gpus:                        # the rung's window on every rank (a restart may have moved the sampler)
            tgts, why = served.backend.telemetry_targets(profile, engine, out, None)
            res.memory = rank_memory(round_telemetry(tgts, t0, time.time()) if tgts else [], why)
            res.memory_status, res.memory_detail = judge_memory(
                res.memory, last_memory[-1] if last_memory else None, lc.memory_growth_max_gib, r.tokens)
            if res.memory.get("used_gib_max") is not None:
                last_memory.append((r.tokens, res.memory))
        return res

    def doc_of(results: list[RungResult]) -> dict[str, Any]:
        context = {"served_at_start": first_context, "served_at_end": served.context,
                   "record": (served.record or {}).get("record"), "max_position_embeddings": max_position,
                   "note": notes.get(min(notes), "") if notes else ""}
        return {"engine": engine, "context": context, "reply_budget": {
            "max_tokens": budget, "answer": lc.max_tokens, "reasoning": profile.longctx_reasoning_tokens,
            "reasoning_field": engine_of(engine).replies.reasoning_field},
            "restarts": [asdict(rs) for rs in served.restarts], "rungs": [asdict(r) for r in results]}

    try:
        try:
            session.client.get("/v1/models", timeout=30).raise_for_status()
        except httpx.HTTPError as exc:
            raise TransientError(f"engine at {opts.endpoint} not answering: {exc}") from None
        def record(so_far: list[RungResult]) -> None:
            write_json_atomic(out / "ladder.json", doc_of(so_far))

        results = run_ladder(rungs, send, lambda r: blocked_reason(engine, spec, r.tokens, fixes), prepare, record)
    finally:
        session.client.close()
    checks = _checks(engine, results, served.restarts, gpus)
    all_passed = all(r.outcome == "passed" and r.memory_status != "fail" for r in results)
    doc = doc_of(results)
    write_json_atomic(out / "ladder.json", doc)
    return checks, {"outputs": {"unlock_all_lower": all_passed}, "ladder": doc["rungs"], "engine": engine,
                    "context": doc["context"], "engine_restarts": doc["restarts"], "reply_budget": doc["reply_budget"]}
