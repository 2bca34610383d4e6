"""Per-rank expert load (issue 20, deliver 2): SGLang's stat-mode dump summed per EP rank, the perf step's hook
around a case's measured rounds against a stand-in SGLang answering the recorder's three endpoints, the results
store's table, the report's section and the engine pod's shared dump directory."""

from __future__ import annotations

import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from loopback import JsonHandler

from gauntlet.params import load_profile
from gauntlet.params.models import EngineArgs
from gauntlet.steps.cluster import telemetry as _telemetry
from gauntlet.steps.cluster.expert_load import Recorder, placement, recorder_for, summarize

KIMI = load_profile("kimi-k3-h20")
LAYERS, EXPERTS, EP = 3, 16, 4          # 4 experts per EP rank


def _logical_count(steps: int = 5) -> torch.Tensor:
    """(steps, layers, experts) int32 as SGLang's _StatAccumulator dumps it: every expert gets 1 token per step
    and layer, expert 5 (EP rank 1) 13 more in every layer, expert 15 (rank 3) 1 more in layer 2 only."""
    c = torch.ones((steps, LAYERS, EXPERTS), dtype=torch.int32)
    c[:, :, 5] += 13
    c[:, 2, 15] += 1
    return c


def _save(directory: Path, t: float, steps: int = 5) -> Path:
    """What SGLang's rank 0 writes on a dump (expert_distribution.py ``_dump_to_file``)."""
    f = directory / f"expert_distribution_recorder_{t}.pt"
    torch.save({"rank": 0, "logical_count": _logical_count(steps), "average_utilization_rate_over_window": None},
               str(f))
    return f


def test_a_stat_dump_is_summed_per_ep_rank_with_its_imbalance(tmp_path):
    f = _save(tmp_path, 1765000000.25)
    d = _telemetry.dump_counts(f)
    assert (d["steps"], d["layers"], d["experts"]) == (5, LAYERS, EXPERTS)
    assert d["counts"][0][5] == 5 * 14 and d["counts"][2][15] == 10 and d["counts"][1][15] == 5
    s = summarize(d["counts"], EP, steps=d["steps"])
    # per layer: 16 experts x 5 + 13 x 5 on expert 5 (+5 on expert 15 in layer 2); rank 1 holds experts 4..7
    per_layer_rank = [4 * 5, 4 * 5 + 65, 4 * 5, 4 * 5]
    assert s["per_rank_tokens"] == [3 * per_layer_rank[0], 3 * per_layer_rank[1], 3 * 20, 3 * 20 + 5]
    assert s["tokens"] == sum(s["per_rank_tokens"]) == 3 * (16 * 5 + 65) + 5
    assert s["imbalance"] == pytest.approx(max(s["per_rank_tokens"]) / (s["tokens"] / EP))
    # layers 0 and 1 are the worst: layer 2's extra tokens land on another rank and raise its mean
    assert s["imbalance_layer_max"] == pytest.approx(85 / (145 / 4))
    assert s["imbalance_layer_mean"] == pytest.approx((2 * 85 / (145 / 4) + 85 / (150 / 4)) / 3)
    hot = s["hottest"][0]
    assert (hot["expert"], hot["rank"], hot["tokens"]) == (5, 1, 70)
    assert hot["x_layer_mean"] == pytest.approx(70 / ((145 if hot["layer"] < 2 else 150) / 16))


def test_a_balanced_load_is_imbalance_one_and_a_skewed_one_is_not():
    assert summarize([[7] * 8] * 2, 4)["imbalance"] == pytest.approx(1.0)
    assert summarize([[1, 1, 1, 1, 1, 1, 1, 9]], 4)["imbalance"] == pytest.approx(10 / 4)


def test_redundant_experts_or_no_ep_report_logical_totals_only():
    ep, why = placement(EngineArgs(context_length=1024, tp_size=16, ep_size=16,
                                   extra={"ep-num-redundant-experts": 32}))
    assert ep is None and "not supported" in why
    ep, why = placement(EngineArgs(context_length=1024, tp_size=8))
    assert ep is None and "ep_size 1" in why
    s = summarize([[3, 1, 0, 0]], None, why)
    assert s["per_rank_tokens"] is None and s["imbalance"] is None and s["tokens"] == 4 and s["note"] == why
    assert s["hottest"][0]["rank"] is None
    # experts that do not split over the EP size: not SGLang's trivial placement, never a guessed one
    assert summarize([[1] * 6], 4)["per_rank_tokens"] is None


