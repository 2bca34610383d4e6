"""SGLang as gauntlet drives it: ``sglang.launch_server``'s command line, Gate 0's adapter onto ServerArgs' own
parser, its reply conventions, its Prometheus names, its expert distribution recorder and its own bench client
(``sglang.bench_serving``, :mod:`gauntlet.steps.engines.sglang_bench`) as a diagnostic (SGLang 0.5.23)."""

from __future__ import annotations

import argparse
from typing import Any

from gauntlet.params.models import EngineArgs, EngineSpec
from gauntlet.steps.engines.adapter import Engine
from gauntlet.steps.engines import parser_facts as pf
from gauntlet.steps.engines.argv import Placement, flag
from gauntlet.steps.engines.replies import ReplyRules
from gauntlet.steps.engines.sglang_bench import CLIENT, run_sglang_client
from gauntlet.steps.engines.sglang_models import registered_architectures

__all__ = ["ENGINE", "REPLIES", "SglangAdapter", "program", "serve", "flags"]


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
    """The args' flags, then the parsers' (args.extra is the caller's)."""
    return [*_args_flags(spec.args), *flag("reasoning-parser", spec.reasoning_parser),
            *flag("tool-call-parser", spec.tool_call_parser)]


def program(python: str) -> list[str]:
    return [python, "-m", "sglang.launch_server"]


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

    def tool_parsers(self) -> list[str]:
        return self._tools


REPLIES = ReplyRules(
    "sglang", "0.5.23", named_tool_finish="tool_calls", auto_tool_finish="tool_calls",
    reasoning_field="reasoning_content",
    sources={
        "tool_finish": "sglang/srt/entrypoints/openai/serving_chat.py _process_tool_calls (a named "
                       "ToolChoice counts as required: a parsed call turns finish 'stop' into 'tool_calls')",
        "reasoning_field": "sglang/srt/entrypoints/openai/protocol.py ChatMessage/DeltaMessage."
                           "reasoning_content (separate_reasoning defaults to true)",
    })

ENGINE = Engine(
    name="sglang", title="SGLang", program=program, serve=serve, flags=flags, context_flags=("--context-length",),
    checker=SglangAdapter, replies=REPLIES,
    metrics={"running": ("sglang:num_running_reqs",), "waiting": ("sglang:num_queue_reqs",),
             "kv_usage": ("sglang:token_usage",)},
    # /start|stop|dump_expert_distribution_record (steps/cluster/expert_load.py reads it per case)
    expert_recorder=True,
    diagnostic_client=CLIENT, diagnostic_bench=run_sglang_client)
