"""Stand-ins for what cannot run on this machine, started by the process kubelet.

``standin.py step --step S --out DIR --behaviour JSON``: plays a gate that needs GPUs.
Like the real step it writes ``DIR/verdict.json`` and ``DIR/outputs/*`` through the
project's evidence contract (``gauntlet.contract``, ``gauntlet.steps.runner.write_outputs``), then
exits with the behaviour's code. A behaviour is ``{"exit": 75, "status": "error",
"after_s": 0, "outputs": {...}, "detail": "..."}``; every key is optional (exit 0, the
status that exit code means, no wait, no extra outputs).

``standin.py engine --port P --rank R --served-name N [--host A]``: plays an engine rank. Rank 0
serves ``/health``, ``/v1/models`` and ``/v1/completions`` on A:P (A: 127.0.0.1 unless given); other ranks
sleep. ``--behaviour '{"exit": 1, "after_s": 2}'`` makes a rank exit with that code after that
many seconds instead (an engine dying while it loads). Both stop on SIGTERM (they may run as PID 1 of their container, where a signal
without a handler is ignored).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STATUS_FOR_EXIT = {0: "pass", 1: "fail"}


def _on_sigterm(_sig: int, _frame: object) -> None:
    sys.exit(143)


def run_step(step: str, out: Path, behaviour: dict) -> int:
    """Wait, write the verdict and outputs the behaviour asks for, return its exit code."""
    sys.path.insert(0, str(REPO))
    from gauntlet.contract import Check, Verdict, now_iso
    from gauntlet.steps.runner import write_outputs

    started = now_iso()
    code = int(behaviour.get("exit", 0))
    status = behaviour.get("status") or STATUS_FOR_EXIT.get(code, "error")
    print(f"stand-in {step}: behaviour {json.dumps(behaviour, sort_keys=True)}", flush=True)
    time.sleep(float(behaviour.get("after_s", 0)))
    detail = behaviour.get("detail") or f"stand-in for {step} on the box (no GPUs): {status}, exit {code}"
    checks = [Check("standin", status, behaviour.get("expected"), behaviour.get("observed"), detail)]
    verdict = Verdict.of(step, started, checks, {"standin": True, "outputs": dict(behaviour.get("outputs") or {})},
                         status=status)
    out.mkdir(parents=True, exist_ok=True)
    verdict.write(out)
    write_outputs(out, verdict)
    print(f"{step}: {status.upper()} (stand-in, exit {code})", flush=True)
    return code


def _engine_handler(served_name: str) -> type[BaseHTTPRequestHandler]:
    class Engine(BaseHTTPRequestHandler):
        def _send(self, code: int, body: dict | None) -> None:
            data = json.dumps(body).encode() if body is not None else b""
            self.send_response(code)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            if self.path == "/health":
                self._send(200, None)
            elif self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": served_name, "object": "model"}]})
            else:
                self._send(404, {"error": {"message": f"no route {self.path}", "type": "NotFound", "code": 404}})

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("content-length") or 0)
            req = json.loads(self.rfile.read(length) or b"{}")
            if self.path != "/v1/completions":
                self._send(404, {"error": {"message": f"no route {self.path}", "type": "NotFound", "code": 404}})
                return
            self._send(200, {"id": "cmpl-standin", "object": "text_completion", "created": int(time.time()),
                             "model": req.get("model", served_name),
                             "choices": [{"index": 0, "text": " Hello", "finish_reason": "length"}],
                             "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

        def log_message(self, fmt: str, *args: object) -> None:
            print(f"engine stand-in: {fmt % args}", flush=True)

    return Engine


def run_engine(port: int, rank: int, served_name: str, behaviour: dict | None = None, host: str = "127.0.0.1") -> int:
    print(f"engine stand-in: rank {rank}, port {port}, model {served_name}", flush=True)
    if behaviour and "exit" in behaviour:
        time.sleep(float(behaviour.get("after_s", 0)))
        print(f"engine stand-in: rank {rank} exits {behaviour['exit']} during start-up", flush=True)
        return int(behaviour["exit"])
    if rank != 0:
        while True:
            time.sleep(3600)
    server = ThreadingHTTPServer((host, port), _engine_handler(served_name))
    print(f"engine stand-in: serving on {host}:{port}", flush=True)
    server.serve_forever()
    return 0


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _on_sigterm)
    p = argparse.ArgumentParser(prog="standin.py")
    sub = p.add_subparsers(dest="what", required=True)
    s = sub.add_parser("step")
    s.add_argument("--step", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--behaviour", default="{}")
    e = sub.add_parser("engine")
    e.add_argument("--port", type=int, required=True)
    e.add_argument("--rank", type=int, default=0)
    e.add_argument("--served-name", default="model")
    e.add_argument("--behaviour", default="{}")
    e.add_argument("--host", default="127.0.0.1")
    a = p.parse_args(argv)
    if a.what == "step":
        return run_step(a.step, Path(a.out), json.loads(a.behaviour))
    return run_engine(a.port, a.rank, a.served_name, json.loads(a.behaviour), a.host)


if __name__ == "__main__":
    sys.exit(main())
