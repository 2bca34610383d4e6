"""A zero-cost OpenAI-shaped streaming server on loopback: the bench client's own ceiling.

It answers ``/v1/completions`` (streamed, ``max_tokens`` one-token chunks, then the
usage chunk when the request asks for it with ``stream_options.include_usage``, and
``data: [DONE]``, as vLLM does) and ``/v1/models`` without doing any work, so the same
client, requests and concurrency against it measure how fast the client itself can go.
With ``record_to`` it also appends every completion request's JSON body to that file,
one a line: what a client really sent (tests/test_sglang_bench.py compares two clients).
aiohttp is what the client itself runs on (vLLM's dependency), so wherever the client
runs, this does.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["null_server"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _app(model: str, record_to: str | None = None):
    from aiohttp import web

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": model, "object": "model"}]})

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if record_to:
            with open(record_to, "a") as fh:
                fh.write(json.dumps(body) + "\n")
        n = int(body.get("max_tokens") or 16)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        created = int(time.time())
        head = {"id": "cmpl-null", "object": "text_completion", "created": created, "model": model}
        chunk = ("data: " + json.dumps({**head, "choices": [{"index": 0, "text": " x", "finish_reason": None}]})
                 + "\n\n").encode()
        for _ in range(n):
            await resp.write(chunk)
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {**head, "choices": [], "usage": {"prompt_tokens": 0, "completion_tokens": n, "total_tokens": n}}
            await resp.write(("data: " + json.dumps(usage) + "\n\n").encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    return app


@contextmanager
def null_server(model: str, python: str | None = None, timeout_s: float = 30.0,
                record_to: str | None = None) -> Iterator[str]:
    """Serve in its own process (so it never shares the client's interpreter) on a free loopback
    port; yields the base URL and stops the process on exit. ``record_to``: a file to append each
    completion request's body to."""
    import subprocess
    import sys
    import urllib.request

    port = _free_port()
    proc = subprocess.Popen([python or sys.executable, "-m", "gauntlet.steps.client.null_server", str(port), model,
                             *([str(record_to)] if record_to else [])],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            if proc.poll() is not None:
                err = (proc.stderr.read() if proc.stderr else b"").decode(errors="replace").strip()
                raise RuntimeError(f"the null server exited {proc.returncode}: {err[-300:]}")
            try:
                with urllib.request.urlopen(f"{url}/v1/models", timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the null server did not answer within {timeout_s:.0f} s") from None
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv: list[str] | None = None) -> None:
    import sys

    from aiohttp import web

    args = argv or sys.argv[1:]
    port, model, record_to = args[0], args[1], (args[2] if len(args) > 2 else None)
    web.run_app(_app(model, record_to), host="127.0.0.1", port=int(port), access_log=None, print=None)


if __name__ == "__main__":
    main()
