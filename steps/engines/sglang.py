"""SGLang as gauntlet drives it: ``sglang.launch_server``'s command line, Gate 0's adapter onto ServerArgs' own
parser, its reply conventions, its Prometheus names, its expert distribution recorder and its own bench client
(``sglang.bench_serving``, :mod:`gauntlet.steps.engines.sglang_bench`) as a diagnostic (SGLang 0.5.23)."""

from __future__ import annotations

import argparse
import re
from typing import Any

from gauntlet.params.models import EngineArgs, EngineSpec
from gauntlet.steps.engines.adapter import CheckpointDraft, Engine
from gauntlet.steps.engines import parser_facts as pf
from gauntlet.steps.engines.argv import Placement, flag
from gauntlet.steps.engines.replies import ReplyRules
from gauntlet.steps.engines.sglang_bench import CLIENT, run_sglang_client
from gauntlet.steps.engines.sglang_models import registered_architectures

__all__ = ["ENGINE", "REPLIES", "KV_POOL_CAPPED", "SglangAdapter", "program", "serve", "flags", "DSPARK_DRAFT"]


def _args_flags(a: EngineArgs) -> list[str]:
    f: list[str] = []
    f += flag("tp-size", a.tp_size)
    f += flag("ep-size", a.ep_size)
    f += flag("dp-size", a.dp_size)
    f += flag("context-length", a.context_length)
    f += flag("max-running-requests", a.max_running_requests)
    f += flag("mem-fraction-static", a.mem_fraction)
    f += flag("moe-runner-backend", a.moe_runner_backend)
    f += flag("decode-attention-backend", a.attention_backend)
    if a.kv_cache_dtype not in ("auto", "bf16", "bfloat16"):
        f += flag("kv-cache-dtype", a.kv_cache_dtype)
    f += flag("enable-symm-mem", a.enable_symm_mem)
    # HiCache is the radix cache's host-memory tier: SGLang refuses --enable-hierarchical-cache with
    # --disable-radix-cache ("mutually exclusive", arg_groups/kv_cache_hook.py), so hicache keeps the radix on
    if not a.prefix_cache and not a.hicache:
        f += ["--disable-radix-cache"]
    f += flag("enable-hierarchical-cache", a.hicache)
    if a.speculative is not None:
        algo = a.speculative.method.upper()
        f += flag("speculative-algorithm", algo)
        # num_speculative_tokens means tokens proposed per step (vLLM's meaning). SGLang 0.5.23's DSPARK
        # takes that as --speculative-dspark-block-size (gamma) and derives --speculative-num-draft-tokens
        # = gamma + 1 (the verify window); passing 7 as num-draft-tokens would draft 6.
        f += flag("speculative-dspark-block-size" if algo == "DSPARK" else "speculative-num-draft-tokens",
                   a.speculative.num_speculative_tokens)
        f += flag("speculative-draft-model-path", a.speculative.draft_model)
    f += flag("disable-custom-all-reduce", a.disable_custom_all_reduce)
    f += flag("trust-remote-code", a.trust_remote_code)
    f += flag("dtype", a.dtype)
    # what Gate 4's per-case expert load reads (/start|stop|dump_expert_distribution_record; server_args'
    # ExecArgs.expert_distribution_recorder_mode in SGLang 0.5.23)
    f += flag("expert-distribution-recorder-mode", a.expert_distribution_recorder_mode)
    return f


def flags(spec: EngineSpec) -> list[str]:
    """The args' flags, then the parsers' (args.extra is the caller's), --enable-metrics, then the collective
    timeout."""
    return [*_args_flags(spec.args), *flag("reasoning-parser", spec.reasoning_parser),
            *flag("tool-call-parser", spec.tool_call_parser),
            # its Prometheus /metrics (ObservabilityArgs.enable_metrics, off by default): Gate 4's sampler reads its
            # gauges, Gate 6 a speculative variant's acceptance from its counters (ENGINE.metrics)
            "--enable-metrics",
            # ParallelArgs.dist_timeout (sglang/srt/arg_groups/fields/parallel.py) -> the timeout
            # sglang.srt.distributed.bootstrap._init_parallel_groups gives init_distributed_environment
            *flag("dist-timeout", spec.dist_timeout_s)]


def program(python: str) -> list[str]:
    return [python, "-m", "sglang.launch_server"]


