"""Gate 3's pure judgement: numbers, output sanity, SSE framing, probe PNGs, reply shapes.

Answers in the tables are what SmolLM2 on vLLM 0.32 CPU really said on this machine
where one is known, plus the failure shapes the gate must catch.
"""

from __future__ import annotations

import json
import struct
import zlib

import pytest

from gauntlet.steps.client.answers import extract_number, judge_number, mentions, sanity_problems
from gauntlet.steps.client.probe_image import broken_png, data_url, solid_png
from gauntlet.steps.client.replies import Answer, Exchange, chat_answer, error_message, judge_reasoning, judge_refusal, judge_tool_call
from gauntlet.steps.client.sse import parse_sse

# ---------------------------------------------------------------- numbers


@pytest.mark.parametrize("text, number", [
    ("2 + 3 = 5", 5),                                   # SmolLM2, right
    ("7 * 8 = 56", 56),                                 # SmolLM2, right
    ("12 + 30 = 32", 32),                               # SmolLM2, wrong: still parsed as what it said
    ("56", 56),
    ("The answer is **56**.", 56),
    ("The answer is 5 (because 2+3 makes 5).", 5),
    ("\\boxed{391}", 391),
    ("Let me think: 17*23 = 17*20 + 17*3 = 340 + 51 = 391", 391),
    ("5,555", 5555),
    ("1234 + 4321 = 5,555.", 5555),
    ("100 - 1 = 99", 99),
    ("It is -3.", -3),
    ("3.5", 3.5),
    ("Answer: 42\n", 42),
    ("2, 3 and 5", 5),                                  # "2,3" is not two thousand and three
    ("no digits here", None),
    ("", None),
])
def test_extract_number(text, number):
    assert extract_number(text) == number


@pytest.mark.parametrize("text, expected, ok, parsed", [
    ("2 + 3 = 5", 5, True, 5),
    ("12 + 30 = 32", 42, False, 32),                    # the real wrong answer: must fail
    ("12 + 30 = 32", 32, True, 32),
    ("I cannot do maths.", 5, False, None),
    ("5.0", 5, True, 5),
])
def test_judge_number(text, expected, ok, parsed):
    j = judge_number(text, expected)
    assert (j.ok, j.parsed) == (ok, parsed)
    if not ok and parsed is not None:
        assert "said 32" in j.detail and "expected 42" in j.detail


def test_mentions_whole_words():
    assert mentions("Your name is Zorblat.", "zorblat")
    assert not mentions("Zorblatian", "Zorblat")
    assert mentions("It is RED", "red") and not mentions("It is reddish", "red")


# ---------------------------------------------------------------- sanity


@pytest.mark.parametrize("text, finish, needle", [
    ("2 + 3 = 5", "stop", None),
    ("Hello! Your name is Zorblat. How can I help you today?", "stop", None),
    ("| a | b |\n|---|---|\n| 1 | 2 |", "stop", None),  # markdown table: short runs are fine
    ("5", "length", "cut off at max_tokens"),
    ("5", None, "finish_reason None"),
    ("", "stop", "empty answer"),
    ("   \n", "stop", "empty answer"),
    ("The answer is \ufffd\ufffd5", "stop", "garbage character"),
    ("5\x00\x01", "stop", "garbage character"),
    ("NaN NaN", "stop", "NaN/inf"),
    ("banana information", "stop", None),               # 'nan'/'inf' inside words are words
    ("the the the the the the the the the the the the", "length", "runaway repetition"),
    ("5" + "!" * 60, "stop", "runaway repetition"),
    ("I am a model. " * 6, "stop", "runaway repetition"),
    ("Paris is nice in spring. Rome too. Paris is nice in spring. Yes. Paris is nice in spring.", "stop",
     "the sentence"),
    ("#$%^&*()#$%^&*()@!", "stop", "mostly symbols"),
])
def test_sanity_problems(text, finish, needle):
    problems = sanity_problems(text, finish)
    if needle is None:
        assert problems == []
    else:
        assert any(needle in p for p in problems), problems


def test_sanity_allowed_finish_and_empty_tool_call():
    assert sanity_problems("", "tool_calls", allowed_finish=("tool_calls",), allow_empty=True) == []
    assert sanity_problems("x", "tool_calls") != []


# ---------------------------------------------------------------- SSE


