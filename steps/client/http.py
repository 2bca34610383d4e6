"""The one HTTP client for the engine under test, and the one reading of an endpoint URL.

Every gate that talks to the engine (smoke, perf's sampler and bench client, longctx, experiment)
and both readiness waits (the local engine, the Kubernetes leader) go through here, so an endpoint
given as ``http://h:p``, ``http://h:p/`` or ``http://h:p/v1`` reaches the same URLs everywhere:
:func:`normalize_endpoint` gives the base without ``/v1`` and without a trailing slash, and every
path a caller passes starts with ``/`` (``/v1/models``, ``/health``, ``/metrics``, ``/tokenize``).

Two ways to call: :meth:`EngineClient.get` / :meth:`EngineClient.post` return the httpx response
and raise ``httpx.HTTPError`` (a readiness probe or a metrics scrape has its own error handling);
:meth:`EngineClient.request` / :meth:`EngineClient.stream` never raise: a failed request is an
:class:`~gauntlet.steps.client.replies.Exchange` (status, body, error, seconds), kept in ``log`` when asked.
"""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import urlsplit

import httpx

from gauntlet.contract import UsageError
from gauntlet.steps.client.replies import Exchange

__all__ = ["normalize_endpoint", "EngineClient"]


def normalize_endpoint(url: str, flag: str = "--endpoint") -> str:
    """``http://h:p`` from ``http://h:p/``, ``http://h:p/v1``; UsageError (naming ``flag``) for anything
    not http(s)."""
    parts = urlsplit(str(url).strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UsageError(f"{flag} {url!r}: expected an http(s) URL such as http://127.0.0.1:8765")
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    return f"{parts.scheme}://{parts.netloc}{path}"


class EngineClient:
    """httpx against one engine endpoint (normalized); a context manager that closes its connections.

    ``timeout_s`` is every request's default (connect at most 10 s); a call may pass its own ``timeout``.
    ``keep_log``: every :meth:`request` / :meth:`stream` is appended to ``log`` (smoke's evidence).
    ``unanswered`` counts the requests whose answer never came or never completed (a timeout, a connection
    refused or lost, mid-stream too): Gate 3 never excuses a check during which the engine hung
    (``steps/gates/smoke.py`` ``known_deviations``).
    """

    def __init__(self, endpoint: str, timeout_s: float = 30.0, *, transport: httpx.BaseTransport | None = None,
                 trust_env: bool = True, keep_log: bool = False, flag: str = "--endpoint", keep_alive: bool = True):
        self.base = normalize_endpoint(endpoint, flag)
        timeout = httpx.Timeout(timeout_s, connect=min(10.0, timeout_s))
        # keep_alive=False (engines.<e>.keep_alive): httpcore closes each connection after its reply
        headers = None if keep_alive else {"Connection": "close"}
        self.http = httpx.Client(base_url=self.base, timeout=timeout, transport=transport, trust_env=trust_env,
                                 headers=headers)
        self.log: list[Exchange] = []
        self.unanswered = 0
        self._keep = keep_log

    def __enter__(self) -> EngineClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def url(self, path: str) -> str:
        """The absolute URL of ``path`` (``/v1/models``) on this engine."""
        return self.base + path

    # ---- raw: the httpx response; raises httpx.HTTPError

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return self.http.get(path, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> httpx.Response:
        return self.http.post(path, json=body, **kw)

    def health(self, **kw: Any) -> httpx.Response:
        return self.get("/health", **kw)

    def metrics_text(self) -> str:
        """The engine's Prometheus ``/metrics`` text (raises on an HTTP error or a non-2xx answer)."""
        r = self.get("/metrics")
        r.raise_for_status()
        return r.text

    # ---- recorded: an Exchange, never an exception

    def request(self, method: str, path: str, body: dict[str, Any] | None = None, **kw: Any) -> Exchange:
        ex = Exchange(method, path)
        t0 = time.monotonic()
        try:
            r = self.http.request(method, path, json=body, **kw)
            ex.status, ex.text = r.status_code, r.text
            ex.body = _json_or_none(r.text)
        except httpx.HTTPError as exc:
            ex.error = f"{type(exc).__name__}: {exc}"
            self.unanswered += 1
        ex.seconds = time.monotonic() - t0
        self._record(ex)
        return ex

    def stream(self, path: str, body: dict[str, Any]) -> tuple[Exchange, str]:
        """POST with ``stream: true``; the raw SSE text exactly as it arrived."""
        ex = Exchange("POST", path + " (stream)")
        t0 = time.monotonic()
        raw = ""
        try:
            with self.http.stream("POST", path, json={**body, "stream": True}) as r:
                ex.status = r.status_code
                raw = "".join(r.iter_text())
                ctype = r.headers.get("content-type", "")
            ex.text = raw
            if ex.status == 200 and not ctype.startswith("text/event-stream"):
                ex.error = f"content-type {ctype!r}, expected text/event-stream"
            elif ex.status != 200:
                ex.body = _json_or_none(raw)
        except httpx.HTTPError as exc:       # before the status or mid-stream: the answer never completed
            ex.error = f"{type(exc).__name__}: {exc}"
            ex.text = raw
            self.unanswered += 1
        ex.seconds = time.monotonic() - t0
        self._record(ex)
        return ex, raw

    def models(self) -> Exchange:
        return self.request("GET", "/v1/models")

    def chat(self, body: dict[str, Any], **kw: Any) -> Exchange:
        return self.request("POST", "/v1/chat/completions", body, **kw)

    def tokenize(self, body: dict[str, Any]) -> Exchange:
        return self.request("POST", "/tokenize", body)

    def _record(self, ex: Exchange) -> None:
        if self._keep:
            self.log.append(ex)


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None
