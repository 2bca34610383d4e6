"""The HTTP plumbing the loopback doubles share (Kubernetes API, Argo API, fake engine)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class JsonHandler(BaseHTTPRequestHandler):
    """A quiet handler with one way to answer: a JSON (or text) body with its length."""

    def log_message(self, *a: Any) -> None:  # keep pytest output clean
        pass

    def _send(self, code: int, body: Any, ctype: str = "application/json") -> None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class ChatStandIn:
    """A chat API on a loopback port for a model that cannot run here: ``GET`` lists ``model``, ``POST
    /v1/chat/completions`` answers :meth:`complete` (the body in, the reply out), anything else 404.
    Used as ``with Sub() as chat: chat.url``; subclasses say what the model answers."""

    model = "kimi-k3"

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def __enter__(self):
        me = self

        class Handler(JsonHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                self._send(200, {"object": "list", "data": [{"id": me.model}]})

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if self.path != "/v1/chat/completions":
                    return self._send(404, {"object": "error", "message": "Not Found"})
                self._send(200, me.complete(body))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