def _chunk(content=None, finish=None, cid="chatcmpl-1", **delta):
    d = dict(delta)
    if content is not None:
        d["content"] = content
    return json.dumps({"id": cid, "object": "chat.completion.chunk", "created": 1, "model": "m",
                       "choices": [{"index": 0, "delta": d, "finish_reason": finish}]})


def _stream(*datas, end="\n\n"):
    return "".join(f"data: {d}\n\n" for d in datas[:-1]) + f"data: {datas[-1]}{end}"


GOOD = _stream(_chunk("", role="assistant"), _chunk("2 + 3"), _chunk(" = 5"), _chunk(finish="stop"), "[DONE]")


def test_sse_good_stream_assembles_text():
    s = parse_sse(GOOD)
    assert s.well_formed, s.problems
    assert (s.content, s.finish_reason, s.done, len(s.chunks)) == ("2 + 3 = 5", "stop", True, 4)


def test_sse_crlf_comments_and_reasoning_fields():
    raw = (": keep-alive\r\n\r\n" + f"data: {_chunk(reasoning='think ')}\r\n\r\n"
           + f"data: {_chunk(reasoning_content='more')}\r\n\r\n"
           + f"data: {_chunk('5', finish='stop')}\r\n\r\ndata: [DONE]\r\n\r\n")
    s = parse_sse(raw)
    assert s.well_formed, s.problems
    assert (s.reasoning, s.content) == ("think more", "5")


@pytest.mark.parametrize("raw, needle", [
    ("", "empty stream"),
    (_stream(_chunk("5", finish="stop")), "did not end with data: [DONE]"),
    (_stream(_chunk("5", finish="stop"), "[DONE]", _chunk("x")), "data after [DONE]"),
    (_stream("{not json", _chunk("5", finish="stop"), "[DONE]"), "not JSON"),
    (_stream(_chunk("5"), "[DONE]"), "no chunk carried a finish_reason"),
    (_stream(_chunk("5", finish="stop"), _chunk(finish="stop"), "[DONE]"), "finish_reason sent 2 times"),
    (_stream(_chunk("5", cid="a"), _chunk(finish="stop", cid="b"), "[DONE]"), "different ids"),
    (_stream(json.dumps({"error": {"message": "boom"}}), "[DONE]"), "error in stream: boom"),
    (_stream(json.dumps({"id": "x", "object": "chat.completion", "choices": []}), "[DONE]"), "object 'chat.completion'"),
    (_stream(_chunk("5", finish="stop"), "[DONE]", end=""), "does not end with a blank line"),
    ("<html>502 Bad Gateway</html>", "no data events"),
])
def test_sse_malformed(raw, needle):
    s = parse_sse(raw)
    assert not s.well_formed
    assert any(needle in p for p in s.problems), s.problems


# ---------------------------------------------------------------- probe PNG


def _png_chunks(png: bytes):
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    i, out = 8, []
    while i < len(png):
        (n,) = struct.unpack(">I", png[i:i + 4])
        kind, payload, crc = png[i + 4:i + 8], png[i + 8:i + 8 + n], png[i + 8 + n:i + 12 + n]
        assert len(crc) == 4, "truncated chunk"
        assert struct.unpack(">I", crc)[0] == zlib.crc32(kind + payload) & 0xFFFFFFFF
        out.append((kind, payload))
        i += 12 + n
    return out


def test_solid_png_is_a_valid_png_of_that_colour():
    png = solid_png("red", size=16)
    chunks = _png_chunks(png)
    assert [k for k, _ in chunks] == [b"IHDR", b"IDAT", b"IEND"]
    w, h, depth, ctype = struct.unpack(">IIBB", chunks[0][1][:10])
    assert (w, h, depth, ctype) == (16, 16, 8, 2)
    raw = zlib.decompress(chunks[1][1])
    assert len(raw) == 16 * (1 + 16 * 3)
    assert raw[1:4] == bytes((220, 20, 20))


def test_solid_png_decodes_with_pillow_when_present():
    Image = pytest.importorskip("PIL.Image")
    import io
    im = Image.open(io.BytesIO(solid_png("blue")))
    im.load()
    assert im.size == (64, 64) and im.getpixel((10, 10)) == (20, 40, 220)


def test_broken_png_does_not_decode():
    with pytest.raises(AssertionError, match="truncated|crc"):
        _png_chunks(broken_png())
    assert data_url(b"\x89PNG").startswith("data:image/png;base64,iVBORw")


