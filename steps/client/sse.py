"""Parsing and judging an OpenAI-style server-sent-events stream.

:func:`parse_sse` takes the raw body text (framing included, so a malformed
stream is caught, not papered over by a client library) and returns what the
stream said and what was wrong with it. Pure: Gate 3 feeds it the bytes it read.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SSEStream", "parse_sse", "sse_events"]

DONE = "[DONE]"


def sse_events(raw: str) -> list[str]:
    """The ``data`` payload of each event, in order (SSE framing: blank line ends an event)."""
    events: list[str] = []
    data: list[str] | None = None
    for line in re.split(r"\r\n|\r|\n", raw):
        if line == "":
            if data is not None:
                events.append("\n".join(data))
            data = None
            continue
        if line.startswith(":"):
            continue  # comment / keep-alive
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            data = [*(data or []), value]
    if data is not None:  # last event without its blank line: still an event, flagged below
        events.append("\n".join(data))
    return events


@dataclass
class SSEStream:
    """What a chat-completion stream said, and every way it broke the format."""

    chunks: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False
    content: str = ""
    reasoning: str = ""
    finish_reason: str | None = None
    tool_call_chunks: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def well_formed(self) -> bool:
        return not self.problems


def parse_sse(raw: str, *, object_name: str = "chat.completion.chunk") -> SSEStream:
    """Parse a chat-completion SSE body; ``problems`` lists each framing or shape error."""
    s = SSEStream()
    if not raw.strip():
        s.problems.append("empty stream")
        return s
    if not re.search(r"(\r\n|\r|\n){2}$", raw) and raw.strip():
        s.problems.append("stream does not end with a blank line (last event unterminated)")
    events = sse_events(raw)
    if not events:
        s.problems.append("no data events in the stream")
        return s
    ids: set[str] = set()
    finishes: list[str] = []
    for i, data in enumerate(events):
        if s.done:
            s.problems.append(f"event {i}: data after [DONE]: {data[:60]!r}")
            break
        if data == DONE:
            s.done = True
            continue
        try:
            chunk = json.loads(data)
        except ValueError:
            s.problems.append(f"event {i}: data is not JSON: {data[:60]!r}")
            continue
        if not isinstance(chunk, dict):
            s.problems.append(f"event {i}: data is JSON {type(chunk).__name__}, not an object")
            continue
        if "error" in chunk:
            err = chunk["error"]
            msg = err.get("message") if isinstance(err, dict) else err
            s.problems.append(f"event {i}: error in stream: {str(msg)[:80]}")
            continue
        s.chunks.append(chunk)
        if chunk.get("object") != object_name:
            s.problems.append(f"event {i}: object {chunk.get('object')!r}, expected {object_name!r}")
        if isinstance(chunk.get("id"), str):
            ids.add(chunk["id"])
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            s.problems.append(f"event {i}: no 'choices' list")
            continue
        for ch in choices:
            delta = ch.get("delta") if isinstance(ch, dict) else None
            if not isinstance(delta, dict):
                s.problems.append(f"event {i}: choice without a 'delta' object")
                continue
            if ch.get("index", 0) != 0:
                continue  # one choice asked for; other indices are reported by the count below
            # vLLM 0.32 says `reasoning`, older vLLM and SGLang `reasoning_content`; some send both
            rkey = "reasoning" if delta.get("reasoning") is not None else "reasoning_content"
            for key, attr in (("content", "content"), (rkey, "reasoning")):
                piece = delta.get(key)
                if piece is not None:
                    if not isinstance(piece, str):
                        s.problems.append(f"event {i}: delta.{key} is {type(piece).__name__}, not text")
                    else:
                        setattr(s, attr, getattr(s, attr) + piece)
            if delta.get("tool_calls"):
                s.tool_call_chunks += 1
            if ch.get("finish_reason") is not None:
                finishes.append(ch["finish_reason"])
    if not s.done:
        s.problems.append("stream did not end with data: [DONE]")
    if len(ids) > 1:
        s.problems.append(f"chunks carry {len(ids)} different ids")
    if not finishes:
        s.problems.append("no chunk carried a finish_reason")
    elif len(finishes) > 1:
        s.problems.append(f"finish_reason sent {len(finishes)} times: {finishes}")
    s.finish_reason = finishes[-1] if finishes else None
    return s
