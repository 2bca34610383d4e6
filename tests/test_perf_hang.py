"""Gate 4: a round whose engine stops making progress fails naming the hang, never as a retried bench error.

No hung NCCL collective can run here (it needs an engine on several GPUs), so the engine is a stand-in as
small as the contract the watch reads: an OpenAI-shaped server whose streamed completion stops after its
first token and whose /metrics keeps reporting requests running with a token counter that no longer moves,
which is what a hung rank leaves (steps/client/stall.py). The client is the real ``vllm bench serve``.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from gauntlet.contract import EXIT_FAIL
from gauntlet.params.loader import ProfileError
from gauntlet.params import load_profile, profile_path
from gauntlet.steps.client.stall import EngineHang, Stall, hang_reason, longest_stall, stall_of
from gauntlet.steps.cluster.rank_watch import Rank

PROFILE = load_profile("local-cpu")


def _samples(values, busy=2.0, step=1.0):
    return [{"t": i * step, "engine_tokens_processed": v, "engine_running": busy, "engine_waiting": 0.0}
            for i, v in enumerate(values)]


def test_a_counter_that_stops_is_a_stall_measured_between_readings():
    s = stall_of(_samples([10, 20, 30, 30, 30, 30]))
    assert s == Stall(3.0, 2.0, 30.0)
    assert stall_of(_samples([10, 20, 30])).seconds == 0.0
    # a failed scrape adds nothing: the stall is measured up to the last reading of the counter
    gap = [*_samples([5, 5]), {"t": 9.0, "engine_running": None}]
    assert stall_of(gap).seconds == 1.0
    assert stall_of([{"t": 1.0, "engine_running": 3.0}]) is None     # the engine exports no counter
    assert longest_stall(_samples([1, 1, 1, 2, 2, 3])) == 2.0
    assert longest_stall(_samples([1, 1, 1], busy=0.0)) == 0.0        # idle between requests: no stall


def test_the_hang_names_what_was_seen_and_the_ranks():
    up = [Rank(0, "uid-a", 0, True, "kimi-0 on h20-01"), Rank(1, "uid-b", 0, True, "kimi-1 on h20-02")]
    stall = Stall(125.0, 16.0, 48213.0)
    why = hang_reason(stall, 120, up)
    assert why is not None and "no token for 125 s" in why and "16 request(s)" in why
    assert "while all 2 rank(s) are up: a hung collective" in why
    down = [up[0], Rank(1, "uid-b", 0, False, "kimi-1 on h20-02")]
    assert "rank(s) 1 (kimi-1 on h20-02) not running: a rank failure" in str(hang_reason(stall, 120, down))
    assert "could not be read (api down)" in str(hang_reason(stall, 120, "api down"))
    assert hang_reason(Stall(119.0, 16.0, 1.0), 120, up) is None      # not yet
    assert hang_reason(Stall(500.0, 0.0, 1.0), 120, up) is None       # nothing in the engine: idle, not hung
    assert EngineHang("x").exit_code == EXIT_FAIL


def test_hang_timeout_is_the_profiles_with_a_default_below_the_engines_watchdogs(tmp_path):
    assert PROFILE.bench.hang_timeout_s == 120 and load_profile("kimi-k3-h20").bench.hang_timeout_s == 120
    doc = yaml.safe_load(profile_path("local-cpu").read_text())
    doc["bench"]["hang_timeout_s"] = 1
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(ProfileError) as e:
        load_profile(bad)
    assert "bench.hang_timeout_s" in str(e.value) and "\n" not in str(e.value)


def test_a_watched_subprocess_client_is_killed_and_the_hang_raised(tmp_path):
    from gauntlet.steps.client.bench import run_logged
    t0 = time.monotonic()
    calls = []

    def watch():
        calls.append(time.monotonic())
        return "no token for 1 s" if len(calls) >= 2 else None

    with pytest.raises(EngineHang) as e:
        run_logged([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "c.log", "bench client", None,
                   watch, 0.2)
    assert time.monotonic() - t0 < 10 and str(e.value) == "no token for 1 s; the bench client was stopped"


class _Stuck(BaseHTTPRequestHandler):
    """Streams one token of every completion and then nothing; /metrics: requests running, counter frozen."""

    release = threading.Event()
    completions = 0

    def log_message(self, *args):
        pass

    def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/metrics":
            self._send(200, b'vllm:num_requests_running{engine="0"} 2.0\n'
                            b'vllm:iteration_tokens_total_sum{engine="0"} 37.0\n'
                            b'vllm:kv_cache_usage_perc{engine="0"} 0.02\n', "text/plain")
        elif self.path == "/v1/models":
            self._send(200, json.dumps({"object": "list", "data": [{"id": PROFILE.model.served_name}]}).encode())
        else:
            self._send(404, b"{}")

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        if self.path != "/v1/completions":
            self._send(404, b"{}")
            return
        type(self).completions += 1
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        chunk = {"id": "c", "object": "text_completion", "model": PROFILE.model.served_name,
                 "choices": [{"index": 0, "text": " x", "finish_reason": None}]}
        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.flush()
        self.release.wait(120)       # the rank is stuck in its collective: no second token


@contextmanager
def _stuck_engine() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Stuck)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        _Stuck.release.set()
        srv.shutdown()
        srv.server_close()


@pytest.mark.slow  # the real client in-process (its import, 10-25 s on 2 cores), then a 5 s stall
def test_a_round_whose_engine_stops_fails_the_gate_naming_the_hang_not_exit_75(tmp_path, local_model):
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm not installed")
    from gauntlet.workflows.cli import main as gauntlet

    doc = yaml.safe_load(profile_path("local-cpu").read_text())
    doc["bench"].update(warmup_prompts=2, prompts_per_concurrency=2, hang_timeout_s=5)
    prof = tmp_path / "local-small.yaml"
    prof.write_text(yaml.safe_dump(doc))
    out = tmp_path / "run" / "vllm" / "perf"
    t0 = time.monotonic()
    with _stuck_engine() as url:
        rc = gauntlet(["step", "perf", "--profile", str(prof), "--out", str(out), "--engine", "vllm",
                       "--endpoint", url, "--cases", "c2-128-32,c4-128-32", "--tokenizer", str(local_model),
                       "--no-ceiling", "--no-store", "--sample-interval", "0.5"])
    took = time.monotonic() - t0
    v = json.loads((out / "verdict.json").read_text())
    assert rc == EXIT_FAIL and v["status"] == "fail", v["checks"]
    hang = next(c for c in v["checks"] if c["name"] == "c2-128-32/hang")
    assert hang["status"] == "fail" and "warmup: the engine processed no token for" in hang["detail"]
    assert "2 request(s) running or waiting" in hang["detail"] and "the bench client was stopped" in hang["detail"]
    # the case stopped at the hung warmup; the case after it was not sent to a stuck engine
    case = v["metrics"]["cases"]["c2-128-32"]
    assert case["warmup"]["valid"] is False and case["warmup"]["invalid_reason"].startswith("engine hang: ")
    assert case["rounds"] == [] and "c4-128-32" not in v["metrics"]["cases"]
    skipped = next(c for c in v["checks"] if c["name"] == "c4-128-32/measured")
    assert skipped["status"] == "skip" and "the engine hung in c2-128-32" in skipped["detail"]
    assert _Stuck.completions == 2 and took < 120      # the warmup's two requests, then stopped in seconds
    assert not any(c["status"] == "error" for c in v["checks"]) and "Traceback" not in json.dumps(v)

