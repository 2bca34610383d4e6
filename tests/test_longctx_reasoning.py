"""Gate 5 judges a thinking model by its final answer, with room to think first; a probe rung never fails the gate.

Kimi K3 on SGLang 0.5.23 thinks by default: its serving layer feeds the think channel's open marker as the
generation prefix and parses every reply with ``KimiK3Detector(force_reasoning=True)``
(sglang/srt/parser/reasoning_parser.py), so a reply cut by max_tokens inside the think channel is all
``reasoning_content`` and an empty ``content``. The Kimi K3 cannot run here, so a loopback stand-in plays its
*generation* (the think channel, then the response channel, cut at max_tokens: the only stand-in part); the reply
is what SGLang's own code makes of it: the raw text split by SGLang's ``ReasoningParser("kimi_k3")``, the body
built from SGLang's protocol models as ``OpenAIServingChat._build_chat_response``'s non-stream branch builds it
(sglang/srt/entrypoints/openai/serving_chat.py). The gate under test is the real one (``longctx.run``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from loopback import ChatStandIn

from gauntlet.params import load_profile
from gauntlet.params.models import Profile
from gauntlet.steps.gates import longctx
from conftest import require_sglang

KIMI = load_profile("kimi-k3-h20")


@pytest.fixture(scope="module")
def sglang_reply():
    """SGLang's reasoning parser and response models (installed by .ci/install-sglang.sh, CPU-only)."""
    require_sglang()
    from sglang.srt.entrypoints.openai.protocol import (ChatCompletionResponse, ChatCompletionResponseChoice,
                                                        ChatMessage, UsageInfo)
    from sglang.srt.function_call.kimik3_format import MESSAGE_CLOSE, RESPONSE_CLOSE, RESPONSE_OPEN, THINK_CLOSE
    from sglang.srt.parser.reasoning_parser import KimiK3Detector, ReasoningParser

    def reply(raw: str, finish: str, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        parser = ReasoningParser(model_type="kimi_k3", stream_reasoning=False)
        assert isinstance(parser.detector, KimiK3Detector) and parser.detector._in_reasoning   # force_reasoning
        reasoning, text = parser.parse_non_stream(raw)
        choice = ChatCompletionResponseChoice(index=0, finish_reason=finish, message=ChatMessage(
            role="assistant", content=text if text else "", reasoning_content=reasoning if reasoning else None))
        return ChatCompletionResponse(id="c1", model="kimi-k3", choices=[choice], usage=UsageInfo(
            prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens)).model_dump(mode="json")

    reply.markers = (THINK_CLOSE, RESPONSE_OPEN, RESPONSE_CLOSE + MESSAGE_CLOSE)  # type: ignore[attr-defined]
    return reply


class KimiOnSglang(ChatStandIn):
    """A loopback Kimi K3 behind SGLang's reply code: it thinks ``think(code)`` (words; the open marker is the
    generation prefix, so the output starts inside the channel), then answers ``answer(code)``; the output is
    cut at the request's max_tokens (one token a word or a marker) and finishes 'length' when it was."""

    def __init__(self, reply: Callable[..., dict[str, Any]], think: Callable[[str, int], str],
                 answer: Callable[[str, int], str]):
        self.reply, self.think, self.answer = reply, think, answer
        self.max_tokens: list[int] = []

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        text = body["messages"][0]["content"]
        code = re.search(r"passcode is (\S+)\.", text).group(1)
        self.max_tokens.append(body["max_tokens"])
        close, open_, end = self.reply.markers
        tokens = [*self.think(code, len(text)).split(), close, open_, *self.answer(code, len(text)).split(), end]
        cut = tokens[:body["max_tokens"]]
        return self.reply(" ".join(cut), "length" if len(cut) < len(tokens) else "stop", len(text) // 5, len(cut))



THINKING = "Let me read the text carefully and find the sentence that states the passcode . " * 20   # 300 words


def _thinks(code: str, chars: int) -> str:
    return THINKING


def _answers(code: str, chars: int) -> str:
    return f"{code}"


def _ladder(profile: Profile, url: str, rungs: str, tmp_path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The gate as its step runs it (no deployment recorded: nothing restarts), its checks by name and metrics."""
    checks, metrics = longctx.run(longctx.Options(profile=profile, engine="sglang", endpoint=url, rungs=rungs,
                                                  backend="local", run_dir=str(tmp_path)), tmp_path / "longctx")
    return {c.name: c for c in checks}, metrics


def _with(**longctx_fields: Any) -> Profile:
    return KIMI.model_copy(update={"longctx": KIMI.longctx.model_copy(update=longctx_fields)})


def test_the_thinking_budget_is_derived_from_model_reasoning():
    assert load_profile("local-cpu").longctx_reasoning_tokens == 0                 # SmolLM2: no reasoning mode
    assert load_profile("h200-1gpu").longctx_reasoning_tokens == 4096              # Qwen3-8B: the default
    assert KIMI.longctx_reasoning_tokens == KIMI.longctx.reasoning_tokens == 4096    # stated by the profile
    assert longctx.reply_budget(KIMI) == 64 + 4096


def test_a_thinking_model_finds_the_needle_in_its_final_answer(sglang_reply, tmp_path):
    """Fails before the fix: 64 tokens sent, the reply is cut inside the think channel, SGLang's parser files it
    all as reasoning_content, and the gate read an empty content as a missed needle."""
    with KimiOnSglang(sglang_reply, _thinks, _answers) as kimi:
        by, metrics = _ladder(KIMI, kimi.url, "32768", tmp_path)
    assert by["rung-32768"].status == "pass", by["rung-32768"].detail
    assert set(kimi.max_tokens) == {64 + 4096}                   # the answer's 64 plus the thinking budget
    (rung,) = metrics["ladder"]
    for p in rung["probes"]:
        assert p["finish_reason"] == "stop" and p["answer"].strip() == p["passcode"]
        assert p["reasoning_field"] == "reasoning_content" and p["reasoning_chars"] > 1000 and p["reasoning"]
        assert p["prompt_tokens"] and p["completion_tokens"] == len(THINKING.split()) + 3 + 1
    assert metrics["reply_budget"] == {"max_tokens": 4160, "answer": 64, "reasoning": 4096,
                                       "reasoning_field": "reasoning_content"}
    doc = json.loads((tmp_path / "longctx" / "ladder.json").read_text())
    assert doc["rungs"][0]["probes"][0]["reasoning_field"] == "reasoning_content"
    # the ranks' memory: a GPU profile, no sampler recorded here: said, not passed in silence
    assert by["memory-32768"].status == "skip" and "GPU memory not read at 32768 tokens" in by["memory-32768"].detail
    assert "no sampler recorded" in by["memory-32768"].detail


def test_a_budget_spent_thinking_is_its_own_failure_not_a_miss(sglang_reply, tmp_path):
    """Thinking longer than the budget: finish_reason 'length', content empty: "budget exhausted by reasoning"
    at every expectation (even a known capability limit), naming the knob."""
    with KimiOnSglang(sglang_reply, _thinks, _answers) as kimi:
        by, metrics = _ladder(_with(reasoning_tokens=100), kimi.url, "32768", tmp_path)
        rung = by["rung-32768"]
        assert (rung.status, rung.observed) == ("fail", longctx.EXHAUSTED)
        assert "finish_reason 'length' after 164 completion tokens" in rung.detail
        assert "raise longctx.reasoning_tokens" in rung.detail and "needle missed" not in rung.detail
        (probe,) = metrics["ladder"][0]["probes"]                  # stopped at the first depth
        assert (probe["answer"], probe["cause"], probe["reasoning_field"]) == ("", longctx.EXHAUSTED,
                                                                               "reasoning_content")
        known = _with(reasoning_tokens=100, ladder=[KIMI.longctx.ladder[0].model_copy(update={"expect": "fail"})])
        by, _ = _ladder(known, kimi.url, "32768", tmp_path / "known")
        assert (by["rung-32768"].status, by["rung-32768"].observed) == ("fail", longctx.EXHAUSTED)


def test_a_needle_only_in_the_reasoning_is_a_miss_that_says_so(sglang_reply, tmp_path):
    def thinks_it(code: str, chars: int) -> str:
        return f"The text says the secret passcode is {code} . I should not reveal it ."

    with KimiOnSglang(sglang_reply, thinks_it, lambda code, chars: "I cannot share that .") as kimi:
        by, metrics = _ladder(KIMI, kimi.url, "32768", tmp_path)
    rung = by["rung-32768"]
    assert (rung.status, rung.observed) == ("fail", "missed")
    assert longctx.IN_REASONING in rung.detail
    assert metrics["ladder"][0]["probes"][0]["cause"] == longctx.IN_REASONING


def test_a_probe_rung_is_shown_never_fails_and_keeps_1m_locked(sglang_reply, tmp_path):
    """kimi-k3-h20's 256K is a probe: a miss there is check status 'probe' (the verdict passes on the lower rungs)
    and unlock_all_lower stays false; a pass is 'probe' too and, with every lower rung passed, unlocks 1M."""
    def misses_long(code: str, chars: int) -> str:
        return "9999-ZULU" if chars > 400_000 else code

    def thinks_briefly(code: str, chars: int) -> str:      # within 64 tokens: this test is about the probe alone
        return "I will look for it ."

    with KimiOnSglang(sglang_reply, thinks_briefly, misses_long) as kimi:
        by, metrics = _ladder(KIMI, kimi.url, "32768,262144", tmp_path)
    assert by["rung-32768"].status == "pass"
    assert (by["rung-262144"].status, by["rung-262144"].observed) == ("probe", "missed")
    assert "probe" in by["rung-262144"].expected
    from gauntlet.contract import overall_status
    assert overall_status(list(by.values())) == "pass"
    assert metrics["outputs"]["unlock_all_lower"] is False
    assert [r["probe"] for r in metrics["ladder"]] == [False, True]
    with KimiOnSglang(sglang_reply, _thinks, _answers) as kimi:
        by, metrics = _ladder(KIMI, kimi.url, "32768,262144", tmp_path / "found")
    assert by["rung-262144"].status == "probe" and by["rung-262144"].observed == "passed"
    assert metrics["outputs"]["unlock_all_lower"] is True


def test_the_report_shows_a_probe_and_its_memory(tmp_path):
    from gauntlet.contract import Check, Verdict, now_iso
    from gauntlet.steps.evidence.report import write_report
    run = tmp_path / "runs" / "r1"
    ladder = [longctx.RungResult(262144, "pass", "missed", "fail", "missed", "needle missed at depth 10%",
                                 probe=True, memory={"used_gib_max": 120.5}, memory_status="pass",
                                 memory_detail="grew at most +0.2 GiB").__dict__]
    Verdict.of("longctx", now_iso(), [Check("rung-262144", "probe", "expect pass", "missed")],
               {"engine": "sglang", "ladder": ladder}).write(run / "sglang" / "longctx")
    md = write_report(run, []).read_text()
    assert "| 262144 | pass, probe | missed | needle missed at depth 10% | – | 120.5: grew at most +0.2 GiB |" in md
    assert "(+ 1 probe)" in md


# ---- a real engine: vLLM 0.32 CPU with its own kimi_k3 reasoning parser -----------------------------------------

@pytest.fixture(scope="module")
def thinking_vllm(local_model, tmp_path_factory):
    """SmolLM2 on the real vLLM CPU engine, served as Kimi K3 is: ``--reasoning-parser kimi_k3`` (vLLM's
    vllm/reasoning/kimi_k3_reasoning_parser.py) and a chat template whose generation prompt opens the think
    channel, as Kimi K3's does in thinking mode. SmolLM2 never closes it, so vLLM's parser files every reply as
    reasoning (``reasoning``, content null): the reply Kimi K3 gives when max_tokens ends its thinking."""
    import sys

    from conftest import require_vllm
    from gauntlet.steps.engines.commands import engine_command, engine_env
    from gauntlet.steps.engines.local_vllm import EngineError, LocalEngine, free_port
    require_vllm()
    local = load_profile("local-cpu")
    tmp = tmp_path_factory.mktemp("thinking-vllm")
    template = (local_model / "chat_template.jinja").read_text()
    prefix = "{{ '<|im_start|>assistant\n' }}"
    assert prefix in template, "SmolLM2's chat template changed: adapt the think-channel prefix"
    (tmp / "think.jinja").write_text(template.replace(prefix, "{{ '<|im_start|>assistant\n<|open|>think<|sep|>' }}"))
    port = free_port()
    spec = local.engines["vllm"].model_copy(update={"port": port, "reasoning_parser": "kimi_k3"})
    argv = engine_command("vllm", spec, model_path=str(local_model), served_name=local.model.served_name,
                          python=sys.executable, host="127.0.0.1") + ["--chat-template", str(tmp / "think.jinja")]
    engine = LocalEngine(argv, port=port, served_name=local.model.served_name, log_path=tmp / "engine.log",
                         env=engine_env("vllm", spec), startup_timeout_s=spec.startup_timeout_s)
    try:
        engine.launch()
    except EngineError as exc:
        pytest.fail(f"vLLM CPU with --reasoning-parser kimi_k3 did not start: {exc}")
    try:
        yield engine.base_url
    finally:
        engine.stop()


def _thinking_local(**longctx_fields: Any) -> Profile:
    local = load_profile("local-cpu")
    return local.model_copy(update={"model": local.model.model_copy(update={"reasoning": True}),
                                    "longctx": local.longctx.model_copy(update=longctx_fields)})


@pytest.mark.engine
def test_real_vllm_reasoning_replies_are_judged_by_their_final_answer(thinking_vllm, tmp_path):
    """Fails before the fix (content only): both replies were "needle missed ... (empty answer)". Now SmolLM2's
    answer, which vLLM's kimi_k3 parser files as ``reasoning``, is "needle only in reasoning", and a reply cut
    by the budget is "budget exhausted by reasoning"; vLLM's field is kept in the evidence."""
    def ladder(profile: Profile, out: Path) -> tuple[Any, dict[str, Any]]:
        checks, metrics = longctx.run(longctx.Options(profile=profile, engine="vllm", endpoint=thinking_vllm,
                                                      rungs="1024", backend="local", run_dir=str(tmp_path)), out)
        (probe,) = metrics["ladder"][0]["probes"]           # the first depth did not pass: the rung stops there
        print(f"\nvLLM kimi_k3 reply: {probe.get('completion_tokens')} tokens, finish {probe.get('finish_reason')}, "
              f"content {probe['answer']!r}, {probe.get('reasoning_field')} {probe.get('reasoning', '')[-100:]!r}")
        return {c.name: c for c in checks}["rung-1024"], probe

    rung, probe = ladder(_thinking_local(reasoning_tokens=40), tmp_path / "room")
    assert (rung.status, rung.observed) == ("fail", "missed") and longctx.IN_REASONING in rung.detail, rung.detail
    assert (probe["answer"], probe["finish_reason"], probe["cause"]) == ("", "stop", longctx.IN_REASONING)
    assert probe["reasoning_field"] == "reasoning" and probe["passcode"] in probe["reasoning"]
    rung, probe = ladder(_thinking_local(max_tokens=4, reasoning_tokens=0), tmp_path / "cut")
    assert (rung.status, rung.observed) == ("fail", longctx.EXHAUSTED), rung.detail
    assert (probe["answer"], probe["finish_reason"], probe["completion_tokens"]) == ("", "length", 4)
    assert probe["reasoning_field"] == "reasoning" and probe["reasoning_chars"] > 0
