"""Stand-ins for what cannot run on this machine, started by the process kubelet.

``standin.py step --step S --out DIR --behaviour JSON``: plays a gate that needs GPUs.
Like the real step it writes ``DIR/verdict.json`` and ``DIR/outputs/*`` through the
project's evidence contract (``gauntlet.contract``, ``gauntlet.steps.runner.write_outputs``), then
exits with the behaviour's code. A behaviour is ``{"exit": 75, "status": "error",
"after_s": 0, "outputs": {...}, "detail": "..."}``; every key is optional (exit 0, the
status that exit code means, no wait, no extra outputs).

``standin.py measured --behaviour JSON -- gauntlet step S ...``: runs the REAL step S (Gate 6's
experiment and experiment-baseline: its deploy, readiness, rank watch, teardown and evidence) with only the
bench client replaced: every request set "completes" at once with the same fixed figures, so no vLLM client,
tokenizer or GPU is needed and the comparison is noise (keep baseline). Gate 6's content checks on a variant
(Gate 3's, which need a model that answers) are played as passed: the engine stand-in serves no chat.
Chosen by a behaviour ``{"measure": "stand-in"}`` in the kubelet's table.

``{"measure": "runner", "exit": 1, "outputs": {...}, "after_s": 0}``: the real step runner (``gauntlet step S ...``:
its options, the run's window, the engine check before a gate that judges the engine, the rank watch, the
verdict) with only the gate's own judgement played: it takes ``after_s`` and returns the behaviour's status and
outputs. So a retried smoke, perf or longctx
on the box redeploys a released engine through the real code (steps/gates/engine_present.py).

``standin.py engine --port P --rank R --served-name N [--host A]``: plays an engine rank. Rank 0
serves ``/health``, ``/v1/models`` and ``/v1/completions`` on A:P (A: 127.0.0.1 unless given); other ranks
sleep. ``--behaviour '{"exit": 1, "after_s": 2}'`` makes a rank exit with that code after that
many seconds instead (an engine dying while it loads). Both stop on SIGTERM (they may run as PID 1 of their container, where a signal
without a handler is ignored).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
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


def run_measured(argv: list[str], behaviour: dict | None = None) -> int:
    """The real ``gauntlet step ...`` of ``argv`` (after ``gauntlet``) with the bench client stood in for.

    ``behaviour["touch"]``: the stand-in client creates that file on its first request set and then takes
    ``hold_s`` seconds (an engine stand-in with ``on_file`` crashes meanwhile, and its kubelet restarts it)."""
    behaviour = behaviour or {}
    sys.path.insert(0, str(REPO))
    from gauntlet.steps.gates import experiment, perf
    from gauntlet.steps.client.bench import ClientRun, client_argv
    from gauntlet.workflows.cli import main as gauntlet

    def run_client(req, python=None, watch=None):  # noqa: ANN001, ARG001 - perf.run_client's signature
        argv = client_argv(req)
        n = req.num_prompts
        print(f"bench client stand-in: {n} prompts to {argv[argv.index('--base-url') + 1]}", flush=True)
        if behaviour.get("touch") and not Path(behaviour["touch"]).exists():
            Path(behaviour["touch"]).parent.mkdir(parents=True, exist_ok=True)
            Path(behaviour["touch"]).write_text("crash a rank now\n")
            time.sleep(float(behaviour.get("hold_s", 0)))
        return ClientRun({"completed": n, "failed": 0, "duration": 1.0, "num_prompts": n, "output_throughput": 10.0,
                          "request_throughput": 1.0, "total_input_tokens": n, "total_output_tokens": n,
                          "p99_ttft_ms": 100.0, "p99_e2el_ms": 1000.0}, 1.0, 1.0, "stand-in")

    if behaviour.get("measure") == "runner":
        _play_gate(argv[1], behaviour)
        return gauntlet(argv)
    def content_checks(profile, engine, spec, endpoint, out):   # noqa: ANN001, ARG001 - experiment.content_checks'
        from gauntlet.contract import Check
        print(f"Gate 3 content checks stand-in: {endpoint} (the engine stand-in serves no chat)", flush=True)
        return [Check("standin", "pass", None, None, "stand-in for Gate 3's content checks on the box's engine")]

    perf.run_client = run_client
    perf.preload_client = lambda: 0.0
    experiment.content_checks = content_checks
    return gauntlet([*argv, "--no-ceiling"])


def _play_gate(step: str, behaviour: dict) -> None:
    """Replace the gate's ``run`` by the behaviour's verdict (the runner around it stays real)."""
    from gauntlet.contract import Check
    from gauntlet.steps import load_step

    code = int(behaviour.get("exit", 0))
    status = behaviour.get("status") or STATUS_FOR_EXIT.get(code, "error")

    def play(opts, out):            # noqa: ANN001, ARG001 - a gate's run(opts, out)
        print(f"stand-in {step}: the real runner, the gate's judgement played: {status}", flush=True)
        time.sleep(float(behaviour.get("after_s", 0)))      # the gate's work (a perf round) takes this long
        return ([Check("standin", status, None, None, f"stand-in judgement for {step} on the box: {status}")],
                {"standin": True, "outputs": dict(behaviour.get("outputs") or {})})

    load_step(step).run = play         # a stand-in client has no ceiling of its own to measure


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


def _exit_when(path: str, rank: int, code: int) -> None:
    """A rank that serves until ``path`` exists, then exits ``code`` (an engine crashing mid-gate)."""
    while not Path(path).exists():
        time.sleep(0.2)
    print(f"engine stand-in: rank {rank} exits {code}: {path} appeared (a crash while serving)", flush=True)
    os._exit(code)


def run_engine(port: int, rank: int, served_name: str, behaviour: dict | None = None, host: str = "127.0.0.1") -> int:
    print(f"engine stand-in: rank {rank}, port {port}, model {served_name}", flush=True)
    if behaviour and "ranks" in behaviour and rank not in behaviour["ranks"]:
        behaviour = None                          # the behaviour is for other ranks: this one serves
    if behaviour and "exit" in behaviour and "on_file" in behaviour:
        threading.Thread(target=_exit_when, args=(behaviour["on_file"], rank, int(behaviour["exit"])),
                         daemon=True).start()
    elif behaviour and "exit" in behaviour:
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
    m = sub.add_parser("measured")
    m.add_argument("--behaviour", default="{}")
    m.add_argument("command", nargs=argparse.REMAINDER)
    e = sub.add_parser("engine")
    e.add_argument("--port", type=int, required=True)
    e.add_argument("--rank", type=int, default=0)
    e.add_argument("--served-name", default="model")
    e.add_argument("--behaviour", default="{}")
    e.add_argument("--host", default="127.0.0.1")
    a = p.parse_args(argv)
    if a.what == "step":
        return run_step(a.step, Path(a.out), json.loads(a.behaviour))
    if a.what == "measured":
        command = a.command[a.command.index("step"):] if "step" in a.command else a.command
        print(f"stand-in measured: the real {' '.join(command[:2])} with the bench client stood in for", flush=True)
        return run_measured(command, json.loads(a.behaviour))
    return run_engine(a.port, a.rank, a.served_name, json.loads(a.behaviour), a.host)


if __name__ == "__main__":
    sys.exit(main())