def env(spec: EngineSpec) -> dict[str, str]:
    """The NCCL variables SGLang 0.5.23 sets in its own environment at start-up, before any NCCL group exists
    (sglang.srt.entrypoints.engine ``_set_envs_and_config``, on every rank): --enable-symm-mem forces
    NCCL_CUMEM_ENABLE=1 and NCCL_NVLS_ENABLE=1 (--enable-nccl-nvls the latter) over any value given; otherwise
    a variable the profile sets is kept and one it leaves unset is set to 0. The pods and Gate 1's NCCL probe
    get these values, so the probe runs NCCL as the engine will (NVLS off unless asked for)."""
    given, a = spec.clear_env, spec.args
    nvls = a.enable_symm_mem or bool(a.extra.get("enable-nccl-nvls"))
    return {"NCCL_CUMEM_ENABLE": "1" if a.enable_symm_mem else given.get("NCCL_CUMEM_ENABLE", "0"),
            "NCCL_NVLS_ENABLE": "1" if nvls else given.get("NCCL_NVLS_ENABLE", "0")}


def serve(spec: EngineSpec, *, model_path: str, served_name: str, host: str, placement: Placement) -> list[str]:
    """What follows the program: the model, its name, the address and, on several nodes, the placement."""
    cmd = ["--model-path", model_path, "--served-model-name", served_name, "--host", host, "--port", str(spec.port)]
    if placement.nnodes > 1:
        cmd += ["--nnodes", str(placement.nnodes), "--node-rank", str(placement.node_rank),
                "--dist-init-addr", str(placement.dist_addr)]
    return cmd