# ---------------------------------------------------------------- replies


def _completion(content="5", finish="stop", **msg):
    return {"id": "c", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content, **msg},
                         "finish_reason": finish}]}


def _ok(body):
    return Exchange("POST", "/v1/chat/completions", 200, body, json.dumps(body))


def test_chat_answer_reads_vllm_and_sglang_reasoning():
    assert chat_answer(_ok(_completion("5", reasoning="2+3"))).reasoning == "2+3"
    assert chat_answer(_ok(_completion("5", reasoning_content="2+3"))).reasoning == "2+3"
    assert chat_answer(_ok(_completion("5", reasoning_content="2+3"))).reasoning_field == "reasoning_content"


@pytest.mark.parametrize("ex, needle", [
    (Exchange("POST", "/v1/chat/completions", None, error="ConnectError: refused"), "no response"),
    (Exchange("POST", "/v1/chat/completions", 200, None, "\x00\x01garbage"), "not a JSON object"),
    (Exchange("POST", "/v1/chat/completions", 500, {"error": {"message": "boom"}}, ""), "HTTP 500"),
    (_ok({"object": "chat.completion", "choices": []}), "no choices"),
    (_ok({"object": "list", "choices": [{"message": {"role": "assistant", "content": "5"}}]}), "object 'list'"),
])
def test_chat_answer_problems(ex, needle):
    assert any(needle in p for p in chat_answer(ex).problems)


VLLM_400 = {"error": {"message": "This model's maximum context length is 8192 tokens. However, you requested "
                                 "12000 tokens in the messages.", "type": "BadRequestError", "param": None,
                      "code": 400}}


@pytest.mark.parametrize("ex, keywords, needle", [
    (Exchange("POST", "/p", 400, VLLM_400, ""), ("context", "token"), None),
    (Exchange("POST", "/p", 400, {"object": "error", "message": "Input is too long for this model"}, ""),
     ("long",), None),
    (Exchange("POST", "/p", 400, {"error": {"message": "x"}}, ""), (), "without an explanatory message"),
    (Exchange("POST", "/p", 400, {"error": {"message": "Something went wrong today"}}, ""), ("token",),
     "does not say why"),
    (Exchange("POST", "/p", 200, _completion(), ""), (), "accepted a request"),
    (Exchange("POST", "/p", 500, None, "Internal Server Error"), (), "server error"),
    (Exchange("POST", "/p", None, error="ReadTimeout: timed out"), (), "engine dead or unreachable"),
])
def test_judge_refusal(ex, keywords, needle):
    problems = judge_refusal(ex, keywords)
    if needle is None:
        assert problems == []
    else:
        assert any(needle in p for p in problems), problems


def test_error_message_shapes():
    assert error_message(Exchange("GET", "/", 404, {"detail": "Not Found"})) == "Not Found"
    assert error_message(Exchange("GET", "/", 404, None, "Not Found")) is None


WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
           "additionalProperties": False}


def _tool_answer(arguments, finish="stop", name="get_weather", **tc):
    call = {"id": "chatcmpl-tool-1", "type": "function", "function": {"name": name, "arguments": arguments}, **tc}
    return chat_answer(_ok(_completion("", finish, tool_calls=[call])))


@pytest.mark.parametrize("answer, finish, needle", [
    (_tool_answer('{"city": "Paris"}'), "stop", None),                      # named choice, relaxed tags
    (_tool_answer('{"city": "Paris"}', finish="tool_calls"), "tool_calls", None),   # auto choice
    (_tool_answer('"Paris"'), "stop", "is not of type 'object'"),           # vLLM 0.32 strict structural tags
    (_tool_answer('{"town": "Paris"}'), "stop", "'city' is a required property"),
    (_tool_answer('{"city": "Paris"'), "stop", "not valid JSON"),
    (_tool_answer({"city": "Paris"}), "stop", "JSON string"),
    (_tool_answer('{"city": "Paris"}', name="get_time"), "stop", "called 'get_time'"),
    (_tool_answer('{"city": "Paris"}'), "tool_calls", "finish_reason 'stop', expected 'tool_calls'"),
    (chat_answer(_ok(_completion("I would call get_weather"))), "stop", "no tool_calls"),
])
def test_judge_tool_call(answer, finish, needle):
    problems, args = judge_tool_call(answer, name="get_weather", schema=WEATHER, finish_reason=finish)
    if needle is None:
        assert problems == [] and args == {"city": "Paris"}
    else:
        assert any(needle in p for p in problems), problems


