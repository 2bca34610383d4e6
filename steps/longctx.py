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
``refused`` behind ``requires_all_lower``. Whatever the expectation, the ladder
stops after the first rung that did not pass (higher rungs are recorded "not
run"; within a rung, after its first missed depth), so a 1M request never
follows a miss, and ``unlock_all_lower`` (the gate for ``requires_all_lower`` rungs) is
true only when every rung this step ran passed. vLLM rungs at or above
``longctx_blocked_from_tokens`` are refused before sending (skipped with the
reason) unless the image lists ``longctx_fix`` in ``fixes``. Ladder results
never enter the throughput tables.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from gauntlet.steps import Needs
from gauntlet.params.models import EngineSpec, Rung
from gauntlet.steps._answers import sanity_problems
from gauntlet.contract import Check, TransientError, UsageError, write_json_atomic
from gauntlet.steps._shared_options import check_endpoint
from gauntlet.steps._shared_options import engine_option
from gauntlet.steps.engine_client import EngineClient
from gauntlet.steps.options import GateOptions, option

NAME = "longctx"
HELP = "Gate 5: long-context ladder (needle in a haystack at several depths), stop at the first failure"
NEEDS = Needs()

__all__ = ["Options", "RungResult", "build_haystack", "judge_answer", "rung_outcome", "judge_rung", "blocked_reason",
           "run_ladder", "run"]

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
    status: str = "skip"            # the check's status
    label: str = ""                 # what a person reads in the ladder table
    detail: str = ""
    probes: list[Probe] = field(default_factory=list)


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


def judge_rung(rung: Rung, outcome: str, probes: list[Probe]) -> tuple[str, str, str]:
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
    if engine != "vllm" or limit is None or tokens < limit:
        return None
    if spec.longctx_fix and spec.longctx_fix in fixes:
        return None
    return (f"vLLM rungs >= {limit} tokens are refused until the image lists fix "
            f"{spec.longctx_fix!r} in images/engines.yaml (known long-context defect)")


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
    status, label, detail = judge_rung(rung, outcome, probes)
    return RungResult(rung.tokens, rung.expect, outcome, status, label, detail, probes)


def run_ladder(rungs: list[Rung], send, blocked) -> list[RungResult]:
    """Walk the rungs in order; stop after the first one that did not pass (pure control flow)."""
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
        res = send(r)
        results.append(res)
        if res.outcome != "passed":
            stopped_at = r.tokens
    return results


def run(opts: Options, out: Path) -> tuple[list[Check], dict[str, Any]]:
    from gauntlet.params import load_images

    profile = opts.the_profile
    engine = profile.engine_name(opts.engine)
    spec = profile.engine(engine)
    rungs = opts.ladder()
    image = load_images().get(spec.image)
    fixes = list(image.fixes) if image else []
    lc = profile.longctx
    with EngineClient(opts.endpoint, lc.timeout_s, keep_alive=spec.keep_alive) as client:
        try:
            client.get("/v1/models", timeout=30).raise_for_status()
        except httpx.HTTPError as exc:
            raise TransientError(f"engine at {opts.endpoint} not answering: {exc}") from None
        session = _Session(client, profile.model.served_name)
        results = run_ladder(rungs, lambda r: run_rung(session, r, lc.needle_depths, lc.max_tokens),
                             lambda r: blocked_reason(engine, spec, r.tokens, fixes))
    checks = [Check(f"rung-{r.tokens}", r.status, f"expect {r.expect}", r.label, r.detail) for r in results]
    all_passed = all(r.outcome == "passed" for r in results)
    doc = {"engine": engine, "rungs": [asdict(r) for r in results]}
    write_json_atomic(out / "ladder.json", doc)
    return checks, {"outputs": {"unlock_all_lower": all_passed}, "ladder": doc["rungs"], "engine": engine}
