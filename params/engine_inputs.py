"""What ``engines.*.env`` and ``engines.*.args.extra`` may say, judged offline (no engine imported).

**env names refused** (:data:`REFUSED_ENV`): a variable that changes which code the engine process
runs, before any flag is read and beyond anything Gate 0 can check, or one gauntlet sets itself:

- the dynamic loader reads every ``LD_*`` (``LD_PRELOAD``/``LD_AUDIT`` load a library into the engine,
  ``LD_LIBRARY_PATH`` picks which libraries it links); glibc's ``GCONV_PATH`` loads iconv modules,
  ``GLIBC_TUNABLES`` changes the allocator and the loader;
- Python's ``PYTHONPATH``, ``PYTHONHOME``, ``PYTHONUSERBASE``, ``PYTHONPLATLIBDIR``,
  ``PYTHONPYCACHEPREFIX`` change what ``import`` finds, ``PYTHONSTARTUP``/``PYTHONINSPECT`` run code or a
  prompt, ``PYTHONBREAKPOINT`` imports a callable, ``PYTHONEXECUTABLE`` changes ``sys.executable``;
- the launch script's shell reads ``BASH_ENV``/``ENV`` (a file it sources), ``SHELLOPTS``/``BASHOPTS``,
  ``PS4``, ``IFS``; ``PATH`` picks which ``python3``/``vllm``/``llama-server`` it runs;
- llama.cpp's server reads ``LLAMA_ARG_<FLAG>`` as its flags, past the argv Gate 0 checks;
- ``POD_NAME``, ``NODE_NAME``, ``HOST_IP`` (the launch script picks the rank and the NIC by them) and
  ``GAUNTLET_*`` (the local engine's run label, which teardown goes by) are gauntlet's.

**extra flags**: a name is ``[a-z0-9][a-z0-9-]*`` (the ``--`` is added); a flag the engine adapter
already sets from a typed field (:data:`TYPED_FLAGS`: the profile's ``args.*``, parsers, port, model,
placement), or any of the engine's own aliases of it, is refused with the field to set instead, and so
is an abbreviation of one (vLLM's and SGLang's parsers accept unambiguous prefixes). Everything else
is left to the engine's own parser at Gate 0 (``gauntlet step engine-check``).
"""

from __future__ import annotations

import re

from gauntlet.params.secrets import credential_name, credential_value

__all__ = ["REFUSED_ENV", "TYPED_FLAGS", "env_problem", "extra_problem", "extra_duplicate"]

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
FLAG_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")

_LOADER = "changes what the dynamic loader loads into the engine"
_PYTHON = "changes what the engine's Python interpreter imports or runs"
_SHELL = "changes what the launch script's shell runs"
REFUSED_ENV: dict[str, str] = {
    "LD_*": _LOADER, "GCONV_PATH": _LOADER, "GLIBC_TUNABLES": _LOADER,
    **{n: _PYTHON for n in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "PYTHONPLATLIBDIR",
                            "PYTHONPYCACHEPREFIX", "PYTHONINSPECT", "PYTHONBREAKPOINT", "PYTHONEXECUTABLE")},
    **{n: _SHELL for n in ("BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4", "IFS", "PATH")},
    "LLAMA_ARG_*": "llama.cpp's server reads it as a flag, past the argv Gate 0 checks; use args.extra",
    **{n: "gauntlet sets it (the launch script picks the rank and the NIC by it)"
       for n in ("POD_NAME", "NODE_NAME", "HOST_IP")},
    "GAUNTLET_*": "gauntlet sets it (the local engine's run label, which teardown goes by)",
}