@pytest.mark.parametrize("answer, needle", [
    (Answer(content="391", reasoning="17*23 = 391", finish_reason="stop"), None),
    (Answer(content="", reasoning="17*23 = 391 ...", finish_reason="length"), "only reasoning"),
    (Answer(content="<think>hmm</think>391", reasoning="", finish_reason="stop"), "no reasoning text"),
    (Answer(content="hmm</think>391", reasoning="x", finish_reason="stop"), "thinking markers"),
])
def test_judge_reasoning(answer, needle):
    problems = judge_reasoning(answer)
    if needle is None:
        assert problems == []
    else:
        assert any(needle in p for p in problems), problems


# ---------------------------------------------------------------- endpoint and arguments


@pytest.mark.parametrize("url, base", [
    ("http://127.0.0.1:8765", "http://127.0.0.1:8765"),
    ("http://127.0.0.1:8765/", "http://127.0.0.1:8765"),
    ("http://127.0.0.1:8765/v1", "http://127.0.0.1:8765"),
    ("https://gw.example/kimi/v1/", "https://gw.example/kimi"),
])
def test_normalize_endpoint(url, base):
    from gauntlet.steps.client.http import normalize_endpoint
    assert normalize_endpoint(url) == base


@pytest.mark.parametrize("argv, message", [
    (["--endpoint", "127.0.0.1:8765"], "expected an http(s) URL"),
    (["--endpoint", "http://127.0.0.1:9", "--engine", "sglang"], "--engine sglang: engine 'sglang' is not in profile local-cpu"),
])
def test_bad_arguments_exit_2_with_one_line(argv, message, tmp_path, capsys):
    from gauntlet.workflows.cli import main
    rc = main(["step", "smoke", "--profile", "local-cpu", "--out", str(tmp_path), *argv])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "Traceback" not in err


# ---------------------------------------------------------------- the step over a scripted server
# The local engine is text-only without reasoning, so the reasoning, image-understanding and
# auto-tool paths run here against a scripted OpenAI-style server (httpx.MockTransport) under
# the kimi-k3-h20 profile; each defect must fail its own check and nothing else.