class SglangAdapter:
    """SGLang: ServerArgs' own parser, the parser registries, SpeculativeAlgorithm, the model registry's source.

    The reasoning and tool-call registries are imported *before* the parser is built: ServerArgs
    takes the ``--reasoning-parser``/``--tool-call-parser`` choices from those registries when they
    are loaded (otherwise from its dependency-free copies of their names). The model registry
    imports every model module with its CUDA kernels, so outside the engine image it is read from
    the modules' source (:mod:`gauntlet.steps.engines.sglang_models`).
    """

    engine = "sglang"
    rank_flags = frozenset({"--node-rank", "--dist-init-addr", "--host"})

    def __init__(self) -> None:
        import sglang
        from sglang.srt.function_call.function_call_parser import FunctionCallParser
        from sglang.srt.parser.reasoning_parser import ReasoningParser
        from sglang.srt.server_args import ServerArgs
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
        self.version = getattr(sglang, "__version__", None)
        self._reasoning = sorted(ReasoningParser.DetectorMap)
        self._tools = sorted(FunctionCallParser.ToolCallParserEnum)
        self._spec = SpeculativeAlgorithm
        self._server_args = ServerArgs
        # as sglang.srt.server_args.prepare_server_args builds it, minus prefix matching
        self._parser = argparse.ArgumentParser(prog="sglang serve", allow_abbrev=False)
        ServerArgs.add_cli_args(self._parser)
        self._ns_by_field = getattr(ServerArgs, "_NS_BY_FIELD", {})
        # SGLang's cross-flag rules live in its resolution hooks; the model- and hardware-independent
        # one is run on each record. Its module imports sglang.srt.configs -> torchvision, which the
        # test environment leaves out (PyPI's torchvision breaks vLLM CPU): there it is reported, not run.
        self.rules: list[str] = []
        self.rules_missing: str | None = None
        try:
            from sglang.srt.arg_groups.kv_cache_hook import handle_cache_compatibility
            self._rules = [handle_cache_compatibility]
            self.rules = [f"{f.__module__}.{f.__name__}" for f in self._rules]
        except ImportError as exc:
            self._rules = []
            self.rules_missing = f"{type(exc).__name__}: {exc}"

    def architectures(self) -> list[str]:
        return sorted(registered_architectures())

    def default_of(self, flag: str) -> Any:
        a = pf.action(self._parser, flag)
        return pf.plain(a.default) if a else None

    def group_of(self, flag: str) -> str:
        """The engine's own option group of a flag (SGLang: the ServerArgs namespace holding its field)."""
        a = pf.action(self._parser, flag)
        dest = a.dest if a else flag
        ns = self._ns_by_field.get(dest)   # field -> its namespace path, e.g. "spec", "memory"
        return ns if isinstance(ns, str) else getattr(ns, "_NS_PATH", None) or dest

    def parse(self, argv: list[str]) -> tuple[str | None, dict[str, Any] | None]:
        ns, err = pf.parse(self._parser, argv)
        if err or ns is None:   # pf.parse gives a namespace or an error
            return err, None
        algo = getattr(ns, "speculative_algorithm", None)
        if algo is not None:   # a free string in the parser; the scheduler resolves it like this
            try:
                self._spec.from_string(algo)
            except ValueError as exc:
                return f"--speculative-algorithm {algo}: {exc}", None
        try:
            record = self._server_args.from_cli_args(ns)   # the record sglang.launch_server builds from it
            for rule in self._rules:
                rule(record)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}", None
        return None, pf.options(self._parser, ns)

    def reasoning_parsers(self) -> list[str]:
        return self._reasoning

    def attention(self, argv: list[str], *, linear: bool = False) -> dict[str, str] | None:
        """The attention backend of each phase as SGLang resolves this command: its own
        ``attention_backends_of`` (sglang.srt.arg_groups.model_override_base: a phase's own flag, else
        --attention-backend) on the ServerArgs record. ``auto``: neither is set, so SGLang picks at start-up
        (its ``_attention_backend_default`` post-process, get_default_attn_backend: fa3 for MLA on Hopper).
        ``linear``: the model has linear-attention (KDA/GDN) layers, whose kernels are other flags: a phase's
        --linear-attn-{prefill,decode}-backend, else --linear-attn-backend (triton by default), as
        sglang.srt.arg_groups.kv_cache_hook resolves them (its handle_linear_attn_backend switches decode to
        flashinfer on SM100 only). None when the command does not parse (cli-flags says why)."""
        from sglang.srt.arg_groups.model_override_base import attention_backends_of
        ns, err = pf.parse(self._parser, argv)
        if err or ns is None:
            return None
        try:
            record = self._server_args.from_cli_args(ns)
            prefill, decode = attention_backends_of(record)
        except Exception:
            return None
        out = {"prefill": str(prefill or "auto"), "decode": str(decode or "auto")}
        if linear:
            base = record.linear_attn_backend
            out |= {"linear prefill": str(record.linear_attn_prefill_backend or base or "auto"),
                    "linear decode": str(record.linear_attn_decode_backend or base or "auto")}
        return out

    def env_problems(self, names: list[str]) -> dict[str, str]:
        """Each SGLANG_/SGL_ variable of the engine's env that SGLang does not read as named, and why: one its
        registry deprecates (sglang.srt.environ ``_DEPRECATED_ENVS``), a legacy ``SGL_`` name (its
        ``_handle_deprecated_envs`` rewrites it to ``SGLANG_`` with a warning), or one neither in its registry
        (``sglang.srt.environ.Envs``) nor named anywhere in its source. Other variables are not SGLang's."""
        from sglang.srt import environ
        known = {f.name for f in vars(environ.Envs).values() if isinstance(f, environ.EnvField)}
        deprecated = getattr(environ, "_DEPRECATED_ENVS", {})
        out: dict[str, str] = {}
        unread = []
        for name in names:
            if not name.startswith(("SGLANG_", "SGL_")) or name in known:
                continue
            if name in deprecated:
                d = deprecated[name]
                instead = f"; use {d.replacement}" if d.replacement else ""
                out[name] = f"deprecated in SGLang {self.version}{instead}{f' ({d.note})' if d.note else ''}"
            elif name.startswith("SGL_"):
                new = name.replace("SGL_", "SGLANG_", 1)
                out[name] = (f"a legacy SGL_ name: SGLang {self.version} warns and reads {new}" if new in known else
                             f"a legacy SGL_ name whose {new} SGLang {self.version} does not know either")
            else:
                unread.append(name)
        if unread:
            for name in _unread_in_source(unread):
                out[name] = (f"SGLang {self.version} reads no such variable: not in sglang.srt.environ.Envs "
                             f"({len(known)} names) nor named in its source")
        return out

    def tool_parsers(self) -> list[str]:
        return self._tools


def _unread_in_source(names: list[str]) -> list[str]:
    """Of ``names``, those no .py file of the installed sglang package names (tests aside): some variables are
    read with os.environ/get_bool_env_var outside the registry (SGLANG_DEEPGEMM_ON_H20, say)."""
    from pathlib import Path

    import sglang
    left = {n.encode(): n for n in names}
    for path in Path(sglang.__file__).parent.rglob("*.py"):
        if not left:
            break
        if "test" in path.parts:
            continue
        text = path.read_bytes()
        for raw in [r for r in left if r in text]:
            del left[raw]
    return sorted(left.values())