def test_the_newest_dump_since_the_stop_is_the_one_read(tmp_path):
    _save(tmp_path, 100.5)
    new = _save(tmp_path, 200.5)
    (tmp_path / "expert_distribution_recorder_junk.pt").write_text("x")
    assert _telemetry.newest_dump(tmp_path, 150) == new
    assert _telemetry.newest_dump(tmp_path, 300) is None
    assert _telemetry.expert_load(tmp_path, 300, wait_s=0)[0] == 404
    (tmp_path / "expert_distribution_recorder_400.0.pt").write_bytes(b"truncated")
    code, body = _telemetry.expert_load(tmp_path, 300, wait_s=0)
    assert code == 500 and "expert_distribution_recorder_400.0.pt" in body["error"] and "\n" not in body["error"]


class _SGLang(JsonHandler):
    """SGLang 0.5.23's three recorder endpoints: text replies; the dump writes rank 0's file into ``dump_dir``."""
    events: list[str] = []
    dump_dir: Path
    fail: set[str] = set()

    def do_POST(self) -> None:  # noqa: N802
        what = self.path.strip("/").removesuffix("_expert_distribution_record")
        if what not in ("start", "stop", "dump"):
            return self._send(404, {"detail": "Not Found"})
        if what in self.fail:
            return self._send(500, "Internal Server Error", "text/plain")
        self.events.append(what)
        if what == "dump":
            _save(self.dump_dir, time.time())
        self._send(200, f"{what.title()} expert distribution record.\n", "text/plain")

    def do_GET(self) -> None:  # noqa: N802 - the perf sampler's /metrics scrape
        self._send(404, {"detail": "Not Found"})


@pytest.fixture
def sglang(tmp_path):
    d = tmp_path / "dumps"
    d.mkdir()
    handler = type("H", (_SGLang,), {"events": [], "dump_dir": d, "fail": set()})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", handler
    srv.shutdown()


@pytest.fixture
def sidecar(sglang):
    """Rank 0's telemetry sidecar serving the dump directory it shares with the engine."""
    srv = _telemetry.serve(_telemetry.Sampler(_telemetry.Reader(nvml=False, smi=None)), "127.0.0.1", 0,
                           str(sglang[1].dump_dir))
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def test_perf_records_each_case_between_warmup_and_after_its_rounds(tmp_path, monkeypatch, sglang, sidecar):
    from gauntlet.steps.gates import perf
    from gauntlet.steps.client.bench import ClientRun
    url, h = sglang

    def fake_client(req, python=None, **_):
        h.events.append(req.result_path.stem.rsplit("-", 1)[-1])
        n = req.num_prompts
        return ClientRun({"completed": n, "failed": 0, "num_prompts": n, "duration": 1.0, "output_throughput": 40.0,
                          "max_concurrency": 2, "ttfts": [0.1] * n, "start_times": list(range(n)),
                          "p50_ttft_ms": 100.0}, 1.0, 1.0, "fake")

    monkeypatch.setattr(perf, "run_client", fake_client)
    experts, why = recorder_for(KIMI, "sglang", url + "/v1", sidecar)
    assert experts is not None, why
    case = KIMI.bench.cases[0]
    res = perf.measure_case(case, KIMI, endpoint=url, tokenizer="t", out=tmp_path, meta={}, sample_interval=60.0,
                            experts=experts)
    rounds = [f"round{i}" for i in range(1, KIMI.bench.rounds + 1)]
    assert h.events == ["warmup", "start", *rounds, "stop", "dump"]
    e = res.expert_load
    assert e["ep_size"] == 16 and e["mode"] == "stat" and e["file"].startswith("expert_distribution_recorder_")
    assert e["per_rank_tokens"] == [15] * 5 + [15 + 3 * 65] + [15] * 9 + [15 + 5]    # one expert per rank
    rows = perf.expert_rows([res], {"run_id": "r", "profile": "kimi-k3-h20", "engine": "sglang",
                                    "date": "2026-12-04"})
    from gauntlet.steps.evidence.results import append_expert_load, read_rounds
    append_expert_load(rows, tmp_path / "store")
    t = read_rounds(tmp_path / "store", table="expert_load")
    assert t.column("imbalance").to_pylist() == [pytest.approx(e["imbalance"])]
    assert t.column("per_rank_tokens").to_pylist() == [e["per_rank_tokens"]]


