"""What the Kimi K3 engines really run, decided by the installed SGLang 0.5.23 and vLLM 0.32 themselves: the env
variables each reads (its own registry), the NCCL variables SGLang sets at start-up (its own
``_set_envs_and_config`` on the ServerArgs it builds from each rank's argv), symmetric memory out of the baseline,
and the attention backends each resolves from its command (shown beside the A/B table)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from gauntlet.params import load_profile
from gauntlet.steps.engines.commands import apply_change, engine_env
from gauntlet.steps.evidence.report import fair_ab
from gauntlet.steps.gates.engine_check import collect, has_linear_attention, judge, planned_argvs

pytestmark = pytest.mark.slow
KIMI = load_profile("kimi-k3-h20")
SYMM = next(v for v in KIMI.experiments if v.name == "symm-mem")


@pytest.fixture(scope="module")
def sglang():
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang is not installed (.ci/install-sglang.sh)")
    from gauntlet.steps.engines.sglang import SglangAdapter
    return SglangAdapter()


@pytest.fixture(scope="module")
def vllm():
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed")
    from gauntlet.steps.engines.vllm import VllmAdapter
    return VllmAdapter()


# ---- env names, by each engine's own registry

def test_sglang_flags_the_names_its_registry_does_not_read(sglang):
    got = sglang.env_problems(["SGL_ENABLE_JIT_DEEPGEMM", "SGLANG_ENABLE_JIT_DEEPGEMM", "SGLANG_DEEPGEMM_ON_H20",
                               "SGLANG_NO_SUCH_KNOB", "SGLANG_ENABLE_CP_V2", "NCCL_CUMEM_ENABLE"])
    assert set(got) == {"SGL_ENABLE_JIT_DEEPGEMM", "SGLANG_NO_SUCH_KNOB", "SGLANG_ENABLE_CP_V2"}, got
    assert "reads SGLANG_ENABLE_JIT_DEEPGEMM" in got["SGL_ENABLE_JIT_DEEPGEMM"]      # its legacy-prefix rewrite
    assert "deprecated" in got["SGLANG_ENABLE_CP_V2"]                                  # its _DEPRECATED_ENVS
    assert "reads no such variable" in got["SGLANG_NO_SUCH_KNOB"]


def test_kimi_sglang_env_is_read_by_sglang_and_the_legacy_name_fails_gate0(sglang):
    spec = KIMI.engines["sglang"]
    names = [*engine_env("sglang", spec), *spec.secret_env]
    assert "SGLANG_ENABLE_JIT_DEEPGEMM" in names and not any(n.startswith("SGL_") for n in names)
    argvs = {"rank0": planned_argvs(KIMI, "sglang", "/m")["rank0"]}
    checks = {c.name: c for c in judge(collect(sglang, argvs, names), KIMI, "sglang", None, "")}
    assert checks["engine-env"].status == "pass", checks["engine-env"].detail
    legacy = [*(n for n in names if n != "SGLANG_ENABLE_JIT_DEEPGEMM"), "SGL_ENABLE_JIT_DEEPGEMM"]   # the old profile
    c = {c.name: c for c in judge(collect(sglang, argvs, legacy), KIMI, "sglang", None, "")}["engine-env"]
    assert c.status == "fail" and "SGL_ENABLE_JIT_DEEPGEMM: a legacy SGL_ name" in c.detail


def test_vllm_flags_a_name_its_registry_does_not_know(vllm):
    got = vllm.env_problems(["VLLM_HOST_IP", "VLLM_NO_SUCH_KNOB", "NCCL_CUMEM_ENABLE"])
    assert list(got) == ["VLLM_NO_SUCH_KNOB"] and "Unknown vLLM environment variable" in got["VLLM_NO_SUCH_KNOB"]


def test_no_engine_of_the_h20_profile_sets_mnnvl():
    """H20 has no multi-node NVLink: NCCL <= 2.22 fails with NCCL_MNNVL_ENABLE=1 there."""
    for name, spec in KIMI.engines.items():
        assert "NCCL_MNNVL_ENABLE" not in engine_env(name, spec), name


# ---- symmetric memory: a Gate 6 variant; the NCCL env as SGLang itself sets it

_SGLANG_STARTUP = """
import json, os, sys
argv, env = json.loads(sys.argv[1]), json.loads(sys.argv[2])
for k in [k for k in os.environ if k.startswith(("NCCL_", "SGLANG_SYMM"))]:
    del os.environ[k]
