"""A stand-in engine for process-group tests: `python fake_engine.py MODE PORT NAME`.

Modes: ready (serves /health and /v1/models after a short delay), die (exits 3),
hang (never answers), stubborn (ignores SIGTERM; only SIGKILL stops it).
Every mode forks a grandchild first, like vLLM's engine core, so group kills are tested for real.
"""

import json
import os
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

mode, port, name = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if os.fork() == 0:                                    # the "engine core": same process group
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(1)
print(f"fake engine {mode} on {port} pgid={os.getpgid(0)}", flush=True)
if mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if mode == "die":
    time.sleep(0.5)
    print("RuntimeError: fake engine could not allocate the KV cache", flush=True)
    os._exit(3)
if mode in ("hang", "stubborn"):
    while True:
        time.sleep(1)


class H(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/health":
            body = b""
        elif self.path == "/v1/models":
            body = json.dumps({"object": "list", "data": [{"id": name, "object": "model"}]}).encode()
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


time.sleep(0.5)
HTTPServer(("127.0.0.1", port), H).serve_forever()
