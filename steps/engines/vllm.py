"""vLLM as gauntlet drives it: ``vllm serve``'s command line, Gate 0's adapter onto its own parser, its reply
conventions and its Prometheus names (vLLM 0.32)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gauntlet.contract import UsageError
from gauntlet.params.models import EngineArgs, EngineSpec
from gauntlet.steps.engines.adapter import Engine
from gauntlet.steps.engines import parser_facts as pf
from gauntlet.steps.engines.argv import Placement, flag
from gauntlet.steps.engines.replies import ReplyRules

__all__ = ["ENGINE", "REPLIES", "VllmAdapter", "program", "serve", "flags"]


def _args_flags(a: EngineArgs) -> list[str]:
    if a.expert_distribution_recorder_mode is not None:
        raise UsageError("engines.vllm.args.expert_distribution_recorder_mode: vLLM 0.32 has no expert distribution "
                         "recorder (SGLang's); leave it null")
    f: list[str] = []
    f += flag("tensor-parallel-size", a.tp_size)
    if a.ep_size and a.ep_size > 1:
        f += ["--enable-expert-parallel"]
    f += flag("data-parallel-size", a.dp_size)
    f += flag("max-model-len", a.context_length)
    f += flag("max-num-seqs", a.max_running_requests)
    f += flag("gpu-memory-utilization", a.mem_fraction)
    # vLLM 0.32: the MoE kernel is the --moe-backend flag (KernelConfig.moe_backend, e.g. marlin); it reads
    # no VLLM_MXFP4_USE_MARLIN variable any more (the variable was silently ignored)
    f += flag("moe-backend", a.moe_runner_backend)
    f += flag("attention-backend", a.attention_backend.upper() if a.attention_backend else None)
    f += flag("kv-cache-dtype", a.kv_cache_dtype if a.kv_cache_dtype != "bf16" else "auto")
    f += ["--enable-prefix-caching" if a.prefix_cache else "--no-enable-prefix-caching"]
    if a.speculative is not None:
        spec = {"method": a.speculative.method, "num_speculative_tokens": a.speculative.num_speculative_tokens}
        if a.speculative.draft_model:
            spec["model"] = a.speculative.draft_model
        if a.speculative.prompt_lookup_max is not None:
            spec["prompt_lookup_max"] = a.speculative.prompt_lookup_max
        f += ["--speculative-config", json.dumps(spec, sort_keys=True, separators=(",", ":"))]
    f += flag("disable-custom-all-reduce", a.disable_custom_all_reduce)
    if not a.flashinfer_autotune:
        f += ["--no-enable-flashinfer-autotune"]   # KernelConfig.enable_flashinfer_autotune (vLLM 0.32)
    f += flag("trust-remote-code", a.trust_remote_code)
    f += flag("dtype", a.dtype)
    return f


def flags(spec: EngineSpec) -> list[str]:
    """The args' flags, then the parsers' (args.extra is the caller's), then the collective timeout."""
    return [*_args_flags(spec.args), *flag("reasoning-parser", spec.reasoning_parser),
            *flag("tool-call-parser", spec.tool_call_parser),
            # ParallelConfig.distributed_timeout_seconds (vllm/config/parallel.py): the timeout
            # vllm/v1/worker/gpu_worker.py init_worker_distributed_environment gives init_distributed_environment
            # (NCCL groups); the gloo groups keep cpu_distributed_timeout_seconds, torch's 1800 s
            *flag("distributed-timeout-seconds", spec.dist_timeout_s)]


def program(python: str) -> list[str]:
    """``vllm``, the console script vLLM's wheel installs (entry_points.txt: vllm = vllm.entrypoints.cli.main:main):
    on the engine image's PATH beside its python3 (the vllm/vllm-openai image's own entrypoint is ``vllm serve``),
    in a venv beside ``python`` when that is a path (as :func:`gauntlet.steps.engines.llamacpp.program`).

    Not ``python -m vllm.entrypoints.openai.api_server``: deprecated in 0.32, its main()
    (vllm/entrypoints/launchers/api_server/entry.py) starts a whole API server and engine on every rank and
    has no --headless branch; only ``vllm serve`` (cli/serve.py ServeSubcommand.cmd) has one."""
    return [str(Path(python).parent / "vllm") if os.sep in python else "vllm"]


def serve(spec: EngineSpec, *, model_path: str, served_name: str, host: str, placement: Placement) -> list[str]:
    """What follows the program: the model, its name, the address and, on several nodes, the placement."""
    # the model is serve's positional model_tag: `--model` draws vLLM 0.32's "With `vllm serve`, you should
    # provide the model as a positional argument" warning (utils/argparse_utils.py FlexibleArgumentParser)
    cmd = ["serve", model_path, "--served-model-name", served_name, "--host", host, "--port", str(spec.port)]
    if placement.nnodes > 1:
        # TP/PP across nodes, multiprocessing backend (ParallelConfig nnodes/node_rank/master_addr/master_port).
        # Rank > 0 runs --headless: vllm/entrypoints/cli/serve.py ServeSubcommand.cmd sends --headless to
        # run_headless, whose node_rank_within_dp > 0 branch starts only this node's workers
        # (MultiprocExecutor) against the leader's torch.distributed store: no API server, no engine core
        addr, _, port = str(placement.dist_addr).partition(":")
        cmd += ["--nnodes", str(placement.nnodes), "--node-rank", str(placement.node_rank), "--master-addr", addr]
        if port:
            cmd += ["--master-port", port]
        if placement.node_rank > 0:
            cmd += ["--headless"]
    return cmd


class VllmAdapter:
    """vLLM: ModelRegistry, ``vllm serve``'s own parser, Reasoning/ToolParserManager.

    The pods run ``vllm serve <model> ...`` (:func:`serve`), so the argv after the program
    (``serve <model> ...``) goes through the parser the ``vllm`` CLI builds for it
    (vllm/entrypoints/cli/main.py main(): a FlexibleArgumentParser whose ``serve`` subparser is
    ServeSubcommand.subparser_init), then ServeSubcommand.validate, as main() does before dispatching.
    The top-level parser is what rewrites serve's argv (``--model`` moved to the positional, the
    ``--served-model-name`` without a model refused), so it is used whole, not make_arg_parser alone.
    One rule is stricter than the pod: no prefix matching (vLLM's parsers allow abbreviations), so a
    plan names whole flags and a misspelt flag never passes as an abbreviation of a real one.
    """

    engine = "vllm"
    # what may differ between ranks of one deployment (:func:`serve`)
    rank_flags = frozenset({"--node-rank", "--headless", "--master-addr", "--master-port", "--host"})

    def __init__(self) -> None:
        import vllm
        from vllm import ModelRegistry
        from vllm.entrypoints.cli import serve
        from vllm.utils.argparse_utils import FlexibleArgumentParser
        self.version = getattr(vllm, "__version__", None)
        self._registry = ModelRegistry
        self._cli = FlexibleArgumentParser(prog="vllm", allow_abbrev=False)
        (self._serve,) = [c for c in serve.cmd_init() if c.name == "serve"]
        self._parser = self._serve.subparser_init(self._cli.add_subparsers(required=False, dest="subparser"))
        self._parser.allow_abbrev = False       # argparse reads it at parse time
        self._parser.error = pf.refuse  # type: ignore[method-assign, assignment]  # the subparser's own errors (bad choice/type)
        self._groups = {a.dest: g.title or "" for g in self._parser._action_groups for a in g._group_actions}

    def architectures(self) -> list[str]:
        return sorted(self._registry.get_supported_archs())

    def default_of(self, flag: str) -> Any:
        a = pf.action(self._parser, flag)
        return pf.plain(a.default) if a else None

    def group_of(self, flag: str) -> str:
        """The engine's own option group of a flag (vLLM: the argparse group, one per config class)."""
        a = pf.action(self._parser, flag)
        return self._groups.get(a.dest if a else flag, "")

    def parse(self, argv: list[str]) -> tuple[str | None, dict[str, Any] | None]:
        if argv[:1] != ["serve"]:
            return f"not a `vllm serve` command: {' '.join(argv[:2])!r}", None
        ns, err = pf.parse(self._cli, argv)
        if err or ns is None:   # pf.parse gives a namespace or an error
            return err, None
        try:
            self._serve.validate(ns)
        except Exception as exc:  # TypeError/ValueError with the engine's own message
            return f"{type(exc).__name__}: {exc}", None
        if getattr(ns, "attention_backend", None):
            try:
                from vllm.config import AttentionConfig
                AttentionConfig(backend=ns.attention_backend)
            except ImportError:
                pass
            except Exception as exc:  # pydantic ValidationError: the engine's list of backends
                errs = exc.errors() if hasattr(exc, "errors") else [{"msg": str(exc)}]
                msg = str(errs[0].get("msg", exc)).removeprefix("Value error, ")
                return f"--attention-backend {ns.attention_backend}: {msg}"[:600], None
        return None, pf.options(self._parser, ns)

    def attention(self, argv: list[str], *, linear: bool = False) -> dict[str, str] | None:
        """The attention backends as vLLM resolves this command (vllm/engine/arg_utils.py
        EngineArgs.create_engine_config: --attention-backend into the AttentionConfig of --attention-config):
        ``backend`` serves every attention layer in both phases but an MLA layer's prefill, which is
        ``mla_prefill_backend`` (vllm/v1/attention/backends/mla/prefill/selector.py). ``auto``: unset, so
        vLLM picks for the platform at start-up. ``linear``: the model has linear-attention (KDA) layers, which
        no attention backend serves: vLLM 0.32's Kimi KDA layer (model_executor/layers/mamba/gdn/
        kimi_gdn_linear_attn.py) takes its prefill kernel from --additional-config kda_prefill_backend (auto:
        triton, the only one it accepts) and decodes with the bundled flash-linear-attention Triton kernels
        (fused_recurrent_kda), with no flag. None when the command does not parse."""
        from vllm.config import AttentionConfig
        ns, err = pf.parse(self._cli, argv)
        if err or ns is None:
            return None
        try:
            ac = ns.attention_config if isinstance(ns.attention_config, AttentionConfig) else \
                AttentionConfig(**(ns.attention_config or {}))
            backend = (AttentionConfig.validate_backend_before(ns.attention_backend)
                       if getattr(ns, "attention_backend", None) else ac.backend)
        except Exception:
            return None
        name = getattr(backend, "name", backend)
        mla = getattr(ac.mla_prefill_backend, "name", ac.mla_prefill_backend)
        out = {"prefill": str(name or "auto"), "prefill (MLA layers)": str(mla or "auto"),
               "decode": str(name or "auto")}
        if linear:
            extra = ns.additional_config if isinstance(getattr(ns, "additional_config", None), dict) else {}
            kda = str(extra.get("kda_prefill_backend", "auto"))
            out |= {"linear prefill": "triton" if kda == "auto" else kda, "linear decode": "triton"}
        return out

    def env_problems(self, names: list[str]) -> dict[str, str]:
        """Each VLLM_ variable of the engine's env vLLM does not know: one not in ``vllm.envs.environment_variables``,
        what vLLM's own check at start-up warns about ("Unknown vLLM environment variable detected",
        vllm/platforms/interface.py Platform.validate_environ)."""
        from vllm import envs
        return {n: f"vLLM {self.version} warns 'Unknown vLLM environment variable detected': not in "
                   f"vllm.envs.environment_variables ({len(envs.environment_variables)} names)"
                for n in names if n.startswith("VLLM_") and n not in envs.environment_variables}

    def reasoning_parsers(self) -> list[str]:
        from vllm.reasoning import ReasoningParserManager
        m = ReasoningParserManager
        return sorted(m.list_registered() if hasattr(m, "list_registered") else m.reasoning_parsers)

    def tool_parsers(self) -> list[str]:
        try:
            from vllm.tool_parsers import ToolParserManager
        except ImportError:
            from vllm.entrypoints.openai.tool_parsers import ToolParserManager  # type: ignore[import-not-found, no-redef]  # before vllm 0.31
        m = ToolParserManager
        return sorted(m.list_registered() if hasattr(m, "list_registered") else m.tool_parsers)


REPLIES = ReplyRules(
    "vllm", "0.32.0", named_tool_finish="stop", auto_tool_finish="tool_calls", reasoning_field="reasoning",
    sources={
        "tool_finish": "vllm/entrypoints/openai/chat_completion/serving.py (is_finish_reason_tool_calls: "
                       "auto or required -> tool_calls, named -> stop, as OpenAI)",
        "reasoning_field": "vllm/entrypoints/openai/chat_completion/protocol.py ChatMessage.reasoning "
                           "(reasoning_content only accepted on input, renamed)",
    },
    bare_args_hint="(vLLM's strict structural tags send the bare value: VLLM_ENFORCE_STRICT_TOOL_CALLING=0 in "
                   "the engine env gives the object)",
    tool_choice_flag="enable-auto-tool-choice")

ENGINE = Engine(
    name="vllm", title="vLLM", program=program, serve=serve, flags=flags, context_flags=("--max-model-len",),
    checker=VllmAdapter, replies=REPLIES,
    # vLLM 0.32 first, then older vLLM's spelling
    metrics={"running": ("vllm:num_requests_running",), "waiting": ("vllm:num_requests_waiting",),
             "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
             # the sum of histogram_iteration_tokens (vllm/v1/metrics/loggers.py PrometheusStatLogger): prompt +
             # generated tokens of every engine step, what a hang stops (steps/client/stall.py)
             "tokens_processed": ("vllm:iteration_tokens_total_sum", "vllm:generation_tokens_total"),
             "prefix_queries": ("vllm:prefix_cache_queries_total",), "prefix_hits": ("vllm:prefix_cache_hits_total",),
             "spec_drafts": ("vllm:spec_decode_num_drafts_total",),
             "spec_draft_tokens": ("vllm:spec_decode_num_draft_tokens_total",),
             "spec_accepted_tokens": ("vllm:spec_decode_num_accepted_tokens_total",),
             # PrometheusStatLogger's counters per engine step: the scheduler's preempted requests
             # (iteration_stats.num_preempted_reqs), the prompt tokens of the requests that started (their whole
             # prompt, cached part included) and the tokens generated; Gate 4 holds the last two to the client's
             # own counts over each round (steps/evidence/stats.py token_counts)
             "preemptions": ("vllm:num_preemptions_total",),
             "prompt_tokens": ("vllm:prompt_tokens_total",), "generation_tokens": ("vllm:generation_tokens_total",)},
    # the one env value meant to be expanded: Kubernetes fills $(HOST_IP) before vLLM reads it
    host_ip_env="VLLM_HOST_IP")
