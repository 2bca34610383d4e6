"""What an OpenAI-compatible server answered, as data, and judgements over it.

An :class:`Exchange` is one request and whatever came back: status and body,
or the transport error when nothing came back (a failed request is data, not
an exception). The judge functions are pure and return lists of problems
(empty = fine), so Gate 3 can say exactly why a reply does not count.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import jsonschema

__all__ = ["Exchange", "Answer", "chat_answer", "error_message", "judge_refusal", "judge_tool_call",
           "judge_reasoning", "THINK_MARKERS"]

# raw reasoning delimiters that must not leak into the final answer when a reasoning parser runs
THINK_MARKERS = ("<think>", "</think>", "◁think▷", "◁/think▷")


@dataclass
class Exchange:
    """One HTTP request and its outcome; ``status`` is None when no response came back."""

    method: str
    path: str
    status: int | None = None
    body: Any = None            # parsed JSON, when the response was JSON
    text: str = ""              # raw response text (clipped when kept as evidence)
    error: str | None = None    # transport error: "ConnectError: ...", "ReadTimeout: ..."
    seconds: float = 0.0

    @property
    def reached(self) -> bool:
        return self.status is not None

    def summary(self) -> str:
        if self.status is None:
            return f"{self.method} {self.path}: no response ({self.error})"
        return f"{self.method} {self.path}: HTTP {self.status}"

    def to_record(self, clip: int = 2000) -> dict[str, Any]:
        text = self.text if len(self.text) <= clip else self.text[:clip] + f"... [{len(self.text)} chars]"
        return {"method": self.method, "path": self.path, "status": self.status, "error": self.error,
                "seconds": round(self.seconds, 3), "text": text}


@dataclass
class Answer:
    """The first choice of a chat completion, with what was wrong with its shape."""

    content: str = ""
    reasoning: str = ""
    reasoning_field: str | None = None   # which message field carried it: `reasoning` or `reasoning_content`
    finish_reason: str | None = None
    tool_calls: list[Any] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def chat_answer(ex: Exchange) -> Answer:
    """The answer in a chat-completion exchange; ``problems`` says why there is none."""
    a = Answer()
    if ex.status is None:
        a.problems.append(f"no response: {ex.error}")
        return a
    if ex.status != 200:
        a.problems.append(f"HTTP {ex.status}: {error_message(ex) or ex.text[:120]!r}")
        return a
    body = ex.body
    if not isinstance(body, dict):
        a.problems.append(f"HTTP 200 but the body is not a JSON object: {ex.text[:40]!r}")
        return a
    if body.get("object") != "chat.completion":
        a.problems.append(f"object {body.get('object')!r}, expected 'chat.completion'")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        a.problems.append("no choices in the completion")
        return a
    ch = choices[0]
    msg = ch.get("message")
    if not isinstance(msg, dict):
        a.problems.append("choice has no message object")
        return a
    if msg.get("role") != "assistant":
        a.problems.append(f"message role {msg.get('role')!r}, expected 'assistant'")
    content = msg.get("content")
    if content is not None and not isinstance(content, str):
        a.problems.append(f"message content is {type(content).__name__}, not text")
        content = str(content)
    a.content = content or ""
    # vLLM 0.32 says `reasoning`; older vLLM and SGLang say `reasoning_content` (steps/engines/replies.py)
    for key in ("reasoning", "reasoning_content"):
        if isinstance(msg.get(key), str) and msg[key]:
            a.reasoning, a.reasoning_field = msg[key], key
            break
    a.finish_reason = ch.get("finish_reason")
    tcs = msg.get("tool_calls")
    a.tool_calls = tcs if isinstance(tcs, list) else []
    return a


def error_message(ex: Exchange) -> str | None:
    """The server's explanation in an error body, whichever common shape it uses."""
    body = ex.body
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err["message"]          # OpenAI / vLLM: {"error": {"message", "type", ...}}
        if isinstance(err, str):
            return err
        if isinstance(body.get("message"), str):
            return body["message"]         # SGLang: {"object": "error", "message": ...}
        detail = body.get("detail")
        if isinstance(detail, str):
            return detail                  # FastAPI default
        if isinstance(detail, list) and detail:
            return json.dumps(detail)[:300]
    return None