os.environ.update(env)                                   # what the pod starts with
from gauntlet.steps.engines import parser_facts as pf
from gauntlet.steps.engines.sglang import SglangAdapter
a = SglangAdapter()
ns, err = pf.parse(a._parser, argv)
record = a._server_args.from_cli_args(ns)                # the ServerArgs sglang.launch_server builds
from sglang.srt.entrypoints.engine import _set_envs_and_config
_set_envs_and_config(record)                             # what every rank runs before any NCCL group exists
print(json.dumps({"symm": record.enable_symm_mem,
                  "env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}}))
"""


def _sglang_startup(argv: list[str], env: dict[str, str]) -> dict:
    r = subprocess.run([sys.executable, "-c", _SGLANG_STARTUP, json.dumps(argv), json.dumps(env)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_symm_mem_is_a_variant_and_the_probe_gets_the_nccl_env_sglang_sets(sglang):
    """The baseline's rank0 argv: no symmetric memory, and SGLang leaves NVLS off (it sets NCCL_NVLS_ENABLE=0
    when unset); the symm-mem variant's: SGLang forces NCCL_NVLS_ENABLE=1 and NCCL_CUMEM_ENABLE=1. In both,
    engine_env (what the pods and Gate 1's NCCL probe get) holds exactly the NCCL values SGLang ends up with."""
    assert SYMM.engine == "sglang" and SYMM.change == {"enable_symm_mem": True}
    base = KIMI.engines["sglang"]
    for spec, symm, nvls in ((base, False, "0"), (apply_change(base, SYMM.change), True, "1")):
        argv = planned_argvs(KIMI.model_copy(update={"engines": {**KIMI.engines, "sglang": spec},
                                                     "experiments": []}), "sglang", "/m")["rank0"]
        assert ("--enable-symm-mem" in argv) is symm
        pod = {k: v for k, v in engine_env("sglang", spec).items() if not k.startswith("SGLANG_")}
        got = _sglang_startup(argv, pod)
        assert got["symm"] is symm and got["env"]["NCCL_NVLS_ENABLE"] == nvls
        assert got["env"] == {k: v for k, v in pod.items() if k.startswith("NCCL_")}, (got["env"], pod)
    # the variant's argv is what Gate 0 checks too
    assert "--enable-symm-mem" in planned_argvs(KIMI, "sglang", "/m")["symm-mem/rank0"]


# ---- attention: what each engine resolves from its command

def test_one_attention_value_is_different_knobs_on_each_engine_and_the_report_says_so(sglang, vllm):
    """attention_backend: flashmla is SGLang's --decode-attention-backend (prefill stays SGLang's default) and
    vLLM's --attention-backend FLASHMLA (an MLA layer's prefill stays vLLM's mla_prefill_backend default)."""
    s = sglang.attention(planned_argvs(KIMI, "sglang", "/m")["rank0"])
    v = vllm.attention(planned_argvs(KIMI, "vllm", "/m")["rank0"])
    assert s == {"prefill": "auto", "decode": "flashmla"}
    assert v == {"prefill": "FLASHMLA", "prefill (MLA layers)": "auto", "decode": "FLASHMLA"}
    ok, why = fair_ab(KIMI, ["sglang", "vllm"], {"sglang": s, "vllm": v})
    assert ok and "attention backends differ" in why
    assert "sglang prefill auto, decode flashmla" in why and "vllm prefill FLASHMLA, prefill (MLA layers) auto" in why
    # an explicit, equal backend on both phases of both engines reads as the same; unrecorded is said
    same = {"prefill": "fa3", "decode": "fa3"}
    assert "the same attention backends" in fair_ab(KIMI, ["sglang", "vllm"], {"sglang": same, "vllm": same})[1]
    assert "are not recorded" in fair_ab(KIMI, ["sglang", "vllm"], {"sglang": s})[1]


def test_kimi_linear_attention_layers_are_named_as_each_engine_runs_them(sglang, vllm):
    """69 of Kimi K3's 93 layers are KDA, which no attention backend serves: SGLang's --linear-attn-backend
    (triton unless a phase's own flag says otherwise, read from its ServerArgs record) and vLLM's KDA layer
    (Triton; its prefill from --additional-config kda_prefill_backend). A model without such layers gets none."""
    assert has_linear_attention(KIMI) and not has_linear_attention(load_profile("local-cpu"))
    argv_s, argv_v = (planned_argvs(KIMI, e, "/m")["rank0"] for e in ("sglang", "vllm"))
    assert sglang.attention(argv_s, linear=True) == {"prefill": "auto", "decode": "flashmla",
                                                     "linear prefill": "triton", "linear decode": "triton"}
    # SGLang's own record decides: a phase's flag over the base one
    got = sglang.attention([*argv_s, "--linear-attn-decode-backend", "flashinfer"], linear=True)
    assert got is not None and got["linear decode"] == "flashinfer" and got["linear prefill"] == "triton"
    assert vllm.attention(argv_v, linear=True) == {
        "prefill": "FLASHMLA", "prefill (MLA layers)": "auto", "decode": "FLASHMLA",
        "linear prefill": "triton", "linear decode": "triton"}
    # what Gate 0 records for the Kimi profile carries the KDA rows (collect's linear=, from the profile)
    facts = collect(sglang, {"rank0": argv_s}, linear=has_linear_attention(KIMI))
    assert facts["attention"]["linear decode"] == "triton"


def test_the_report_shows_what_each_engine_runs_from_its_gate0_verdict(sglang, vllm):
    """The A/B section reads each engine's resolution from its engine-check verdict (metrics.attention, what
    engine_check.run records), not from the profile's one attention_backend value."""
    from gauntlet.steps.evidence.report import render_markdown

    def perf(engine: str) -> dict:
        t = {"output_throughput": {"min": 9.0, "median": 10.0, "max": 11.0}}
        return {"gate": "perf", "status": "pass", "metrics": {"engine": engine, "cases": {
            "c16": {"concurrency": 16, "input_len": 1024, "output_len": 256, "rounds": [], "table": t}}}}

    verdicts = {f"{e}/{g}": d for e in ("sglang", "vllm") for g, d in (
        ("perf", perf(e)),
        ("engine-check", {"gate": "engine-check", "status": "pass", "metrics": {
            "engine": e, "attention": (sglang if e == "sglang" else vllm).attention(
                planned_argvs(KIMI, e, "/m")["rank0"], linear=True)}}))}
    ab = render_markdown({"run_id": "r", "verdicts": verdicts}, KIMI)
    ab = ab[ab.index("### Engine comparison"):]
    assert "Fair A/B: same topology" in ab and "attention backends differ" in ab
    assert ("sglang prefill auto, decode flashmla, linear prefill triton, linear decode triton; vllm prefill "
            "FLASHMLA, prefill (MLA layers) auto, decode FLASHMLA, linear prefill triton, linear decode triton") \
        in ab, ab[:1500]