def _scripted(defect: str | None = None, style: str = "sglang"):
    """A Kimi K3 server speaking like ``style``: SGLang 0.5.23 or vLLM 0.32 (steps/engines/replies.py), with
    ``defect`` (several joined by ``+``)."""
    import base64
    import re

    import httpx

    defects = set((defect or "").split("+"))
    rkey = "reasoning_content" if style == "sglang" else "reasoning"
    if "reasoning-wrong-field" in defects:
        rkey = "reasoning" if style == "sglang" else "reasoning_content"
    named_finish = "tool_calls" if style == "sglang" else "stop"

    def error(message):
        if style == "sglang":    # serving_base.create_error_response: a top-level ErrorResponse
            return {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": 400}
        return {"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}}

    def reply(content, reasoning="", finish="stop", tool_calls=None):
        msg = {"role": "assistant", "content": content, rkey: reasoning}
        if tool_calls:
            msg["tool_calls"] = tool_calls
        return {"id": "c1", "object": "chat.completion", "model": "kimi-k3",
                "choices": [{"index": 0, "message": msg, "finish_reason": finish}]}

    def answer(req):
        msgs = req["messages"]
        last = msgs[-1]["content"]
        if isinstance(last, list):
            url = next(p["image_url"]["url"] for p in last if p["type"] == "image_url")
            png = base64.b64decode(url.split(",", 1)[1])
            if png != solid_png("red"):
                if "image-500" in defects:      # an engine that lets the loader's error through as a server error
                    return 500, {"object": "error", "message": "Internal server error: Error while loading data",
                                 "type": "InternalServerError", "param": None, "code": 500}
                if "image-hang" in defects:
                    return None, None          # no answer: the handler times the request out
                # each engine's own words (tests/test_smoke_sglang_image.py: SGLang 0.5.23's loader and handler)
                return 400, error("Could not decode image: image file is truncated" if style == "sglang"
                                  else "Failed to load image: image file is truncated")
            return 200, reply("Blue." if "image-blue" in defects else "Red.", "A flat colour.")
        if len(last) > 100_000:
            return 400, error("The input (49153 tokens) is longer than the model's context length (32768 tokens).")
        if req.get("tools"):
            args = '"Paris"' if "tool-string" in defects else '{"city": "Paris"}'
            finish = named_finish if isinstance(req.get("tool_choice"), dict) else "tool_calls"
            return 200, reply("", "The user wants weather.", finish,
                              [{"id": "call_1", "type": "function",
                                "function": {"name": "get_weather", "arguments": args}}])
        if "What is my name" in last:
            name = re.search(r"My name is (\w+)", msgs[0]["content"]).group(1)
            return 200, reply(f"{name}.", "They told me.")
        if last.startswith("My name is"):
            return 200, reply("Hello there, nice to meet you!", "Greet.")
        a, op, b = re.search(r"(\d+)\s*([+*])\s*(\d+)", last).groups()
        n = int(a) + int(b) if op == "+" else int(a) * int(b)
        if "reasoning-only" in defects:
            return 200, reply("", f"{a}{op}{b} is {n} so", "length")
        if "think-leak" in defects:
            return 200, reply(f"<think>{a}{op}{b}</think>{n}", "")
        return 200, reply(str(n), f"{a}{op}{b} = {n}.")

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(503 if "unhealthy" in defects else 200)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": "kimi-k3", "object": "model"}]})
        req = json.loads(request.content)
        status, body = answer(req)
        if status is None:
            raise httpx.ReadTimeout("timed out", request=request)
        if not req.get("stream") or status != 200:
            return httpx.Response(status, json=body)
        msg, events = body["choices"][0]["message"], []
        for key in (rkey, "content"):
            for piece in (msg[key][i:i + 3] for i in range(0, len(msg[key]), 3)):
                events.append({"index": 0, "delta": {key: piece}, "finish_reason": None})
        events.append({"index": 0, "delta": {}, "finish_reason": "stop"})
        sse = "".join(f"data: {json.dumps({'id': 'c1', 'object': 'chat.completion.chunk', 'choices': [e]})}\n\n"
                      for e in events) + "data: [DONE]\n\n"
        return httpx.Response(200, text=sse, headers={"content-type": "text/event-stream"})

    return httpx.MockTransport(handler)


@pytest.mark.parametrize("defect, failing", [
    (None, set()),
    # no final answer anywhere: everything that needs an answer fails, the name recall does not
    ("reasoning-only", {"reasoning", "arithmetic", "streaming", "invalid-image", "over-long-prompt"}),
    ("think-leak", {"reasoning"}),
    ("image-blue", {"image"}),
    ("tool-string", {"tool-call"}),
    ("reasoning-wrong-field", {"reasoning"}),
])
@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_kimi_profile_paths_over_a_scripted_server(defect, failing, engine):
    from gauntlet.params import load_profile
    from gauntlet.steps.client.http import EngineClient
    from gauntlet.steps.gates.smoke import run_checks
    profile = load_profile("kimi-k3-h20")
    with EngineClient("http://kimi.test/v1", 5, transport=_scripted(defect, style=engine)) as c:
        checks, _ = run_checks(c, profile, engine)
    by = {ch.name: ch for ch in checks}
    assert "image-refused" not in by                                   # multimodal: understanding, not refusal
    got = {n for n, ch in by.items() if ch.status == "fail"}
    assert got == failing, {n: by[n].detail for n in got ^ failing}
    assert all(ch.status != "skip" for ch in checks)                   # reasoning and image both apply
    if defect == "think-leak":
        assert "thinking markers" in by["reasoning"].detail
    if defect == "tool-string":
        assert "is not of type 'object'" in by["tool-call"].detail
    if defect is None:
        assert by["tool-call"].expected["finish_reason"] == "tool_calls"      # auto choice on Kimi K3


def _declaring(engine: str, check: str, why: str):
    from gauntlet.params import load_profile
    profile = load_profile("kimi-k3-h20")
    spec = profile.engines[engine].model_copy(update={"known_deviations": {check: why}})
    return profile.model_copy(update={"engines": {**profile.engines, engine: spec}})


def _rank_1_exits():
    """The rank watch's own judgement (steps/cluster/rank_watch.py) of rank 1 gone between two reads."""
    from gauntlet.steps.cluster.rank_watch import Rank, judge
    before = [Rank(0, "uid-0", 0, True, "engine-0 on h20-node-01"), Rank(1, "uid-1", 0, True, "engine-1 on h20-node-02")]
    after = [before[0], Rank(1, "uid-1", 0, False, "engine-1 on h20-node-02")]
    return lambda: [judge("smoke", before, after).detail]


@pytest.mark.parametrize("defect, ranks, status, words", [
    # a 500 for the broken PNG, every rank up, the engine answering and healthy after: the declared deviation
    ("image-500", None, "skip", ("known deviation", "HTTP 500", "why: the loader's error is a 500")),
    # the same 500 with rank 1 gone: a failure naming the rank, never "known deviation"
    ("image-500", _rank_1_exits(), "fail", ("not excused", "rank 1 exited during smoke")),
    # the same 500, and /health says the engine is not serving after the checks
    ("image-500+unhealthy", None, "fail", ("not excused", "GET /health after every check: HTTP 503")),
    # no answer in time to the broken PNG: a hang, whatever the engine does afterwards
    ("image-hang", None, "fail", ("no response: ReadTimeout", "no answer in time")),
])
def test_a_declared_deviation_is_excused_only_when_answered_with_every_rank_up(defect, ranks, status, words):
    from gauntlet.steps.client.http import EngineClient
    from gauntlet.steps.gates.smoke import run_checks
    profile = _declaring("sglang", "invalid-image", "the loader's error is a 500")
    with EngineClient("http://kimi.test/v1", 5, transport=_scripted(defect)) as c:
        checks, _ = run_checks(c, profile, "sglang", ranks=ranks)
    by = {ch.name: ch for ch in checks}
    check = by["invalid-image"]
    assert check.status == status, check.detail
    for w in words:
        assert w in check.detail, check.detail
    others = {n: ch.status for n, ch in by.items() if n != "invalid-image"}
    assert set(others.values()) == {"pass"}, others


def test_a_declared_deviation_the_engine_does_not_show_on_the_kimi_path_fails_as_stale():
    """SGLang 0.5.23 refuses the broken PNG with 400 (tests/test_smoke_sglang_image.py): declaring it fails."""
    from gauntlet.steps.client.http import EngineClient
    from gauntlet.steps.gates.smoke import run_checks
    with EngineClient("http://kimi.test/v1", 5, transport=_scripted()) as c:
        checks, _ = run_checks(c, _declaring("sglang", "invalid-image", "r"), "sglang")
    check = {ch.name: ch for ch in checks}["invalid-image"]
    assert check.status == "fail" and "remove it from the profile" in check.detail


@pytest.mark.parametrize("engine, server, ok", [
    ("sglang", "sglang", True),    # SGLang 0.5.23: a named call ends 'tool_calls'
    ("vllm", "vllm", True),        # vLLM 0.32: 'stop', as OpenAI
    ("vllm", "sglang", False),     # an engine's reply judged by the other's rule fails, naming both
    ("sglang", "vllm", False),
])
def test_named_tool_choice_finish_reason_per_engine(engine, server, ok):
    from gauntlet.params import load_profile
    from gauntlet.steps.client.http import EngineClient
    from gauntlet.steps.gates.smoke import Ctx, check_tool_call
    profile = load_profile("kimi-k3-h20")
    profile = profile.model_copy(update={"smoke": profile.smoke.model_copy(update={"tool_choice": "named"})})
    with EngineClient("http://kimi.test/v1", 5, transport=_scripted(style=server)) as c:
        (check,) = check_tool_call(Ctx(c, profile, engine))
    assert (check.status == "pass") is ok, check.detail
    if not ok:
        want, got = ("tool_calls", "stop") if engine == "sglang" else ("stop", "tool_calls")
        assert f"finish_reason {got!r}, expected {want!r}" in check.detail


def test_reply_rules_come_with_their_source():
    from gauntlet.steps.engines import ENGINES, engine, rules_for
    from gauntlet.steps.engines.replies import OPENAI
    assert rules_for("tgi") is OPENAI and OPENAI.tool_finish("named") == "stop"      # an engine not read yet
    for rules in (engine(name).replies for name in ENGINES):
        assert {"tool_finish", "reasoning_field"} <= set(rules.sources)
        assert rules.tool_finish("auto") == "tool_calls"