_PLACEMENT = "hardware.nodes (placement)"
_BACKEND = "the deploy back end"
_PARSERS = {"reasoning-parser": "reasoning_parser", "tool-call-parser": "tool_call_parser"}
# flag -> the profile field the adapter (steps/engines/commands.py engine_command) sets it from, with the engine's
# own aliases of the same option (the same argparse dest: tests/test_engine_inputs.py derives them from
# vLLM's and SGLang's parsers and runs engine_command over every typed field to keep this table whole)
TYPED_FLAGS: dict[str, dict[str, str]] = {
    "sglang": {
        "model-path": "model.mount_path", "model": "model.mount_path", "served-model-name": "model.served_name",
        "host": _BACKEND, "port": "port", **_PARSERS,
        "nnodes": _PLACEMENT, "node-rank": _PLACEMENT, "dist-init-addr": _PLACEMENT, "nccl-init-addr": _PLACEMENT,
        "tp-size": "args.tp_size", "tensor-parallel-size": "args.tp_size",
        "ep-size": "args.ep_size", "expert-parallel-size": "args.ep_size", "ep": "args.ep_size",
        "dp-size": "args.dp_size", "data-parallel-size": "args.dp_size",
        "context-length": "args.context_length", "max-running-requests": "args.max_running_requests",
        "mem-fraction-static": "args.mem_fraction", "moe-runner-backend": "args.moe_runner_backend",
        "decode-attention-backend": "args.attention_backend", "kv-cache-dtype": "args.kv_cache_dtype",
        "enable-symm-mem": "args.enable_symm_mem", "disable-radix-cache": "args.prefix_cache",
        "enable-hierarchical-cache": "args.hicache", "enable-hicache": "args.hicache",
        "speculative-algorithm": "args.speculative", "speculative-dspark-block-size": "args.speculative",
        "speculative-num-draft-tokens": "args.speculative", "speculative-draft-model-path": "args.speculative",
        "speculative-draft-model": "args.speculative",
        "disable-custom-all-reduce": "args.disable_custom_all_reduce", "trust-remote-code": "args.trust_remote_code",
        "dtype": "args.dtype", "expert-distribution-recorder-mode": "args.expert_distribution_recorder_mode",
        "dist-timeout": "dist_timeout_s", "enable-metrics": "gauntlet's sglang adapter",
    },
    "vllm": {
        "model": "model.mount_path", "served-model-name": "model.served_name", "host": _BACKEND, "port": "port",
        **_PARSERS,
        "nnodes": _PLACEMENT, "node-rank": _PLACEMENT, "master-addr": _PLACEMENT, "master-port": _PLACEMENT,
        "headless": _PLACEMENT,
        "tensor-parallel-size": "args.tp_size", "enable-expert-parallel": "args.ep_size",
        "no-enable-expert-parallel": "args.ep_size", "data-parallel-size": "args.dp_size",
        "max-model-len": "args.context_length", "max-num-seqs": "args.max_running_requests",
        "gpu-memory-utilization": "args.mem_fraction", "device-memory-utilization": "args.mem_fraction",
        "moe-backend": "args.moe_runner_backend", "attention-backend": "args.attention_backend",
        "kv-cache-dtype": "args.kv_cache_dtype",
        "enable-prefix-caching": "args.prefix_cache", "no-enable-prefix-caching": "args.prefix_cache",
        "speculative-config": "args.speculative",
        "disable-custom-all-reduce": "args.disable_custom_all_reduce",
        "no-disable-custom-all-reduce": "args.disable_custom_all_reduce",
        "enable-flashinfer-autotune": "args.flashinfer_autotune",
        "no-enable-flashinfer-autotune": "args.flashinfer_autotune",
        "trust-remote-code": "args.trust_remote_code", "no-trust-remote-code": "args.trust_remote_code",
        "dtype": "args.dtype", "distributed-timeout-seconds": "dist_timeout_s",
    },
    # llama.cpp 11434's common/arg.cpp (long names; it takes no abbreviations); --kv-unified and --cache-ram
    # are fixed by the adapter, --hf-repo/--model-url would load another model than model.mount_path's
    "llamacpp": {
        "model": "model.mount_path", "hf-repo": "model.mount_path", "model-url": "model.mount_path",
        "alias": "model.served_name", "host": _BACKEND, "port": "port", "reasoning-format": "reasoning_parser",
        "ctx-size": "args.context_length", "kv-unified": "gauntlet's llama.cpp adapter",
        "no-kv-unified": "gauntlet's llama.cpp adapter", "cache-ram": "gauntlet's llama.cpp adapter",
        "parallel": "args.max_running_requests", "cache-type-k": "args.kv_cache_dtype",
        "cache-type-v": "args.kv_cache_dtype", "cache-prompt": "args.prefix_cache",
        "no-cache-prompt": "args.prefix_cache",
    },
}
_ABBREVIATES = ("sglang", "vllm")      # argparse with allow_abbrev (the pods' parsers)


def _refused(name: str) -> str | None:
    for pattern, why in REFUSED_ENV.items():
        if name == pattern or (pattern.endswith("*") and name.startswith(pattern[:-1])):
            return why
    return None


def env_problem(name: str, value: str | None) -> str | None:
    """Why ``env`` may not carry ``name`` (with ``value`` in clear; None: a Secret reference), or None."""
    if not ENV_NAME.fullmatch(name):
        return "not an environment variable name ([A-Za-z_][A-Za-z0-9_]*, at most 128 characters)"
    why = _refused(name)
    if why:
        return f"refused: {why}"
    if value and (credential_name(name) or credential_value(value)):
        return (f"a credential in clear (it would be copied into the profile ConfigMap, the verdicts and the "
                f"report); reference a Secret instead: env: {{{name}: {{secret: SECRET_NAME, key: KEY}}}}")
    return None


def extra_problem(flag: str, value: object) -> str | None:
    """Why ``args.extra`` may not carry ``flag`` whatever the engine, or None."""
    if not FLAG_NAME.fullmatch(flag):
        return "not a flag name ([a-z0-9][a-z0-9-]*, at most 64 characters, without the leading --)"
    if not isinstance(value, bool) and (credential_name(flag) or credential_value(str(value))):
        return ("a credential in clear on the command line; give the engine its token from a Secret: "
                "env: {HF_TOKEN: {secret: SECRET_NAME, key: KEY}}")
    return None


def extra_duplicate(engine: str, flag: str) -> str | None:
    """Why ``engines.<engine>.args.extra`` may not carry ``flag``: a flag the adapter sets from a field."""
    typed = TYPED_FLAGS.get(engine, {})
    if flag in typed:
        return f"--{flag} is set from {typed[flag]}; set that instead"
    if engine in _ABBREVIATES:
        longer = sorted(f for f in typed if f.startswith(flag))
        if longer:
            return (f"--{flag} abbreviates --{longer[0]} (the engine's parser accepts prefixes), which is set "
                    f"from {typed[longer[0]]}; set that instead")
    return None
