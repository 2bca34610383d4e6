"""One engine client, one endpoint reading: ``http://h:p``, ``http://h:p/`` and ``http://h:p/v1`` reach the
same URLs in every gate that takes an endpoint (smoke, perf, longctx, experiment), against a recording server."""

from __future__ import annotations

import json
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from gauntlet.contract import Check, UsageError
from gauntlet.params import load_profile
from gauntlet.steps.gates import experiment
from gauntlet.steps.gates import experiment_baseline
from gauntlet.steps.gates import longctx
from gauntlet.steps.gates import perf
from gauntlet.steps.gates import smoke
from gauntlet.steps.client.bench import ClientRun, client_argv
from gauntlet.steps.client.http import EngineClient, normalize_endpoint
from loopback import JsonHandler

FORMS = ("{base}", "{base}/", "{base}/v1", "{base}/v1/")


class Recorder(JsonHandler):
    """An OpenAI-style engine that records every (method, path) it is asked for; 404 for anything else."""

    seen: list[tuple[str, str]]
    served = "smollm2-135m"

    def do_GET(self) -> None:  # noqa: N802
        self.seen.append(("GET", self.path))
        if self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": self.served, "object": "model"}]})
        elif self.path == "/metrics":
            self._send(200, "vllm:num_requests_running 0\nvllm:kv_cache_usage_perc 0.1\n", "text/plain")
        elif self.path == "/health":
            self._send(200, "")
        else:
            self._send(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:  # noqa: N802
        self.seen.append(("POST", self.path))
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self.path == "/tokenize":
            self._send(200, {"count": len(json.dumps(body)) // 5})
        elif self.path == "/v1/chat/completions" and body.get("stream"):
            chunk = {"choices": [{"index": 0, "delta": {"content": "5"}, "finish_reason": "stop"}]}
            self._send(200, f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n", "text/event-stream")
        elif self.path == "/v1/chat/completions":
            self._send(200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": "5"},
                                          "finish_reason": "stop"}], "usage": {"prompt_tokens": 10}})
        else:
            self._send(404, {"error": {"message": f"no route {self.path}"}})


@pytest.fixture
def engine():
    seen: list[tuple[str, str]] = []
    handler = type("H", (Recorder,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


@pytest.fixture
def fake_bench(monkeypatch):
    """The bench client replaced by a recorder of the base URL it was given (no vLLM import)."""
    urls: list[str] = []

    def run_client(req, python=None, **_):
        argv = client_argv(req)
        urls.append(argv[argv.index("--base-url") + 1] + argv[argv.index("--endpoint") + 1])
        n = req.num_prompts
        return ClientRun({"completed": n, "failed": 0, "duration": 1.0, "num_prompts": n,
                          "output_throughput": 10.0, "request_throughput": 1.0, "total_input_tokens": n,
                          "total_output_tokens": n}, 1.0, 1.0, "fake")

    monkeypatch.setattr(perf, "run_client", run_client)
    monkeypatch.setattr(perf, "preload_client", lambda: 0.0)
    return urls


def _each_form(base: str, seen: list, run_gate) -> list[tuple[set, tuple]]:
    """Per endpoint form: (the requests the engine saw, the bench client's URLs)."""
    got = []
    for form in FORMS:
        seen.clear()
        bench_urls = run_gate(form.format(base=base))
        got.append((set(seen), tuple(bench_urls or ())))
    return got


def test_normalize_endpoint_and_one_line_usage_error():
    for form in FORMS:
        assert normalize_endpoint(form.format(base="http://h:1")) == "http://h:1"
    with pytest.raises(UsageError, match=r"^--baseline-endpoint 'h:1': expected an http\(s\) URL"):
        normalize_endpoint("h:1", "--baseline-endpoint")
    assert EngineClient("http://h:1/v1/").url("/v1/models") == "http://h:1/v1/models"


def test_smoke_reaches_the_same_urls(engine, tmp_path):
    base, seen = engine
    profile = load_profile("local-cpu")

    def gate(ep):
        smoke.run(smoke.Options(profile=profile, endpoint=ep), _fresh(tmp_path))

    got = _each_form(base, seen, gate)
    assert got[0] == got[1] == got[2] == got[3]
    assert {p for _, p in got[0][0]} == {"/v1/models", "/v1/chat/completions"}


def test_longctx_reaches_the_same_urls(engine, tmp_path):
    base, seen = engine
    profile = load_profile("local-cpu")

    def gate(ep):
        longctx.run(longctx.Options(profile=profile, engine="vllm", endpoint=ep, rungs="1024"), _fresh(tmp_path))

    got = _each_form(base, seen, gate)
    assert got[0] == got[1] == got[2] == got[3]
    assert {p for _, p in got[0][0]} == {"/v1/models", "/tokenize", "/v1/chat/completions"}


def test_perf_reaches_the_same_urls(engine, fake_bench, tmp_path):
    base, seen = engine
    profile = load_profile("local-cpu")

    def gate(ep):
        fake_bench.clear()
        perf.run(perf.Options(profile=profile, engine="vllm", endpoint=ep, cases=("c2-128-32",), tokenizer="t",
                              no_store=True, no_ceiling=True, sample_interval=60.0), _fresh(tmp_path))
        return sorted(set(fake_bench))

    got = _each_form(base, seen, gate)
    assert got[0] == got[1] == got[2] == got[3]
    assert got[0] == ({("GET", "/metrics")}, (f"{base}/v1/completions",))


def test_experiment_reaches_the_same_urls(engine, fake_bench, tmp_path, monkeypatch):
    from gauntlet.steps.gates import deploy
    from gauntlet.steps.gates import teardown
    base, seen = engine
    profile = load_profile("local-cpu")
    deployed: list[str] = []
    monkeypatch.setattr(deploy, "run", lambda opts, out: ([], {"outputs": {"endpoint": deployed[-1]}}))
    monkeypatch.setattr(teardown, "run", lambda opts, out: ([], {}))
    real_content = experiment.content_checks

    def content_checks(*args):
        """Gate 3's real content checks reach the recorder (their URLs are under test here too); the recorder
        answers every question "5", so their verdict is played as passed, or the variant would not be measured."""
        return [Check(c.name, "pass", c.expected, c.observed, c.detail) for c in real_content(*args)]

    monkeypatch.setattr(experiment, "content_checks", content_checks)
    bench = {"tokenizer": "t", "no_store": True, "no_ceiling": True, "sample_interval": 60.0}

    def gate(ep):
        fake_bench.clear()
        deployed.append(ep)                       # the variant's endpoint as deploy wrote it, in the same form
        seq = _fresh(tmp_path)                    # the baseline's phases first (its own task), then the variant
        experiment_baseline.run(experiment_baseline.Options(profile=profile, engine="vllm", endpoint=ep, **bench),
                                seq / experiment.BASELINE_TASK)
        _, m = experiment.run(experiment.Options(profile=profile, engine="vllm", variant="prefix-cache",
                                                 baseline_dir=tmp_path / "no-perf", **bench), seq / "exp-prefix-cache")
        assert set(m["comparisons"]) == set(m["baseline_tables"]) == {"cold", "reusable_prefix"}
        return sorted(set(fake_bench))

    got = _each_form(base, seen, gate)
    assert got[0] == got[1] == got[2] == got[3]
    # the variant's content checks (models, chat) and the sampler's /metrics; the bench client's one base URL
    assert got[0] == ({("GET", "/metrics"), ("GET", "/v1/models"), ("POST", "/v1/chat/completions")},
                      (f"{base}/v1/completions",))


def test_a_bad_endpoint_is_a_usage_error_naming_its_flag():
    profile = load_profile("local-cpu")
    with pytest.raises(UsageError, match="^--endpoint '127.0.0.1:1'"):
        perf.Options(profile=profile, engine="vllm", endpoint="127.0.0.1:1", cases=("c2-128-32",))
    with pytest.raises(UsageError, match="^--endpoint 'ftp://h'"):
        experiment_baseline.Options(profile=profile, engine="vllm", endpoint="ftp://h")


_n = iter(range(10**6))


def _fresh(tmp_path: Path) -> Path:
    d = tmp_path / f"out{next(_n)}"
    d.mkdir()
    return d