REPLIES = ReplyRules(
    "sglang", "0.5.23", named_tool_finish="tool_calls", auto_tool_finish="tool_calls",
    reasoning_field="reasoning_content",
    sources={
        "tool_finish": "sglang/srt/entrypoints/openai/serving_chat.py _process_tool_calls (a named "
                       "ToolChoice counts as required: a parsed call turns finish 'stop' into 'tool_calls')",
        "reasoning_field": "sglang/srt/entrypoints/openai/protocol.py ChatMessage/DeltaMessage."
                           "reasoning_content (separate_reasoning defaults to true)",
    })

# sglang/srt/managers/tp_worker.py TpModelWorker.get_worker_info warns, once the pool is sized (the final served
# value), "KV pool holds %d tokens, fewer than --context-length %d. One full-length request cannot fit, so long
# requests will be refused or truncated at serving time. ..." (and serves on): Gate 5 fails a restart that says so
KV_POOL_CAPPED = re.compile(r"KV pool holds (?P<pool>\d+) tokens, fewer than --context-length (?P<context>\d+)")

# DSpark's draft when the args name none: SGLang 0.5.23's _handle_dspark (sglang/srt/arg_groups/speculative_hook.py)
# takes the draft bundled in the checkpoint (a dspark_* key set in its config:
# sglang.srt.speculative.dspark_components.dspark_config.checkpoint_bundles_dspark_draft, on the top-level config),
# else the checkpoint's dspark/ subfolder with its own config.json (_target_checkpoint_dspark_subfolder,
# os.path.isfile), else refuses to start. tests/test_draft_checks.py holds this to those two functions.
DSPARK_DRAFT = CheckpointDraft(
    methods=("DSPARK",),
    config_keys=("dspark_block_size", "dspark_markov_rank", "dspark_noise_token_id", "dspark_target_layer_ids"),
    subfolder_config="dspark/config.json",
    refusal="DSpark dense speculative decoding requires setting --speculative-draft-model-path.")

ENGINE = Engine(
    name="sglang", title="SGLang", program=program, serve=serve, flags=flags, context_flags=("--context-length",),
    checker=SglangAdapter, replies=REPLIES, env=env,
    metrics={"running": ("sglang:num_running_reqs",), "waiting": ("sglang:num_queue_reqs",),
             # SchedulerStats.token_usage: the KV pool's used share (total - available - evictable, the radix
             # cache's evictable tokens free), Gate 4's headroom; realtime_tokens_total: prefill and decode tokens,
             # counted on every step by the stats-logging scheduler (metrics_reporter.report_*_stats), what a hang
             # stops (steps/client/stall.py); both from sglang/srt/observability/metrics_collector.py's
             # SchedulerMetricsCollector, exported only with --enable-metrics
             "kv_usage": ("sglang:token_usage",), "tokens_processed": ("sglang:realtime_tokens_total",),
             # speculative decoding (sglang/srt/observability/metrics_collector.py): per finished request,
             # TokenizerMetricsCollector counts its verify steps (one draft verified per request per step: vLLM's
             # num_drafts) and its output tokens; the scheduler's gauge is the verify window in use (the drafts
             # + the bonus slot). SGLang's own acceptance length is output tokens / verify steps and its
             # proposed drafts verify steps x (window - 1) (tokenizer_manager._calculate_spec_decoding_metrics)
             "spec_drafts": ("sglang:spec_verify_calls_total",),
             "generation_tokens": ("sglang:generation_tokens_total",),
             "spec_verify_window": ("sglang:spec_num_draft_tokens",),
             # per finished request, TokenizerMetricsCollector.observe_one_finished_request: its whole prompt and,
             # of it, the tokens found in the radix cache (device, host or storage): SGLang's prefix hit rate is
             # cached / prompt tokens, as vLLM's is hits / queries (both in tokens)
             "prompt_tokens": ("sglang:prompt_tokens_total",),
             "prefix_queries": ("sglang:prompt_tokens_total",), "prefix_hits": ("sglang:cached_tokens_total",),
             # SGLang's preemption is a retraction: the scheduler takes running requests back to the queue when
             # the KV pool runs out (scheduler.py -> SchedulerMetricsCollector.increment_retracted_reqs)
             "preemptions": ("sglang:num_retracted_requests_total",)},
    # its counters are labelled children created at their first count (prometheus_client multiprocess mode, one
    # file per process): a counter absent from a scrape that has SGLang's other metrics has counted nothing yet
    counters_from_first_count=True,
    # /start|stop|dump_expert_distribution_record (steps/cluster/expert_load.py reads it per case)
    expert_recorder=True,
    checkpoint_draft=DSPARK_DRAFT,
    diagnostic_client=CLIENT, diagnostic_bench=run_sglang_client, kv_pool_capped=KV_POOL_CAPPED)
