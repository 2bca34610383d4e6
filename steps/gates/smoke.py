"""Gate 3: the engine answers correctly, not merely with HTTP 200.

Seven checks against an OpenAI-compatible endpoint, each judged on content
(``gauntlet.steps.client.answers``, ``client.replies``, ``client.sse``): served model name; deterministic
arithmetic (the number is parsed out of the answer and compared); reasoning
split; a schema-valid tool call; streaming equal to the non-streamed answer,
and multi-turn recall; image input understood (or, text-only, refused with a
4xx); an invalid image and an over-long prompt refused with an explanatory 4xx,
the engine answering correctly after each. Every answer also passes output
sanity. A failed request is data (status, error body), never an exception.

Tool calling per profile (``smoke.tool_choice``):

- ``local-cpu`` (SmolLM2, vLLM ``--tool-call-parser hermes``): a *named*
  tool_choice, because SmolLM2's chat template has no tools and auto choice
  makes no call. vLLM 0.32 gives named calls finish_reason ``stop`` (as
  OpenAI does), SGLang 0.5.23 ``tool_calls`` (each engine's ``REPLIES``, ``gauntlet.steps.engines.rules_for``). The profile sets ``VLLM_ENFORCE_STRICT_TOOL_CALLING=0``: with
  the default strict structural tags the arguments come back as ``"Paris"``
  (valid JSON, not the schema's object), which this check fails.
- ``kimi-k3-h20`` (SGLang and vLLM, ``--tool-call-parser kimi_k3`` and
  ``--reasoning-parser kimi_k3``): *auto* tool_choice, finish_reason
  ``tool_calls``. vLLM needs ``--enable-auto-tool-choice`` for auto (the
  profile's vllm ``args.extra``); its kimi_k3 parser refuses a named choice
  unless strict tool calling is on, so auto is the one route both engines share.
  SGLang parses tool calls whenever a tool-call parser is set. The reasoning
  text must arrive where the engine's own clients read it: ``reasoning`` (vLLM
  0.32), ``reasoning_content`` (SGLang 0.5.23); thinking markers left in the
  final answer fail. Per-engine expectations and their sources:
  docs/smoke-expectations.md.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from gauntlet.steps.gate import Needs
from gauntlet.params.models import Profile
from gauntlet.steps.client.answers import judge_number, mentions, sanity_problems
from gauntlet.steps.engines import engine as engine_of, rules_for
from gauntlet.contract import Check
from gauntlet.steps.client.probe_image import COLOURS, broken_png, data_url, solid_png
from gauntlet.steps.client.replies import Answer, Exchange, chat_answer, judge_reasoning, judge_refusal, judge_tool_call
from gauntlet.steps.gates.shared_options import check_endpoint
from gauntlet.steps.gates.shared_options import engine_option
from gauntlet.steps.client.sse import parse_sse
from gauntlet.steps.client.http import EngineClient
from gauntlet.steps.options import GateOptions, option

NAME = "smoke"
HELP = "Gate 3: content-correctness smoke (models, arithmetic, reasoning, tools, streaming, images, errors)"
# api manage: a retry finds the engine released and redeploys it (steps/gates/engine_present.py)
NEEDS = Needs(engine_ranks=True, api="manage")

__all__ = ["NAME", "HELP", "NEEDS", "Options", "run", "run_checks", "CHECKS", "WEATHER_TOOL"]

WEATHER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string", "description": "city name, e.g. Paris"}},
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city", "parameters": WEATHER_SCHEMA}}
TOOL_PROMPT = "What is the weather like in Paris right now? Use the get_weather tool."
RECALL_NAME = "Quentin"  # not guessable without turn 1; SmolLM2 copies it exactly ("Zorblat" came back "Zorblad")
IMAGE_COLOUR = "red"


@dataclass(frozen=True, kw_only=True)
class Options(GateOptions):
    endpoint: str = option(help="engine base URL, e.g. http://127.0.0.1:8765 (with or without /v1)")
    engine: str | None = option(None, help="engine name in the profile (default: the baseline engine)")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_endpoint(self.endpoint)
        engine_option(self, self.engine)


@dataclass
class Ctx:
    """What every check needs: the client, the profile, the engine under test."""

    client: EngineClient
    profile: Profile
    engine: str
    answers: dict[str, Any] = field(default_factory=dict)

    @property
    def model(self) -> str:
        return self.profile.model.served_name

    def chat(self, messages: list[dict[str, Any]], **extra: Any) -> tuple[Exchange, Answer]:
        body = {"model": self.model, "messages": messages, "temperature": 0,
                "max_tokens": self.profile.smoke.max_tokens, **extra}
        ex = self.client.chat(body)
        return ex, chat_answer(ex)

    def ask(self, prompt: str, **extra: Any) -> tuple[Exchange, Answer]:
        return self.chat([{"role": "user", "content": prompt}], **extra)


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def _verdict(name: str, problems: list[str], expected: Any, observed: Any, ok_detail: str) -> Check:
    if problems:
        more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
        return Check(name, "fail", expected, observed, "; ".join(problems[:3]) + more)
    return Check(name, "pass", expected, observed, ok_detail)


def _right_answer(ctx: Ctx, label: str) -> list[str]:
    """Ask the first arithmetic probe; problems unless the answer is right and sane."""
    probe = ctx.profile.smoke.arithmetic[0]
    _, a = ctx.ask(probe.prompt)
    problems = list(a.problems) or sanity_problems(a.content, a.finish_reason)
    if not a.problems:
        j = judge_number(a.content, probe.expected)
        if not j.ok:
            problems.append(j.detail)
    ctx.answers[label] = a.content
    return [f"{label}: {p}" for p in problems]


# ---------------------------------------------------------------- the checks


def check_models(ctx: Ctx) -> list[Check]:
    ex = ctx.client.models()
    want = ctx.model
    if ex.status != 200 or not isinstance(ex.body, dict):
        why = ex.summary() if ex.status != 200 else f"HTTP 200 but not a JSON object: {ex.text[:40]!r}"
        return [Check("models", "fail", want, None, why)]
    data = ex.body.get("data")
    ids = [m.get("id") for m in data if isinstance(m, dict)] if isinstance(data, list) else []
    if ex.body.get("object") != "list" or not isinstance(data, list):
        return [Check("models", "fail", want, ids, f"not an OpenAI model list: {ex.text[:80]!r}")]
    if want not in ids:
        return [Check("models", "fail", want, ids,
                      f"served model {want!r} not listed (the engine serves {ids}); "
                      f"check model.served_name in the profile against --served-model-name")]
    return [Check("models", "pass", want, ids, f"/v1/models lists {want!r}")]


def check_arithmetic(ctx: Ctx) -> list[Check]:
    probes = ctx.profile.smoke.arithmetic
    problems: list[str] = []
    observed = []
    first_text = None
    for i, probe in enumerate(probes):
        _, a = ctx.ask(probe.prompt)
        j = judge_number(a.content, probe.expected) if not a.problems else None
        observed.append({"prompt": probe.prompt, "answer": a.content, "parsed": j.parsed if j else None})
        if a.problems:
            problems += [f"{probe.prompt!r}: {p}" for p in a.problems]
            continue
        problems += [f"{probe.prompt!r}: {p}" for p in sanity_problems(a.content, a.finish_reason)]
        if j is not None and not j.ok:      # j is None only when the answer had problems (above)
            problems.append(f"{probe.prompt!r}: {j.detail}")
        if i == 0:
            first_text = a.content
    if first_text is not None:
        # temperature 0 is deterministic: the same question gets the same text
        _, again = ctx.ask(probes[0].prompt)
        observed.append({"prompt": probes[0].prompt, "answer": again.content, "repeat": True})
        if again.problems:
            problems += [f"repeat: {p}" for p in again.problems]
        elif again.content != first_text:
            problems.append(f"not deterministic at temperature 0: {first_text!r} then {again.content!r}")
    ctx.answers["arithmetic"] = observed
    expected = [p.expected for p in probes]
    said = ", ".join("?" if o.get("parsed") is None else f"{o['parsed']:g}" for o in observed if not o.get("repeat"))
    return [_verdict("arithmetic", problems, expected, observed,
                     f"{len(probes)}/{len(probes)} right ({said}), repeat identical")]


def check_reasoning(ctx: Ctx) -> list[Check]:
    if not ctx.profile.model.reasoning:
        return [Check("reasoning", "skip", None, None,
                      f"model.reasoning is false: {ctx.profile.model.id} has no reasoning mode")]
    probe = ctx.profile.smoke.arithmetic[0]
    _, a = ctx.ask(probe.prompt)
    field = rules_for(ctx.engine).reasoning_field
    problems = judge_reasoning(a, field)
    if not a.problems and a.content.strip():
        j = judge_number(a.content, probe.expected)
        if not j.ok:
            problems.append(f"final answer: {j.detail}")
        problems += sanity_problems(a.content, a.finish_reason)
    observed = {"content": a.content, "reasoning_chars": len(a.reasoning), "reasoning_field": a.reasoning_field,
                "finish_reason": a.finish_reason}
    return [_verdict("reasoning", problems, probe.expected, observed,
                     f"{len(a.reasoning)} characters of reasoning in `{a.reasoning_field}`, "
                     f"then the right final answer")]


def check_tool_call(ctx: Ctx) -> list[Check]:
    mode = ctx.profile.smoke.tool_choice
    choice: Any = ({"type": "function", "function": {"name": "get_weather"}} if mode == "named" else "auto")
    finish = rules_for(ctx.engine).tool_finish(mode)
    _, a = ctx.ask(TOOL_PROMPT, tools=[WEATHER_TOOL], tool_choice=choice)
    problems, args = judge_tool_call(a, name="get_weather", schema=WEATHER_SCHEMA, finish_reason=finish)
    if not problems and not mentions(str(args.get("city", "")), "Paris"):
        problems.append(f"asked about Paris, the call says city={args.get('city')!r}")
    if not a.problems:
        problems += [p for p in sanity_problems(a.content, a.finish_reason, allowed_finish=(finish,),
                                                allow_empty=True) if not p.startswith("finish_reason")]
    if problems:
        spec = ctx.profile.engine(ctx.engine)
        rules = rules_for(ctx.engine)
        if isinstance(args, str) and rules.bare_args_hint:
            problems.insert(1, rules.bare_args_hint)
        if spec.tool_call_parser is None:
            problems.append(f"(engines.{ctx.engine} has no tool_call_parser)")
        elif rules.tool_choice_flag and not spec.args.extra.get(rules.tool_choice_flag):
            problems.append(f"(engines.{ctx.engine}.args.extra lacks {rules.tool_choice_flag}, which "
                            f"{engine_of(ctx.engine).title} needs for any tool_choice but none)")
    observed = {"tool_calls": a.tool_calls, "finish_reason": a.finish_reason, "content": a.content}
    return [_verdict("tool-call", problems, {"name": "get_weather", "arguments": {"city": "Paris"},
                                             "tool_choice": mode, "finish_reason": finish},
                     observed, f"{mode} tool_choice: get_weather({json.dumps(args)}), finish_reason {finish!r}")]


def check_streaming(ctx: Ctx) -> list[Check]:
    probe = ctx.profile.smoke.arithmetic[0]
    body = {"model": ctx.model, "messages": [_user(probe.prompt)], "temperature": 0,
            "max_tokens": ctx.profile.smoke.max_tokens}
    _, plain = ctx.ask(probe.prompt)
    ex, raw = ctx.client.stream("/v1/chat/completions", body)
    s = parse_sse(raw)
    problems: list[str] = []
    if ex.status is None:
        problems.append(f"no response: {ex.error}")
    elif ex.status != 200:
        problems.append(f"HTTP {ex.status}: {ex.text[:120]!r}")
    else:
        if ex.error:
            problems.append(ex.error)
        problems += s.problems
        problems += sanity_problems(s.content, s.finish_reason)
        j = judge_number(s.content, probe.expected)
        if not j.ok:
            problems.append(f"streamed answer: {j.detail}")
        if plain.problems:
            problems += [f"non-streamed: {p}" for p in plain.problems]
        elif s.content != plain.content:
            problems.append(f"streamed text {s.content!r} differs from the non-streamed {plain.content!r}")
    observed = {"streamed": s.content, "non_streamed": plain.content, "events": len(s.chunks) + s.done,
                "finish_reason": s.finish_reason}
    return [_verdict("streaming", problems, plain.content or None, observed,
                     f"{observed['events']} SSE events ending [DONE]; assembled text equals the non-streamed answer")]


def check_multi_turn(ctx: Ctx) -> list[Check]:
    first = _user(f"My name is {RECALL_NAME}. Please greet me in one short sentence.")
    _, a1 = ctx.chat([first])
    problems = [f"turn 1: {p}" for p in (a1.problems or sanity_problems(a1.content, a1.finish_reason))]
    if a1.problems:
        return [_verdict("multi-turn", problems, RECALL_NAME, {"turn1": a1.content}, "")]
    history = [first, {"role": "assistant", "content": a1.content},
               _user("What is my name? Answer with just the name.")]
    _, a2 = ctx.chat(history)
    problems += [f"turn 2: {p}" for p in (a2.problems or sanity_problems(a2.content, a2.finish_reason))]
    if not a2.problems and not mentions(a2.content, RECALL_NAME):
        problems.append(f"turn 2 did not use turn 1: asked for the name, got {a2.content[:80]!r}")
    return [_verdict("multi-turn", problems, RECALL_NAME, {"turn1": a1.content, "turn2": a2.content},
                     f"turn 2 recalled {RECALL_NAME!r} from turn 1")]


def _image_message(url: str, text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": text}]}]


def _refused_then_right(ctx: Ctx, name: str, ex: Exchange, keywords: tuple[str, ...], what: str) -> Check:
    problems = judge_refusal(ex, keywords)
    message = ex.body.get("error", ex.body) if isinstance(ex.body, dict) else ex.text[:200]
    alive = _right_answer(ctx, f"after {what}")
    observed = {"status": ex.status, "error": message if ex.status else ex.error,
                "answer_after": ctx.answers.get(f"after {what}")}
    detail_msg = message.get("message") if isinstance(message, dict) else message
    return _verdict(name, problems + alive, "4xx with an explanation, then a right answer", observed,
                    f"HTTP {ex.status} ({str(detail_msg)[:90]}), then answered correctly")


def check_image(ctx: Ctx) -> list[Check]:
    prompt = "What colour is this image? Answer with one word."
    url = data_url(solid_png(IMAGE_COLOUR))
    if not ctx.profile.model.multimodal:
        skip = Check("image", "skip", None, None,
                     f"model.modalities {list(ctx.profile.model.modalities)}: text-only, no image understanding")
        ex = ctx.client.request("POST", "/v1/chat/completions",
                                {"model": ctx.model, "messages": _image_message(url, prompt), "temperature": 0,
                                 "max_tokens": ctx.profile.smoke.max_tokens})
        return [skip, _refused_then_right(ctx, "image-refused", ex, (), "the image")]
    if not ctx.profile.smoke.image_probe:
        return [Check("image", "skip", None, None, "smoke.image_probe is false in the profile")]
    _, a = ctx.chat(_image_message(url, prompt))
    problems = list(a.problems) or sanity_problems(a.content, a.finish_reason)
    if not a.problems:
        if not mentions(a.content, IMAGE_COLOUR):
            problems.append(f"the image is solid {IMAGE_COLOUR}; the answer was {a.content[:80]!r}")
        wrong = [c for c in COLOURS if c != IMAGE_COLOUR and mentions(a.content, c)]
        if wrong:
            problems.append(f"also names {wrong}: not an answer about this image")
    return [_verdict("image", problems, IMAGE_COLOUR, a.content, f"named the solid {IMAGE_COLOUR} PNG's colour")]


def check_bad_inputs(ctx: Ctx) -> list[Check]:
    prompt = "What colour is this image? Answer with one word."
    body = {"model": ctx.model, "messages": _image_message(data_url(broken_png()), prompt), "temperature": 0,
            "max_tokens": ctx.profile.smoke.max_tokens}
    ex = ctx.client.request("POST", "/v1/chat/completions", body)
    checks = [_refused_then_right(ctx, "invalid-image", ex, (), "the invalid image")]
    ctx_len = ctx.profile.engine(ctx.engine).args.context_length
    # one short common word is about one token on any tokenizer: 1.5x the context is surely over it
    long_prompt = "apple " * (ctx_len * 3 // 2) + "\nHow many apples?"
    ex = ctx.client.request("POST", "/v1/chat/completions",
                            {"model": ctx.model, "messages": [_user(long_prompt)], "max_tokens": 8})
    checks.append(_refused_then_right(ctx, "over-long-prompt", ex,
                                      ("context", "token", "length", "long", "exceed"),
                                      f"the {ctx_len * 3 // 2}-word prompt"))
    return checks


CHECKS: list[tuple[str, Callable[[Ctx], list[Check]]]] = [
    ("models", check_models),
    ("arithmetic", check_arithmetic),
    ("reasoning", check_reasoning),
    ("tool-call", check_tool_call),
    ("streaming", check_streaming),
    ("multi-turn", check_multi_turn),
    ("image", check_image),
    ("bad-inputs", check_bad_inputs),
]


def known_deviations(checks: list[Check], declared: dict[str, str], engine: str, alive: list[str],
                     hung: Collection[str] = ()) -> tuple[list[Check], dict[str, Any]]:
    """Apply ``engines.<engine>.known_deviations`` (pure). A declared check that fails is recorded as a
    known deviation (status skip, the reason and what was seen kept) only when the engine *answered* it and
    stayed up: ``hung`` names the checks during which a request got no answer (a timeout, a connection lost)
    and ``alive`` holds the problems seen after every check (a wrong arithmetic answer, /health not 200, a rank
    that exited or restarted). A hang or a rank down is never the declared deviation: those checks stay
    failures. A declared check that passes fails, so a fixed engine forces the list to be cleaned; a declared
    name that is no Gate 3 check fails."""
    if not declared:
        return checks, {}
    names = {c.name for c in checks}
    out: list[Check] = []
    record: dict[str, Any] = {}
    for c in checks:
        why = declared.get(c.name)
        if why is None:
            out.append(c)
        elif c.status == "pass":
            out.append(Check(c.name, "fail", "the declared deviation", c.observed,
                             f"engines.{engine}.known_deviations declares {c.name!r}, but the engine now passes "
                             f"it ({c.detail}): remove it from the profile"))
        elif c.status != "fail":
            out.append(c)
        elif c.name in hung:
            out.append(Check(c.name, "fail", c.expected, c.observed,
                             f"{c.detail}; not excused as a known deviation: a request of this check got no "
                             "answer in time (the engine hung or went away), which no declaration covers"))
        elif alive:
            out.append(Check(c.name, "fail", c.expected, c.observed,
                             f"{c.detail}; not excused as a known deviation: {'; '.join(alive)}"))
        else:
            record[c.name] = {"reason": why, "observed": c.detail}
            out.append(Check(c.name, "skip", c.expected, c.observed,
                             f"known deviation (engines.{engine}.known_deviations): {c.detail} | why: {why}"))
    unknown = sorted(set(declared) - names)
    if unknown:
        out.append(Check("known-deviations", "fail", sorted(names), unknown,
                         f"engines.{engine}.known_deviations names {', '.join(unknown)}: not a Gate 3 check "
                         f"({', '.join(sorted(names))})"))
    return out, record


def _health(ctx: Ctx) -> list[str]:
    """GET /health after every check: 200, or why not (SGLang 0.5.23 answers 503 while it starts or shuts down,
    ``sglang/srt/entrypoints/http_server.py`` ``health_generate``; vLLM and llama.cpp's server 200 once ready)."""
    try:
        r = ctx.client.health()
    except httpx.HTTPError as exc:
        return [f"GET /health after every check: no answer ({type(exc).__name__}: {exc})"]
    return [] if r.status_code == 200 else [f"GET /health after every check: HTTP {r.status_code}"]


def run_checks(client: EngineClient, profile: Profile, engine: str,
               after: Callable[[str], None] | None = None,
               ranks: Callable[[], list[str]] | None = None) -> tuple[list[Check], dict[str, float]]:
    """Every check in order, each independent of the others; ``after(name)`` runs between them.
    The engine's declared known deviations are applied last (:func:`known_deviations`), after one more right
    answer, a /health probe and ``ranks()`` (the problems of the engine's ranks since the gate began: the rank
    watch; None: not watched)."""
    ctx = Ctx(client, profile, engine)
    checks: list[Check] = []
    seconds: dict[str, float] = {}
    hung: set[str] = set()
    for name, fn in CHECKS:
        t0, unanswered = time.monotonic(), client.unanswered
        got = fn(ctx)
        checks += got
        if client.unanswered > unanswered:      # which request of the group it was is not known: all of them
            hung |= {c.name for c in got}
        seconds[name] = round(time.monotonic() - t0, 3)
        if after is not None:
            after(name)
    declared = dict(profile.engines[engine].known_deviations) if engine in profile.engines else {}
    if declared:
        alive = _right_answer(ctx, "after every check") + _health(ctx) + (ranks() if ranks is not None else [])
        checks, _ = known_deviations(checks, declared, engine, alive, hung)
    return checks, seconds


def _rank_watch(profile: Profile, engine: str, out: Path) -> Callable[[], list[str]] | None:
    """Read the deployed engine's ranks now; return a function giving the ranks that exited, restarted or were
    replaced since (``steps/gates/watch_ranks.py``, the runner's rank watch); None when there are none to watch
    or they cannot be read (the runner's ``engine_ranks`` check says so for the whole gate)."""
    from gauntlet.steps.gates.watch_ranks import check, snapshot
    before = snapshot(profile, engine, out)
    if not before or isinstance(before, str):
        return None

    def problems() -> list[str]:
        c = check(NAME, before, snapshot(profile, engine, out))
        return [c.detail] if c.status == "fail" else []
    return problems


def run(opts: Options, out: Path) -> tuple[list[Check], dict[str, Any]]:
    profile = opts.the_profile
    engine = profile.engine_name(opts.engine)
    # a declared deviation is excused only while every rank stays up: watch them from here when there is one
    ranks = _rank_watch(profile, engine, out) if profile.engine(engine).known_deviations else None
    with EngineClient(opts.endpoint, profile.smoke.request_timeout_s, keep_log=True,
                      keep_alive=profile.engine(engine).keep_alive) as client:
        checks, seconds = run_checks(client, profile, engine, ranks=ranks)
    declared = profile.engine(engine).known_deviations
    deviations = {c.name: {"reason": declared[c.name], "observed": c.observed}
                  for c in checks if c.status == "skip" and c.name in declared}
    with (out / "exchanges.jsonl").open("w") as fh:
        for ex in client.log:
            fh.write(json.dumps(ex.to_record()) + "\n")
    metrics = {"endpoint": client.base, "engine": engine, "requests": len(client.log),
               "failed_requests": sum(1 for e in client.log if e.status is None or e.status >= 500),
               "request_seconds": round(sum(e.seconds for e in client.log), 3), "check_seconds": seconds,
               "known_deviations": deviations}
    return checks, metrics
