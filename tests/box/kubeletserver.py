"""The two kubelet endpoints the API server proxies to that the box needs: logs and (stream-less) exec.

The API server reaches a node's kubelet at the Node's InternalIP and
``status.daemonEndpoints.kubeletEndpoint.Port`` over HTTPS. With
``--kubelet-certificate-authority`` it verifies the serving certificate against that CA
(:func:`serving_cert` signs one with the box's CA); without it, it does not verify at all
(``transportConfig`` in k8s.io/kubernetes ``pkg/kubelet/client/kubelet_client.go`` sets
``Insecure`` when no CA is given), so :func:`self_signed_cert` is enough. Either way
``kubectl logs`` / ``pods/log`` (the deploy gate saves every rank's log through it, Argo's UI
and ``argo logs`` read it) work through the real API server.

``/exec`` runs the command in the container's mount and PID namespaces (``nsenter``) but
speaks no streaming protocol (no SPDY, no WebSocket): the command runs, its output is
dropped, and the caller is answered with an error. That is enough for what Argo's
controller does on ``argo stop``/``terminate`` (``argoexec kill 15 1`` through
``pods/exec``, whose result it ignores): the step really gets the signal.
"""

from __future__ import annotations

import ssl
import subprocess
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

__all__ = ["KubeletServer", "serving_cert", "self_signed_cert"]

Logs = Callable[[str, str, str, bool], str | None]              # ns, pod, container, previous → text (None: no pod)
Exec = Callable[[str, str, str, list[str]], int | None]         # ns, pod, container, argv → exit code (None: none)


def serving_cert(ca_crt: str | Path, ca_key: str | Path, out_dir: str | Path) -> tuple[Path, Path]:
    """A kubelet serving certificate for 127.0.0.1, signed by the box's CA (openssl); (cert, key)."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    key, csr, crt, ext = d / "kubelet.key", d / "kubelet.csr", d / "kubelet.crt", d / "kubelet.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for args in (["req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
                  "-subj", "/CN=system:node:box"],
                 ["x509", "-req", "-in", str(csr), "-CA", str(ca_crt), "-CAkey", str(ca_key), "-CAcreateserial",
                  "-out", str(crt), "-days", "30", "-extfile", str(ext)]):
        r = subprocess.run(["openssl", *args], capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"openssl {args[0]}: {r.stderr.strip()[-300:]}")
    return crt, key


def self_signed_cert(out_dir: str | Path) -> tuple[Path, Path]:
    """A self-signed serving certificate for 127.0.0.1 (for an API server without a kubelet CA); (cert, key)."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    key, crt = d / "kubelet.key", d / "kubelet.crt"
    if not (key.exists() and crt.exists()):
        r = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                            "-out", str(crt), "-days", "30", "-subj", "/CN=system:node:box",
                            "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"], capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"openssl req: {r.stderr.strip()[-300:]}")
    return crt, key


def _tail(text: str, query: dict[str, list[str]]) -> str:
    if "tailLines" in query:
        n = int(query["tailLines"][0])
        text = "".join(text.splitlines(keepends=True)[-n:]) if n > 0 else ""
    if "limitBytes" in query:
        text = text.encode()[: int(query["limitBytes"][0])].decode(errors="ignore")
    return text


class KubeletServer:
    """HTTPS on 127.0.0.1 (an ephemeral port): ``/containerLogs/...``, ``/exec/...``, ``/healthz``."""

    def __init__(self, cert: str | Path, key: str | Path, logs: Logs, exec_: Exec):
        logs_fn, exec_fn = logs, exec_

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, code: int, text: str) -> None:
                body = text.encode()
                self.send_response(code)
                self.send_header("content-type", "text/plain; charset=utf-8")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _route(self) -> None:
                url = urlsplit(self.path)
                parts, query = [p for p in url.path.split("/") if p], parse_qs(url.query)
                if parts == ["healthz"]:
                    self._reply(200, "ok")
                elif len(parts) == 4 and parts[0] == "containerLogs":
                    text = logs_fn(parts[1], parts[2], parts[3], query.get("previous", ["false"])[0] == "true")
                    if text is None:
                        self._reply(404, f"pod {parts[1]}/{parts[2]} or container {parts[3]} not on this kubelet")
                    else:
                        self._reply(200, _tail(text, query))
                elif len(parts) in (4, 5) and parts[0] == "exec":
                    code = exec_fn(parts[1], parts[2], parts[-1], query.get("command", []))
                    if code is None:
                        self._reply(404, f"container {parts[-1]} of {parts[1]}/{parts[2]} is not running")
                    else:
                        self._reply(400, f"the box's process kubelet ran the command (exit {code}) but streams "
                                         "nothing: no SPDY/WebSocket here")
                else:
                    self._reply(404, f"the box's process kubelet does not serve {url.path}")

            do_GET = do_POST = _route  # noqa: N815 (http.server's naming)

            def log_message(self, fmt: str, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(cert), str(key))
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="kubelet-server", daemon=True)

    def start(self) -> KubeletServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
