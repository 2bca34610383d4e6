"""The HTTP plumbing the loopback doubles share (Kubernetes API, Argo API, fake engine)."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
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
