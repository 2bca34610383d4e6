"""What a correct reply looks like on each engine, where the OpenAI API leaves room.

Gate 3 accepts what the OpenAI API allows *and* the engine under test does, and
rejects what no correct engine does. Where engines legitimately differ, the
expectation is per engine, read from the engine's own serving code (the source
file and version are kept with each fact, and docs/smoke-expectations.md lays
them out as a table). Each engine's rules are in its own module (its ``ENGINE.replies``);
:func:`gauntlet.steps.engines.rules_for` finds them, and an engine not registered gets OpenAI's behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ReplyRules", "OPENAI"]


@dataclass(frozen=True)
class ReplyRules:
    """One engine's reply conventions, each with the source that says so."""

    engine: str
    version: str
    named_tool_finish: str            # finish_reason of a call forced by a named tool_choice
    auto_tool_finish: str             # finish_reason when auto tool_choice made a call
    reasoning_field: str | None       # message/delta field carrying the reasoning text (None: not defined)
    sources: dict[str, str] = field(default_factory=dict)
    bare_args_hint: str | None = None     # what explains a tool call whose arguments arrive as a bare value
    tool_choice_flag: str | None = None   # an args.extra flag the engine needs for any tool_choice but none

    def tool_finish(self, mode: str) -> str:
        return self.named_tool_finish if mode == "named" else self.auto_tool_finish


OPENAI = ReplyRules(
    "openai", "API", named_tool_finish="stop", auto_tool_finish="tool_calls", reasoning_field=None,
    sources={"tool_finish": "OpenAI chat completions: 'tool_calls' when the model called a tool, "
                            "'stop' when tool_choice forced a named function"})