def test_an_engine_that_refuses_the_recorder_is_an_error_line_not_a_failed_case(tmp_path, sglang, sidecar):
    url, h = sglang
    h.fail.add("start")
    r = Recorder(url, KIMI.engines["sglang"].args, sidecar, timeout_s=5)
    err = r.start()
    assert "start_expert_distribution_record" in err and "500" in err and "\n" not in err
    h.fail.discard("start")
    assert r.start() is None
    h.fail.add("dump")
    assert "stop/dump_expert_distribution_record" in r.finish()["error"]


def test_engines_without_the_interface_are_named():
    local = load_profile("local-cpu")
    assert recorder_for(local, "vllm", "http://x", None) == (
        None, "vllm has no expert distribution interface (SGLang's recorder is the one read)")
    spec = KIMI.engines["sglang"]
    args = spec.args.model_copy(update={"expert_distribution_recorder_mode": None})
    p = KIMI.model_copy(update={"engines": {**KIMI.engines, "sglang": spec.model_copy(update={"args": args})}})
    r, why = recorder_for(p, "sglang", "http://x", "http://y")
    assert r is None and "unset" in why


def test_report_puts_a_table_per_case_next_to_throughput():
    from gauntlet.steps.evidence.report import expert_load_section
    load = summarize([[1, 1, 1, 9]] * 2, 2, steps=40)
    md = "\n".join(expert_load_section("sglang", {"c16": {"expert_load": {"mode": "stat", **load}},
                                                   "c32": {"expert_load": {"error": "reading the dump: boom"}}}))
    assert "#### Per-rank expert load: sglang" in md
    row = next(x for x in md.splitlines() if x.startswith("| c16 |"))
    assert "| 40 | 24 | 2 | 4–20 | 1.67 |" in row and "L0/E3→r1" in row
    assert "| c32 |" in md and "not recorded: reading the dump: boom" in md
    none = expert_load_section("sglang", {"c16": {"expert_load": {"skipped": "sglang: mode is unset"}}})
    assert none == ["- per-rank expert load: not recorded in this run (sglang: mode is unset)"]
    assert "llama.cpp has no expert distribution interface" in expert_load_section("llamacpp", {})[0]


def test_the_sglang_engine_container_samples_its_own_dump_directory():
    """SGLang's rank 0 writes its dumps into a size-bounded emptyDir of the engine container; the sampler, started
    in that container by the launch script, serves them (and its memory share is counted in the request)."""
    from gauntlet.steps.backends.kubernetes.manifests import EXPERT_DIR, SAMPLER_MEMORY_GIB, engine_statefulset
    sts = engine_statefulset(KIMI, "sglang", "run1", "img")
    pod = sts["spec"]["template"]["spec"]
    (eng,) = pod["containers"]
    assert {"name": "SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR", "value": EXPERT_DIR} in eng["env"]
    assert {"name": "expert-distribution", "mountPath": EXPERT_DIR} in eng["volumeMounts"]
    assert f"--expert-dir {EXPERT_DIR}" in eng["command"][2]
    assert {"name": "expert-distribution", "emptyDir": {"sizeLimit": "20Gi"}} in pod["volumes"]
    spec = KIMI.engine("sglang")
    assert eng["resources"]["requests"]["memory"] == f"{spec.shm_size_gib + spec.resident_gib + SAMPLER_MEMORY_GIB[True]}Gi"
    import kubernetes_validate
    kubernetes_validate.validate(sts, "1.37.0", strict=True)
    (vllm,) = engine_statefulset(KIMI, "vllm", "run1", "img")["spec"]["template"]["spec"]["containers"]
    assert "expert-distribution" not in str(vllm["volumeMounts"]) and "--expert-dir" not in vllm["command"][2]
