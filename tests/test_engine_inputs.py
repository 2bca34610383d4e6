"""engines.*.env, engines.*.args.extra and results_uri: what lint refuses, offline, with one line naming the field.

The table of flags the typed fields set (params/engine_inputs.py TYPED_FLAGS) is kept whole by two tests:
every flag engine_command emits for a spec using every typed field is in it, and every alias the engine's own
parser has for one of them (vLLM's and SGLang's, where installed) is in it too.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gauntlet.contract import UsageError
from gauntlet.params import ProfileError, load_profile
from gauntlet.params.engine_inputs import TYPED_FLAGS, extra_duplicate
from gauntlet.params.loader import PROFILES_DIR
from gauntlet.params.models import EngineArgs, EngineSpec, SecretRef, Speculative
from gauntlet.steps.engines.commands import Placement, engine_command


def _doc(name: str = "kimi-k3-h20") -> dict:
    return yaml.safe_load((PROFILES_DIR / f"{name}.yaml").read_text())


def _load(tmp_path: Path, doc: dict) -> object:
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_profile(p)


def _refused(tmp_path: Path, doc: dict) -> str:
    with pytest.raises(ProfileError) as exc:
        _load(tmp_path, doc)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(str(tmp_path / "bad.yaml"))
    return msg


# ------------------------------------------------------------------ env

@pytest.mark.parametrize("name", ["LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "GCONV_PATH", "GLIBC_TUNABLES",
                                  "PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME", "PYTHONBREAKPOINT", "BASH_ENV", "ENV",
                                  "PATH", "IFS", "LLAMA_ARG_CTX_SIZE", "NODE_NAME", "GAUNTLET_ENGINE_DIR"])
def test_env_that_changes_the_loader_interpreter_or_shell_is_refused(tmp_path, name):
    doc = _doc()
    doc["engines"]["sglang"]["env"][name] = "/tmp/x"
    msg = _refused(tmp_path, doc)
    assert f"engines.sglang.env: {name}: refused:" in msg


@pytest.mark.parametrize("name", ["A B", "X=Y", "1ABC", "BASH_FUNC_f%%", ""])
def test_env_name_must_be_a_variable_name(tmp_path, name):
    doc = _doc()
    doc["engines"]["sglang"]["env"][name] = "1"
    assert "not an environment variable name" in _refused(tmp_path, doc)


@pytest.mark.parametrize("name, value", [
    ("HF_TOKEN", "abc"), ("HUGGING_FACE_HUB_TOKEN", "abc"), ("AWS_SECRET_ACCESS_KEY", "abc"),
    ("AWS_ACCESS_KEY_ID", "AKIA0000000000000000"), ("OPENAI_API_KEY", "abc"), ("DB_PASSWORD", "abc"),
    ("CLIENT_SECRET_FILE_CONTENT", "abc"),
    ("INNOCENT", "hf_" + "a" * 34),                     # a token's shape under any name
])
def test_credential_in_clear_is_refused_with_how_to_reference_a_secret(tmp_path, name, value):
    doc = _doc()
    doc["engines"]["vllm"]["env"][name] = value
    msg = _refused(tmp_path, doc)
    assert f"engines.vllm.env: {name}: a credential in clear" in msg
    assert f"env: {{{name}: {{secret: SECRET_NAME, key: KEY}}}}" in msg
    assert value not in msg


def test_harmless_names_pass(tmp_path):
    doc = _doc()
    doc["engines"]["vllm"]["env"].update({"TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1",
                                          "NCCL_IB_HCA": "mlx5", "HF_TOKEN": ""})
    assert _load(tmp_path, doc).engines["vllm"].env["TOKENIZERS_PARALLELISM"] == "false"


def test_env_can_reference_a_secret(tmp_path):
    doc = _doc()
    doc["engines"]["vllm"]["env"]["HF_TOKEN"] = {"secret": "hf-read", "key": "token"}
    spec = _load(tmp_path, doc).engines["vllm"]
    assert spec.env["HF_TOKEN"] == SecretRef(secret="hf-read", key="token")
    assert spec.secret_env == {"HF_TOKEN": SecretRef(secret="hf-read", key="token")}
    assert "HF_TOKEN" not in spec.clear_env
    assert str(spec.env["HF_TOKEN"]) == "<secret hf-read/token>"


@pytest.mark.parametrize("ref, needle", [({"secret": "Bad_Name", "key": "k"}, "engines.vllm.env.HF_TOKEN.secret.secret"),
                                         ({"secret": "ok", "key": "a/b"}, "engines.vllm.env.HF_TOKEN.secret.key"),
                                         ({"secret": "ok"}, "engines.vllm.env.HF_TOKEN.secret.key"),
                                         ({"secret": "ok", "key": "k", "value": "x"}, "unknown key")])
def test_a_bad_secret_reference_names_its_field(tmp_path, ref, needle):
    doc = _doc()
    doc["engines"]["vllm"]["env"]["HF_TOKEN"] = ref
    assert needle in _refused(tmp_path, doc)


def test_an_int_env_value_is_one_error(tmp_path):
    doc = _doc()
    doc["engines"]["vllm"]["env"]["OMP_NUM_THREADS"] = 1
    msg = _refused(tmp_path, doc)
    assert "engines.vllm.env.OMP_NUM_THREADS.value: expected str, got 1" in msg and ";" not in msg


# ------------------------------------------------------------------ extra

@pytest.mark.parametrize("engine, flag, field", [
    ("sglang", "model-path", "model.mount_path"), ("sglang", "model", "model.mount_path"),
    ("sglang", "port", "port"), ("sglang", "tp-size", "args.tp_size"), ("sglang", "tensor-parallel-size", "args.tp_size"),
    ("sglang", "context-length", "args.context_length"), ("sglang", "enable-hicache", "args.hicache"),
    ("sglang", "dist-init-addr", "hardware.nodes"), ("sglang", "tool-call-parser", "tool_call_parser"),
    ("vllm", "model", "model.mount_path"), ("vllm", "max-model-len", "args.context_length"),
    ("vllm", "tensor-parallel-size", "args.tp_size"), ("vllm", "no-enable-prefix-caching", "args.prefix_cache"),
    ("vllm", "served-model-name", "model.served_name"), ("vllm", "headless", "hardware.nodes"),
])
def test_extra_that_duplicates_a_typed_flag_is_refused(tmp_path, engine, flag, field):
    doc = _doc()
    doc["engines"][engine]["args"]["extra"] = {flag: "1"}
    msg = _refused(tmp_path, doc)
    assert f"engines.{engine}.args.extra.{flag}: --{flag} is set from {field}" in msg


def test_extra_that_abbreviates_a_typed_flag_is_refused(tmp_path):
    doc = _doc()
    doc["engines"]["vllm"]["args"]["extra"] = {"max-model": 4096}
    assert "--max-model abbreviates --max-model-len" in _refused(tmp_path, doc)


def test_llamacpp_extra_duplicate(tmp_path):
    doc = _doc("local-cpu")
    doc["engines"]["llamacpp"]["args"]["extra"] = {"ctx-size": 8192}
    assert "engines.llamacpp.args.extra.ctx-size: --ctx-size is set from args.context_length" in _refused(tmp_path, doc)


@pytest.mark.parametrize("flag", ["Model", "--port", "max_model_len", "a=b", "x;touch /tmp/p", "-x", "", "a b"])
def test_extra_flag_name_must_be_lowercase_words(tmp_path, flag):
    doc = _doc()
    doc["engines"]["vllm"]["args"]["extra"] = {flag: True}
    assert "not a flag name ([a-z0-9][a-z0-9-]*" in _refused(tmp_path, doc)


def test_extra_may_not_carry_a_credential(tmp_path):
    doc = _doc()
    doc["engines"]["vllm"]["args"]["extra"] = {"hf-token": "abc"}
    assert "engines.vllm.args.extra: hf-token: a credential in clear on the command line" in _refused(tmp_path, doc)
    doc["engines"]["vllm"]["args"]["extra"] = {"hf-token": True}     # vLLM: use the token the runner logged in with
    _load(tmp_path, doc)


def test_a_variant_changing_extra_is_checked_against_its_engines(tmp_path):
    doc = _doc()
    doc["experiments"] = [{"name": "ctx", "engine": "vllm", "change": {"extra.max-model-len": 8192}}]
    assert "experiments.ctx.change.extra.max-model-len: --max-model-len is set from args.context_length" in \
        _refused(tmp_path, doc)
    doc["experiments"] = [{"name": "ctx", "change": {"extra.tp-size": 2}}]     # every engine: sglang's flag
    assert "experiments.ctx.change.extra.tp-size: --tp-size is set from args.tp_size" in _refused(tmp_path, doc)
    doc["experiments"] = [{"name": "all", "engine": "vllm", "change": {"extra": {"port": 1, "enforce-eager": True}}}]
    assert "experiments.all.change.extra.port: --port is set from port" in _refused(tmp_path, doc)
    doc["experiments"] = [{"name": "ok", "engine": "vllm", "change": {"extra.enforce-eager": True}}]
    _load(tmp_path, doc)


def test_shipped_profiles_pass():
    for name in ("kimi-k3-h20", "h200-1gpu", "local-cpu"):
        load_profile(name)


def test_lint_exits_2_with_one_line(tmp_path):
    doc = _doc()
    doc["engines"]["sglang"]["env"]["LD_PRELOAD"] = "/tmp/evil.so"
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    r = subprocess.run([sys.executable, "-m", "gauntlet.workflows.cli", "lint", "--profile", str(p)],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "engines.sglang.env: LD_PRELOAD: refused" in r.stderr


# ------------------------------------------------------------------ results_uri

@pytest.mark.parametrize("uri, what", [
    ("s3://AKID:s3cr3t@bucket/results", "the password in user:password@"),
    ("s3://bucket/results?region=x&secret_key=s3cr3t", "the query parameter secret_key="),
    ("s3://bucket/results?access_key=AKID", "the query parameter access_key="),
    ("gs://bucket/r?access_token=ya29", "the query parameter access_token="),
    ("abfs://c@acct/r?token=abc", "the query parameter token="),
    ("s3://bucket/results?session_token=abc", "the query parameter session_token="),
])
def test_results_uri_with_a_credential_is_refused(tmp_path, uri, what):
    doc = _doc()
    doc["results_uri"] = uri
    msg = _refused(tmp_path, doc)
    assert f"results_uri: holds a credential ({what})" in msg and "Secret gauntlet-results" in msg
    assert "s3cr3t" not in msg


@pytest.mark.parametrize("uri", ["results", "/data/results", "s3://bucket/r?region=cn-north-1&endpoint_override=x",
                                 "abfs://container@account/r"])
def test_results_uri_without_credentials_passes(tmp_path, uri):
    doc = _doc()
    doc["results_uri"] = uri
    assert _load(tmp_path, doc).results_uri == uri


def test_results_store_refuses_a_credential_from_the_option_or_the_environment(monkeypatch):
    p = load_profile("kimi-k3-h20")
    with pytest.raises(UsageError, match=r"^--results-uri: holds a credential \(the password"):
        p.results_store("s3://a:b@bucket/x")
    monkeypatch.setenv("GAUNTLET_RESULTS_URI", "s3://bucket/x?secret_key=b")
    with pytest.raises(UsageError, match=r"^\$GAUNTLET_RESULTS_URI: holds a credential"):
        p.results_store()
    monkeypatch.setenv("GAUNTLET_RESULTS_URI", "s3://bucket/x")
    assert p.results_store() == "s3://bucket/x"


# ------------------------------------------------------------------ the table stays whole

def _specs() -> list[EngineSpec]:
    full = EngineArgs(tp_size=2, ep_size=2, dp_size=2, context_length=100, max_running_requests=3, mem_fraction=0.5,
                      moe_runner_backend="m", attention_backend="a", kv_cache_dtype="fp8", enable_symm_mem=True,
                      hicache=True, disable_custom_all_reduce=True, flashinfer_autotune=False, trust_remote_code=True,
                      dtype="bfloat16", speculative=Speculative(method="eagle", num_speculative_tokens=2,
                                                                draft_model="d", prompt_lookup_max=3))
    other = full.model_copy(update={"prefix_cache": False, "hicache": False,
                                    "speculative": Speculative(method="dspark", num_speculative_tokens=2)})
    cached = full.model_copy(update={"prefix_cache": True})
    return [EngineSpec(role="baseline", image="x", args=a, reasoning_parser="r", tool_call_parser="t", dist_timeout_s=60)
            for a in (full, other, cached)]


def _emitted(engine: str) -> set[str]:
    flags: set[str] = set()
    for spec in _specs():
        if engine == "llamacpp":
            args = EngineArgs(context_length=100, max_running_requests=2, dtype="bfloat16",
                              prefix_cache=spec.args.prefix_cache)
            spec = spec.model_copy(update={"args": args, "tool_call_parser": None, "dist_timeout_s": None})
            placements = [Placement()]
        else:
            placements = [Placement(), Placement(nnodes=2, node_rank=1, dist_addr="h:1")]
        for pl in placements:
            argv = engine_command(engine, spec, model_path="/m", served_name="n", placement=pl)
            flags |= {a[2:] for a in argv if a.startswith("--")}
    return flags


@pytest.mark.parametrize("engine", ["sglang", "vllm", "llamacpp"])
def test_every_flag_the_adapter_emits_is_in_the_table(engine):
    missing = _emitted(engine) - set(TYPED_FLAGS[engine])
    assert not missing, f"steps/engines/commands.py emits {sorted(missing)} for {engine}: add them to TYPED_FLAGS"


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_every_alias_in_the_engines_own_parser_is_in_the_table(engine):
    from gauntlet.steps.engines import engine as engine_of
    try:
        parser = engine_of(engine).checker()._parser
    except ImportError as exc:
        pytest.skip(f"{engine} not installed: {exc}")
    table = set(TYPED_FLAGS[engine])
    dests = {a.dest for a in parser._actions if any(o[2:] in table for o in a.option_strings if o.startswith("--"))}
    aliases = {o[2:] for a in parser._actions if a.dest in dests for o in a.option_strings if o.startswith("--")}
    assert not aliases - table, f"{engine}'s parser has aliases {sorted(aliases - table)} of typed flags"
    # and no real flag outside the table is refused as an abbreviation of one in it
    others = {o[2:] for a in parser._actions for o in a.option_strings if o.startswith("--")} - table
    wrongly = {f for f in others if extra_duplicate(engine, f)}
    assert not wrongly, f"real {engine} flags refused as abbreviations: {sorted(wrongly)}"