def judge_refusal(ex: Exchange, keywords: tuple[str, ...] = ()) -> list[str]:
    """Problems with a reply that should be a 4xx refusal with an explanatory message."""
    if ex.status is None:
        return [f"no response: {ex.error} (engine dead or unreachable)"]
    if ex.status >= 500:
        return [f"HTTP {ex.status}: a server error where a 4xx refusal was due ({ex.text[:120]!r})"]
    if not 400 <= ex.status < 500:
        return [f"HTTP {ex.status}: accepted a request that must be refused"]
    msg = error_message(ex)
    if not msg or len(msg.strip()) < 10:
        return [f"HTTP {ex.status} without an explanatory message (body {ex.text[:120]!r})"]
    if keywords and not any(k.lower() in msg.lower() for k in keywords):
        return [f"HTTP {ex.status} but the message does not say why (none of {list(keywords)}): {msg[:120]!r}"]
    return []


def judge_tool_call(a: Answer, *, name: str, schema: dict[str, Any], finish_reason: str) -> tuple[list[str], Any]:
    """Problems with a tool call answer, and the parsed arguments.

    OpenAI shape: one ``tool_calls`` entry with an id, type ``function``, the
    function's name and ``arguments`` as a JSON *string* that validates against
    the tool's JSON schema (vLLM 0.32 with strict structural tags returns
    ``"Paris"``: valid JSON, wrong shape, caught here).
    """
    problems = list(a.problems)
    if problems:
        return problems, None
    if a.finish_reason != finish_reason:
        problems.append(f"finish_reason {a.finish_reason!r}, expected {finish_reason!r}")
    if not a.tool_calls:
        problems.append(f"no tool_calls in the message (content {a.content[:80]!r})")
        return problems, None
    if len(a.tool_calls) != 1:
        problems.append(f"{len(a.tool_calls)} tool calls, expected exactly 1")
    tc = a.tool_calls[0]
    if not isinstance(tc, dict):
        return [*problems, f"tool call is {type(tc).__name__}, not an object"], None
    if not isinstance(tc.get("id"), str) or not tc["id"]:
        problems.append("tool call has no id")
    if tc.get("type") != "function":
        problems.append(f"tool call type {tc.get('type')!r}, expected 'function'")
    fn = tc.get("function")
    if not isinstance(fn, dict):
        return [*problems, "tool call has no function object"], None
    if fn.get("name") != name:
        problems.append(f"called {fn.get('name')!r}, expected {name!r}")
    raw = fn.get("arguments")
    if not isinstance(raw, str):
        return [*problems, f"arguments are {type(raw).__name__}, OpenAI sends a JSON string"], None
    try:
        args = json.loads(raw)
    except json.JSONDecodeError as exc:
        return [*problems, f"arguments are not valid JSON ({exc.msg}): {raw[:80]!r}"], None
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(args), key=lambda e: list(e.path))
    for e in errors[:3]:
        where = "/".join(str(p) for p in e.path) or "arguments"
        problems.append(f"arguments {raw[:60]!r} do not match the tool schema at {where}: {e.message}")
    return problems, args


def judge_reasoning(a: Answer, field: str | None = None) -> list[str]:
    """Problems with a reasoning model's answer: the parser must split thinking from the answer.

    ``field``: where this engine puts the reasoning (``reasoning`` or ``reasoning_content``); text in
    the other field is a problem, since that engine's clients read only its own.
    """
    problems = list(a.problems)
    if problems:
        return problems
    if not a.reasoning.strip():
        problems.append("no reasoning text in `reasoning` or `reasoning_content` (is the reasoning parser on?)")
    elif field and a.reasoning_field != field:
        problems.append(f"reasoning text in `{a.reasoning_field}`, where this engine's clients read `{field}`")
    if not a.content.strip():
        problems.append("only reasoning, no final answer in content")
    leaked = [m for m in THINK_MARKERS if m in a.content]
    if leaked:
        problems.append(f"thinking markers {leaked} in the final answer: the reasoning parser did not split it")
    return problems
