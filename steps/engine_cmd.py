"""Engine-neutral :class:`EngineArgs` -> each engine's own command line and env.

Pure functions: Gate 2 (both back ends), Gate 6 (variants) and the engine-check
(which feeds the flags to the engine's own argument parser) all use these.
Multi-node placement differs only in rank/address/NIC, never in the rest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from gauntlet.contract import UsageError
from gauntlet.params.models import EngineArgs, EngineSpec
from gauntlet.steps import _llamacpp

__all__ = ["Placement", "engine_flags", "engine_program", "engine_command", "engine_env", "apply_change",
           "args_hash"]


@dataclass(frozen=True)
class Placement:
    """Where one rank of a multi-node engine runs; the only per-node difference."""

    nnodes: int = 1
    node_rank: int = 0
    dist_addr: str | None = None     # leader host:port for rendezvous
    host_ip: str | None = None
    extra_env: dict[str, str] = field(default_factory=dict)


def _flag(name: str, value: Any) -> list[str]:
    if value is True:
        return [f"--{name}"]
    if value is False or value is None:
        return []
    return [f"--{name}", str(value)]


def _sglang_flags(a: EngineArgs) -> list[str]:
    f: list[str] = []
    f += _flag("tp-size", a.tp_size)
    f += _flag("ep-size", a.ep_size)
    f += _flag("dp-size", a.dp_size)
    f += _flag("context-length", a.context_length)
    f += _flag("max-running-requests", a.max_running_requests)
    f += _flag("mem-fraction-static", a.mem_fraction)
    f += _flag("moe-runner-backend", a.moe_runner_backend)
    f += _flag("decode-attention-backend", a.attention_backend)
    if a.kv_cache_dtype not in ("auto", "bf16", "bfloat16"):
        f += _flag("kv-cache-dtype", a.kv_cache_dtype)
    f += _flag("enable-symm-mem", a.enable_symm_mem)
    # HiCache is the radix cache's host-memory tier: SGLang refuses --enable-hierarchical-cache with
    # --disable-radix-cache ("mutually exclusive", arg_groups/kv_cache_hook.py), so hicache keeps the radix on
    if not a.prefix_cache and not a.hicache:
        f += ["--disable-radix-cache"]
    f += _flag("enable-hierarchical-cache", a.hicache)
    if a.speculative is not None:
        algo = a.speculative.method.upper()
        f += _flag("speculative-algorithm", algo)
        # num_speculative_tokens means tokens proposed per step (vLLM's meaning). SGLang 0.5.23's DSPARK
        # takes that as --speculative-dspark-block-size (gamma) and derives --speculative-num-draft-tokens
        # = gamma + 1 (the verify window); passing 7 as num-draft-tokens would draft 6.
        f += _flag("speculative-dspark-block-size" if algo == "DSPARK" else "speculative-num-draft-tokens",
                   a.speculative.num_speculative_tokens)
        f += _flag("speculative-draft-model-path", a.speculative.draft_model)
    f += _flag("disable-custom-all-reduce", a.disable_custom_all_reduce)
    f += _flag("trust-remote-code", a.trust_remote_code)
    f += _flag("dtype", a.dtype)
    return f


def _vllm_flags(a: EngineArgs) -> list[str]:
    f: list[str] = []
    f += _flag("tensor-parallel-size", a.tp_size)
    if a.ep_size and a.ep_size > 1:
        f += ["--enable-expert-parallel"]
    f += _flag("data-parallel-size", a.dp_size)
    f += _flag("max-model-len", a.context_length)
    f += _flag("max-num-seqs", a.max_running_requests)
    f += _flag("gpu-memory-utilization", a.mem_fraction)
    # vLLM 0.32: the MoE kernel is the --moe-backend flag (KernelConfig.moe_backend, e.g. marlin); it reads
    # no VLLM_MXFP4_USE_MARLIN variable any more (the variable was silently ignored)
    f += _flag("moe-backend", a.moe_runner_backend)
    f += _flag("attention-backend", a.attention_backend.upper() if a.attention_backend else None)
    f += _flag("kv-cache-dtype", a.kv_cache_dtype if a.kv_cache_dtype != "bf16" else "auto")
    f += ["--enable-prefix-caching" if a.prefix_cache else "--no-enable-prefix-caching"]
    if a.speculative is not None:
        spec = {"method": a.speculative.method, "num_speculative_tokens": a.speculative.num_speculative_tokens}
        if a.speculative.draft_model:
            spec["model"] = a.speculative.draft_model
        if a.speculative.prompt_lookup_max is not None:
            spec["prompt_lookup_max"] = a.speculative.prompt_lookup_max
        f += ["--speculative-config", json.dumps(spec, sort_keys=True, separators=(",", ":"))]
    f += _flag("disable-custom-all-reduce", a.disable_custom_all_reduce)
    if not a.flashinfer_autotune:
        f += ["--no-enable-flashinfer-autotune"]   # KernelConfig.enable_flashinfer_autotune (vLLM 0.32)
    f += _flag("trust-remote-code", a.trust_remote_code)
    f += _flag("dtype", a.dtype)
    return f


# llama.cpp knows none of these: a profile that sets them asks for something this engine cannot do
# (the values that mean "not used" are accepted)
_LLAMACPP_NO: dict[str, tuple[Any, ...]] = {
    "tp_size": (1,), "ep_size": (None, 1), "dp_size": (None, 1), "moe_runner_backend": (None,),
    "attention_backend": (None,), "enable_symm_mem": (False,), "hicache": (False,),
    "disable_custom_all_reduce": (False,), "speculative": (None,)}
# the KV cache's element type when the profile says "auto" (vLLM's meaning: the model's dtype)
_LLAMACPP_KV = {"bf16": "bf16", "f16": "f16", "f32": "f32"}


def _llamacpp_flags(a: EngineArgs) -> list[str]:
    """llama.cpp 11434's llama-server flags (its common/arg.cpp), for the same experiment as vLLM's:
    --ctx-size is the longest request (--kv-unified: every slot may use the whole context, as vLLM's
    max-model-len is per request), --parallel the concurrent requests (vLLM's max-num-seqs), the KV cache in
    the model's precision for "auto", prompt reuse only with prefix_cache (--no-cache-prompt stops a slot
    reusing its previous prompt's KV), and never the host-memory prompt cache (--cache-ram 0). The weights' precision is the GGUF file's (``args.dtype``, see
    :func:`engine_command`), not a flag."""
    bad = [f"{k}={getattr(a, k)!r}" for k, off in _LLAMACPP_NO.items()
           if not any(getattr(a, k) is v or (type(v) is int and type(getattr(a, k)) is int and getattr(a, k) == v)
                      for v in off)]
    if bad:
        raise UsageError(f"engines.llamacpp.args: llama.cpp's server has no mapping here for {', '.join(bad)}")
    f: list[str] = ["--ctx-size", str(a.context_length), "--kv-unified"]
    f += _flag("parallel", a.max_running_requests)
    kv = a.kv_cache_dtype.lower()
    kv = _LLAMACPP_KV[_llamacpp.gguf_outtype(a.dtype)] if kv == "auto" else {"bfloat16": "bf16", "fp16": "f16",
                                                                               "float16": "f16"}.get(kv, kv)
    f += ["--cache-type-k", kv, "--cache-type-v", kv]
    # the prefix cache is a slot keeping its KV and a request reusing the common prefix (--cache-prompt);
    # --cache-ram is another thing, a host-memory tier (HiCache's kind), off either way: with it on, every
    # request saved and restored the unified KV and took ~37 s instead of ~1 s here
    f += ["--cache-prompt" if a.prefix_cache else "--no-cache-prompt", "--cache-ram", "0"]
    return f


def engine_flags(engine: str, spec: EngineSpec) -> list[str]:
    """The engine's flags for the profile's args and parsers (no model/port/placement)."""
    a = spec.args
    if engine == "llamacpp":
        if spec.tool_call_parser is not None:
            raise UsageError("engines.llamacpp.tool_call_parser: llama.cpp has no tool-call parser flag (it "
                             "reads the format from the chat template); leave it null")
        f = _llamacpp_flags(a)
        f += _flag("reasoning-format", spec.reasoning_parser)
    else:
        f = _sglang_flags(a) if engine == "sglang" else _vllm_flags(a)
        f += _flag("reasoning-parser", spec.reasoning_parser)
        f += _flag("tool-call-parser", spec.tool_call_parser)
    for k, v in sorted(a.extra.items()):
        f += _flag(k, v)
    return f


def engine_program(engine: str, python: str = "python3") -> list[str]:
    """The program part of the command (what engine-check strips to feed the rest to the parser)."""
    if engine == "sglang":
        return [python, "-m", "sglang.launch_server"]
    if engine == "vllm":
        return [python, "-m", "vllm.entrypoints.openai.api_server"]
    if engine == "llamacpp":
        return [_llamacpp.program_for(python)]
    raise ValueError(f"unknown engine {engine!r}")


def engine_command(engine: str, spec: EngineSpec, *, model_path: str, served_name: str, python: str = "python3",
                   host: str = "0.0.0.0", placement: Placement = Placement()) -> list[str]:
    """The full argv that starts one rank of the engine."""
    cmd = engine_program(engine, python)
    if engine == "sglang":
        cmd += ["--model-path", model_path,
                "--served-model-name", served_name, "--host", host, "--port", str(spec.port)]
        if placement.nnodes > 1:
            cmd += ["--nnodes", str(placement.nnodes), "--node-rank", str(placement.node_rank),
                    "--dist-init-addr", str(placement.dist_addr)]
    elif engine == "vllm":
        cmd += ["--model", model_path,
                "--served-model-name", served_name, "--host", host, "--port", str(spec.port)]
        if placement.nnodes > 1:
            addr, _, port = str(placement.dist_addr).partition(":")
            cmd += ["--nnodes", str(placement.nnodes), "--node-rank", str(placement.node_rank),
                    "--master-addr", addr]
            if port:
                cmd += ["--master-port", port]
            if placement.node_rank > 0:
                cmd += ["--headless"]
    elif engine == "llamacpp":
        if placement.nnodes > 1:
            raise UsageError("llama.cpp's server runs on one node; engines.llamacpp cannot be placed on "
                             f"{placement.nnodes} nodes")
        cmd += ["--model", str(_llamacpp.gguf_path(model_path, spec.args.dtype)), "--alias", served_name,
                "--host", host, "--port", str(spec.port)]
    return cmd + engine_flags(engine, spec)


def engine_env(engine: str, spec: EngineSpec, placement: Placement = Placement()) -> dict[str, str]:
    """The profile's env plus what the args imply; identical on every rank but the NIC."""
    env = dict(spec.env)
    env.update(placement.extra_env)
    return dict(sorted(env.items()))


def apply_change(spec: EngineSpec, change: dict[str, Any]) -> EngineSpec:
    """The spec with one EngineArgs variable changed (Gate 6); validated by the model."""
    (path, value), = change.items()
    args = spec.args.model_dump()
    keys = path.split(".")
    node = args
    for k in keys[:-1]:
        node = node.setdefault(k, {}) if isinstance(node.get(k), dict) or node.get(k) is None else node[k]
    node[keys[-1]] = value
    new_args = EngineArgs.model_validate(args)
    return spec.model_copy(update={"args": new_args})


def args_hash(engine: str, spec: EngineSpec) -> str:
    """A short stable hash of the flags and env: what 'same options' means for A/B and history."""
    import hashlib
    blob = json.dumps({"engine": engine, "flags": engine_flags(engine, spec), "env": engine_env(engine, spec)},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
