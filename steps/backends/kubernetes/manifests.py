"""Pure builders of every object a run creates on the cluster, as plain dicts.

Each object carries ``gauntlet.dev/run=<uid>`` (and component/engine labels), so
teardown and cleanup can find exactly what this run made. Nothing here talks to
the API: these dicts are validated offline (kubernetes-validate) and applied by
:mod:`gauntlet.steps.backends.kubernetes.apply`.

The engine is one StatefulSet with one replica per node (parallel pod management,
required anti-affinity, node affinity to the profile's nodes). A StatefulSet has one
pod template, so the template carries every rank's argv (built by
:func:`gauntlet.steps.engines.commands.engine_command`) and the pod picks its own by ordinal: the
argvs differ only in node rank (and vLLM's ``--headless`` on workers), the env only
in the node's NIC. The per-rank telemetry sampler runs in the engine container, started by the same launch script
(:func:`sampler_lines`): the container that holds the GPUs is the one that can read them.
"""

from __future__ import annotations

import copy
import shlex
from typing import Any

from gauntlet.params.models import EngineSpec, Profile, SecretRef
from gauntlet.steps.backends.kubernetes import COMPONENT_LABEL, ENGINE_LABEL, RUN_LABEL, VARIANT_LABEL, dns_name
from gauntlet.steps.cluster.fabric import fabric_env, socket_env
from gauntlet.steps.engines import engine as engine_of
from gauntlet.steps.engines.commands import Placement, engine_command, engine_env

__all__ = ["DIST_PORT", "PROBE_PORT", "labels", "engine_names", "engine_selector", "rank_argvs", "engine_statefulset",
           "headless_service", "client_service", "engine_objects", "endpoint_url", "probe_names", "probe_job",
           "probe_service", "socket_env", "fabric_env", "rdma_access", "rdma_device_of", "rdma_access_problems",
           "sampler_lines", "engine_resources", "SAMPLER_MEMORY_GIB", "SAMPLER_SRC_ENV", "EXPERT_DIR"]

DIST_PORT = 20000          # rendezvous port on the leader (sglang --dist-init-addr, vllm --master-port)
PROBE_PORT = 29555         # torchrun's rendezvous in the network probe
HOSTNAME = "kubernetes.io/hostname"
# where SGLang's rank 0 writes its expert distribution dumps (SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR): an emptyDir
# (its size bounded) in the engine container, whose sampler serves the newest dump at /expert-load
EXPERT_DIR = "/gauntlet/expert-distribution"
# the sampler's share of the engine container's memory request: its ring of samples (a few MiB), and torch once it
# reads an expert dump (imported from the engine image)
SAMPLER_MEMORY_GIB = {False: 1, True: 3}
SAMPLER_SRC_ENV = "GAUNTLET_TELEMETRY_SRC"


def labels(run_id: str, component: str, engine: str | None = None, variant: str | None = None) -> dict[str, str]:
    out = {RUN_LABEL: run_id, COMPONENT_LABEL: component, "app.kubernetes.io/managed-by": "gauntlet"}
    if engine:
        out[ENGINE_LABEL] = engine
    if variant:
        out[VARIANT_LABEL] = variant
    return out


def _selector(run_id: str, component: str, engine: str | None = None, variant: str | None = None) -> dict[str, str]:
    sel = {RUN_LABEL: run_id, COMPONENT_LABEL: component}
    if engine:
        sel[ENGINE_LABEL] = engine
    if variant:
        sel[VARIANT_LABEL] = variant
    return sel


def _engine_pods(run_id: str, engine: str, variant: str | None) -> dict[str, Any]:
    """The LabelSelector of one engine's pods: a variant's by its label, the baseline's by its absence, so the
    baseline's StatefulSet and anti-affinity never count a variant's pods and a variant's never the baseline's."""
    sel: dict[str, Any] = {"matchLabels": _selector(run_id, "engine", engine, variant)}
    if not variant:
        sel["matchExpressions"] = [{"key": VARIANT_LABEL, "operator": "DoesNotExist"}]
    return sel


def engine_selector(engine: str, variant: str | None = None) -> str:
    """The same choice as a list call's labelSelector (the run's label is added by the Manager)."""
    return (f"{COMPONENT_LABEL}=engine,{ENGINE_LABEL}={engine},"
            + (f"{VARIANT_LABEL}={variant}" if variant else f"!{VARIANT_LABEL}"))


def engine_names(engine: str, run_id: str, variant: str | None = None) -> dict[str, str]:
    """StatefulSet, headless Service and client Service names for one engine (and variant) of a run."""
    base = dns_name("g", engine, *([variant] if variant else []), run_id[:8], limit=40)
    return {"statefulset": base, "headless": f"{base}-hl", "client": base}


def rank_argvs(profile: Profile, engine: str, spec: EngineSpec, leader: str) -> list[list[str]]:
    """One argv per node rank; only --node-rank (and vLLM's --headless) differ between them."""
    n = max(1, len(profile.hardware.nodes))
    m = profile.model
    return [engine_command(engine, spec, model_path=m.mount_path, served_name=m.served_name,
                           placement=Placement(nnodes=n, node_rank=r, dist_addr=f"{leader}:{DIST_PORT}"
                                               if n > 1 else None))
            for r in range(n)]


def _nic_lines(profile: Profile, node_env: dict[str, dict[str, str]] | None = None,
               fixed: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """sh lines exporting this node's NCCL/GLOO settings by node name: the profile's per-node ``rdma_ifname``,
    then what Gate 1 resolved for the node (``node_env``, steps/cluster/fabric.py); never a key in ``fixed`` (the
    container's own env: the engine's explicit env and the profile's fixed values win)."""
    per: dict[str, dict[str, str]] = {}
    for n in profile.hardware.nodes:
        env = ({"NCCL_SOCKET_IFNAME": n.rdma_ifname, "GLOO_SOCKET_IFNAME": n.rdma_ifname}
               if n.rdma_ifname and not profile.hardware.network.socket_ifname else {})
        env = {k: v for k, v in {**env, **(node_env or {}).get(n.name, {})}.items() if k not in fixed and v}
        if env:
            per[n.name] = env
    if not per:
        return []
    lines = ['case "$NODE_NAME" in']
    for node, env in per.items():
        order = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX")
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items(), key=lambda kv: (
            order.index(kv[0]) if kv[0] in order else len(order), kv[0])))
        lines.append(f"  {shlex.quote(node)}) export {exports} ;;")
    return lines + ["esac"]


def rdma_access(profile: Profile) -> dict[str, Any]:
    """The container's way into the fabric from ``hardware.fabric``: ``resources`` (the device plugin's
    resource, beside the GPUs), ``mounts`` and ``volumes`` (the host's device directory) and its
    ``securityContext`` (capabilities; privileged where the profile says so)."""
    fab = profile.hardware.fabric
    res = _gpu_resources(profile)
    if fab.rdma_resource:
        for side in ("requests", "limits"):
            res[side][fab.rdma_resource] = str(fab.rdma_resource_count)
    sec: dict[str, Any] = {"capabilities": {"add": list(fab.capabilities)}} if fab.capabilities else {}
    if fab.privileged:
        sec["privileged"] = True
    vols = [{"name": "rdma-dev", "hostPath": {"path": fab.device_path, "type": "Directory"}}] if fab.device_path else []
    mounts = [{"name": "rdma-dev", "mountPath": fab.device_path}] if fab.device_path else []
    return {"resources": res, "securityContext": sec, "volumes": vols, "mounts": mounts}


def rdma_device_of(pod_spec: dict[str, Any], resource: str | None, container: str) -> str | None:
    """How the pod's ``container`` reaches the verbs devices, read from the pod spec itself: 'resource NAME: N',
    'DIR (privileged)', or None (it would see /sys/class/infiniband but open no device)."""
    c = next((x for x in pod_spec.get("containers") or [] if x.get("name") == container), None)
    if c is None:
        return None
    limits = (c.get("resources") or {}).get("limits") or {}
    if resource and resource in limits:
        return f"resource {resource}: {limits[resource]}"
    privileged = bool((c.get("securityContext") or {}).get("privileged"))
    host = {v["name"]: v["hostPath"]["path"] for v in pod_spec.get("volumes") or [] if v.get("hostPath")}
    dev = [m["mountPath"] for m in c.get("volumeMounts") or []
           if host.get(m.get("name")) == m.get("mountPath") and m["mountPath"].startswith("/dev/")]
    return f"{dev[0]} (privileged)" if dev and privileged else None


def _launch_script(profile: Profile, argvs: list[list[str]], node_env: dict[str, dict[str, str]] | None = None,
                   fixed: set[str] | frozenset[str] = frozenset(), sampler: list[str] | None = None) -> str:
    """sh: the node's NCCL/GLOO settings (by node name), the ``sampler`` lines, then exec this pod's rank's argv
    (by StatefulSet ordinal)."""
    lines = ["set -eu", *_nic_lines(profile, node_env, fixed)]
    lines.append('rank="${POD_NAME##*-}"')
    lines.append('echo "gauntlet: rank $rank on $NODE_NAME ($HOST_IP)"')
    lines += sampler or []
    lines.append('case "$rank" in')
    for r, argv in enumerate(argvs):
        lines.append(f"  {r}) exec {shlex.join(argv)} ;;")
    lines.append('  *) echo "gauntlet: unexpected rank $rank" >&2; exit 2 ;;')
    lines.append("esac")
    return "\n".join(lines) + "\n"


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _literal(text: str) -> str:
    """``text`` as Kubernetes passes it on: the kubelet expands ``$(VAR)`` in a container's command, args and
    env values and reads ``$$`` as ``$``, so every ``$`` is doubled. Without this a profile value holding
    ``$(VAR)`` would put that variable's value into the launch script, past shlex's quoting."""
    return text.replace("$", "$$")


def _env_list(env: dict[str, str], secrets: dict[str, SecretRef] | None = None) -> list[dict[str, Any]]:
    """The pod's env: its name, node and host IP, ``env`` literally (see :func:`_literal`), then ``secrets``
    as secretKeyRef (a missing Secret or key keeps the pod from starting: Gate 2 names the reason)."""
    return ([_field_env("POD_NAME", "metadata.name"), _field_env("NODE_NAME", "spec.nodeName"),
             _field_env("HOST_IP", "status.hostIP")]
            + [{"name": k, "value": _literal(v)} for k, v in sorted(env.items())]
            + [{"name": k, "valueFrom": {"secretKeyRef": {"name": ref.secret, "key": ref.key}}}
               for k, ref in sorted((secrets or {}).items())])


def _affinity(profile: Profile, pods: dict[str, Any]) -> dict[str, Any]:
    """Only the profile's nodes; never two of the pods ``pods`` (a LabelSelector) on one node."""
    return {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": HOSTNAME, "operator": "In",
                                   "values": [n.name for n in profile.hardware.nodes]}]}]}},
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": pods, "topologyKey": HOSTNAME}]},
    }


def _pool(profile: Profile) -> dict[str, Any]:
    """What lets a pod onto the pool's nodes: their taints' tolerations and the pool's priority class.
    Only pods pinned to the pool (by :func:`_affinity`) carry them, so no other pod takes the pool's room."""
    hw = profile.hardware
    out: dict[str, Any] = {}
    if hw.tolerations:
        out["tolerations"] = [t.manifest() for t in hw.tolerations]
    if hw.priority_class_name:
        out["priorityClassName"] = hw.priority_class_name
    return out


def _gpu_resources(profile: Profile) -> dict[str, Any]:
    g = str(profile.hardware.gpus_per_node)
    return {"requests": {"nvidia.com/gpu": g}, "limits": {"nvidia.com/gpu": g}}


def _volumes(profile: Profile, shm_gib: int) -> list[dict[str, Any]]:
    return [{"name": "model", "hostPath": {"path": profile.model.host_cache_path, "type": "Directory"}},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{shm_gib}Gi"}}]


def _model_mount(profile: Profile) -> dict[str, Any]:
    return {"name": "model", "mountPath": profile.model.mount_path, "readOnly": True}


def _marker_init(profile: Profile, image: str) -> dict[str, Any]:
    """Refuse to start the engine on a node whose cache copy is incomplete."""
    marker = str(profile.marker_path())
    script = (f"test -f {shlex.quote(marker)} || {{ echo {shlex.quote('gauntlet: ' + marker + ' missing on')} "
              f'"$NODE_NAME": the model cache is incomplete, refusing to start >&2; exit 1; }}')
    return {"name": "require-marker", "image": image, "imagePullPolicy": "IfNotPresent",
            "command": ["/bin/sh", "-c", _literal(script)], "env": [_field_env("NODE_NAME", "spec.nodeName")],
            "volumeMounts": [_model_mount(profile)]}


def _records_experts(engine: str, spec: EngineSpec) -> bool:
    from gauntlet.steps.cluster.expert_load import MODES
    return engine_of(engine).expert_recorder and spec.args.expert_distribution_recorder_mode in MODES


def sampler_lines(profile: Profile, expert_dir: str | None = None) -> list[str]:
    """sh lines starting the per-rank sampler (steps/cluster/telemetry.py, run from its source with the engine image's
    Python, ``$GAUNTLET_TELEMETRY_SRC``) in the background, in the engine container, before the rank's argv is exec'd.

    In the engine container because that container holds the node's GPUs through the device plugin's allocation
    (``nvidia.com/gpu``): NVML and nvidia-smi see them there on every runtime. A container beside it with no
    allocation sees them only through ``NVIDIA_VISIBLE_DEVICES=all`` and the legacy NVIDIA runtime: from GPU
    Operator v25.10 the runtime injects devices through CDI (docs.nvidia.com, GPU Operator, "Container Device
    Interface (CDI) Support"), where such a container needs ``runtimeClassName: nvidia``, and hardened clusters
    refuse the variable to unprivileged containers (the device plugin's
    ``accept-nvidia-visible-devices-envvar-when-unprivileged: false``): the sidecar this replaces saw no GPU there.

    ``--exit-with $$``: the shell's pid, which ``exec`` hands to the engine, so the sampler leaves with it (and the
    kernel ends it with the container's PID 1 anyway). A sampler that cannot start (no python3, no /tmp) is
    one line in the engine's log and leaves the engine alone (a background subshell: ``set -e`` does not reach
    it); Gate 4 then names each rank's sampler unreachable. ``--container-memory``: it also samples the engine
    container's memory working set, against what :func:`engine_resources` requests. ``expert_dir``: the engine's
    expert distribution dumps, served at ``/expert-load``."""
    t = profile.hardware.telemetry
    args = shlex.join(["serve", "--port", str(t.port), "--interval", str(t.interval_s), "--container-memory",
                       *(["--expert-dir", expert_dir] if expert_dir else [])])
    return [f'( printf "%s" "${SAMPLER_SRC_ENV}" > /tmp/gauntlet_telemetry.py && '
            f'exec python3 /tmp/gauntlet_telemetry.py {args} --exit-with "$$" ) &']


def engine_resources(profile: Profile, spec: EngineSpec, experts: bool = False) -> dict[str, Any]:
    """The engine container's resources: its GPUs and RDMA (:func:`rdma_access`), and CPU and memory requested for
    what it holds: ``/dev/shm`` (a memory emptyDir: its pages count against the pod's memory), the engine's resident
    size, HiCache's host pool while ``args.hicache`` is on, the sampler's share.

    Requested, not limited: under memory pressure the kubelet evicts first the pods whose usage exceeds their
    requests, then by priority, then by how far past (k8s.io/kubernetes pkg/kubelet/eviction/helpers.go
    ``rankMemoryPressure``: exceedMemoryRequests, priority, memory). Without a request the engine is always past it,
    so it went first; a limit would turn a burst into an OOM kill of a rank holding 8 GPUs instead."""
    res = rdma_access(profile)["resources"]
    hicache = (spec.hicache_host_gib or 0) if spec.args.hicache else 0
    mem = spec.shm_size_gib + spec.resident_gib + hicache + SAMPLER_MEMORY_GIB[experts]
    res["requests"] = {"cpu": str(spec.cpus), "memory": f"{mem}Gi", **res["requests"]}
    return res


def engine_statefulset(profile: Profile, engine: str, run_id: str, image: str, spec: EngineSpec | None = None,
                       variant: str | None = None, node_env: dict[str, dict[str, str]] | None = None) -> dict[str, Any]:
    """The engine: one pod per node, all ranks' argv in the template, model read-only, /dev/shm, GPUs, the
    fabric as ``hardware.fabric`` says (:func:`rdma_access`) and each node's NCCL/GLOO settings (``node_env``:
    Gate 1's, steps/cluster/fabric.py) exported by node name."""
    spec = spec or profile.engine(engine)
    rdma = rdma_access(profile)
    names = engine_names(engine, run_id, variant)
    ns = profile.namespace
    lab = labels(run_id, "engine", engine, variant)
    sel = _engine_pods(run_id, engine, variant)
    leader = f"{names['statefulset']}-0.{names['headless']}.{ns}.svc.cluster.local"
    argvs = rank_argvs(profile, engine, spec, leader)
    own = {**engine_env(engine, spec), **fabric_env(profile)}      # the hardware section's fabric wins
    experts = _records_experts(engine, spec)
    if experts:
        from gauntlet.steps.cluster.expert_load import RECORDER_DIR_ENV
        own[RECORDER_DIR_ENV] = EXPERT_DIR
    env = _env_list(own, spec.secret_env)
    host_ip = engine_of(engine).host_ip_env
    if host_ip:      # the one value meant to be expanded: Kubernetes fills $(VAR) from the env before it
        env = [e for e in env if e["name"] != host_ip] + [{"name": host_ip, "value": "$(HOST_IP)"}]
    from pathlib import Path

    from gauntlet.steps.cluster import telemetry as _telemetry
    script = _launch_script(profile, argvs, node_env, set(own) | set(spec.secret_env),
                            sampler_lines(profile, EXPERT_DIR if experts else None))
    # the sampler's source, for the launch script (in place of any such name the engine's env might carry)
    env = [e for e in env if e["name"] != SAMPLER_SRC_ENV] + [
        {"name": SAMPLER_SRC_ENV, "value": _literal(Path(_telemetry.__file__).read_text())}]
    container = {
        "name": "engine", "image": image, "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/sh", "-c", _literal(script)],
        "env": env,
        "ports": [{"name": "http", "containerPort": spec.port}, {"name": "dist", "containerPort": DIST_PORT},
                  {"name": "telemetry", "containerPort": profile.hardware.telemetry.port}],
        "resources": engine_resources(profile, spec, experts),
        "volumeMounts": [_model_mount(profile), {"name": "dshm", "mountPath": "/dev/shm"}, *rdma["mounts"],
                         *([{"name": "expert-distribution", "mountPath": EXPERT_DIR}] if experts else [])],
        "securityContext": rdma["securityContext"],       # IPC_LOCK: verbs pin (register) memory
    }
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": names["statefulset"], "namespace": ns, "labels": lab},
        "spec": {
            "replicas": max(1, len(profile.hardware.nodes)),
            "serviceName": names["headless"],
            "podManagementPolicy": "Parallel",
            "selector": sel,
            "template": {
                "metadata": {"labels": lab},
                "spec": {
                    # the engine calls no Kubernetes API: the profile's plain account, and no token in the pod
                    "serviceAccountName": profile.service_account, "automountServiceAccountToken": False,
                    "hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet",
                    "affinity": _affinity(profile, copy.deepcopy(sel)),
                    **_pool(profile),
                    "terminationGracePeriodSeconds": 60,
                    "initContainers": [_marker_init(profile, image)],
                    "containers": [container],
                    # a stat dump is (passes <= 1000, layers, experts) int32, ~90 MB for the Kimi K3: one per case
                    "volumes": _volumes(profile, spec.shm_size_gib) + rdma["volumes"] + (
                        [{"name": "expert-distribution", "emptyDir": {"sizeLimit": "20Gi"}}] if experts else []),
                },
            },
        },
    }


def headless_service(profile: Profile, engine: str, run_id: str, variant: str | None = None) -> dict[str, Any]:
    """Stable per-rank DNS (<sts>-0.<headless>) for the rendezvous; ready or not.

    A Service selector is equality only: the baseline's cannot say "no variant label", so it would list a
    variant's pods too while both existed. They never do (Gate 6 releases the baseline before a variant is
    deployed), and the per-rank names resolve through each pod's own subdomain either way."""
    names = engine_names(engine, run_id, variant)
    spec = profile.engine(engine)
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": names["headless"], "namespace": profile.namespace,
                         "labels": labels(run_id, "engine", engine, variant)},
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                     "selector": _selector(run_id, "engine", engine, variant),
                     "ports": [{"name": "http", "port": spec.port}, {"name": "dist", "port": DIST_PORT}]}}


def client_service(profile: Profile, engine: str, run_id: str, variant: str | None = None) -> dict[str, Any]:
    """What the bench client and the later gates talk to: the leader (rank 0) only."""
    names = engine_names(engine, run_id, variant)
    port = profile.engine(engine).port
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": names["client"], "namespace": profile.namespace,
                         "labels": labels(run_id, "engine", engine, variant)},
            "spec": {"selector": {**_selector(run_id, "engine", engine, variant),
                                  "statefulset.kubernetes.io/pod-name": f"{names['statefulset']}-0"},
                     "ports": [{"name": "http", "port": port, "targetPort": port}]}}


def engine_objects(profile: Profile, engine: str, run_id: str, image: str, spec: EngineSpec | None = None,
                   variant: str | None = None, node_env: dict[str, dict[str, str]] | None = None) -> list[dict[str, Any]]:
    """Services first (DNS must exist before the pods look each other up), then the StatefulSet."""
    return [headless_service(profile, engine, run_id, variant), client_service(profile, engine, run_id, variant),
            engine_statefulset(profile, engine, run_id, image, spec, variant, node_env)]


def endpoint_url(profile: Profile, engine: str, run_id: str, variant: str | None = None) -> str:
    names = engine_names(engine, run_id, variant)
    return f"http://{names['client']}.{profile.namespace}.svc.cluster.local:{profile.engine(engine).port}"


def probe_names(phase: str, run_id: str) -> dict[str, str]:
    base = dns_name("g", "netprobe", phase, run_id[:8], limit=40)
    return {"job": base, "service": f"{base}-rdzv"}


def probe_job(profile: Profile, phase: str, run_id: str, image: str, env: dict[str, str], script_src: str,
              probe_args: list[str], node_env: dict[str, dict[str, str]] | None = None) -> dict[str, Any]:
    """Indexed Job, one pod per node. phase 'intra': each pod is its own world (all its GPUs);
    'inter': one world across the nodes, rank 0's pod is the rendezvous behind probe_service. Its way into the
    fabric and each node's NCCL/GLOO settings are the engine's (:func:`rdma_access`, ``node_env``)."""
    rdma = rdma_access(profile)
    n = max(1, len(profile.hardware.nodes))
    g = max(1, profile.hardware.gpus_per_node)
    names = probe_names(phase, run_id)
    comp = f"netprobe-{phase}"
    lab = labels(run_id, comp)
    if phase == "intra":
        launch = shlex.join(["torchrun", "--standalone", "--nproc-per-node", str(g), "/tmp/gauntlet_probe.py"])
    else:
        master = f"{names['service']}.{profile.namespace}.svc.cluster.local"
        launch = (shlex.join(["torchrun", "--nnodes", str(n), "--nproc-per-node", str(g)])
                  + ' --node-rank "$JOB_COMPLETION_INDEX" '       # the one word the shell fills in
                  + shlex.join(["--master-addr", master, "--master-port", str(PROBE_PORT), "/tmp/gauntlet_probe.py"]))
    nccl_tests = shlex.join(["all_reduce_perf", "-b", "1M", "-e", "1G", "-f", "4", "-g", str(g)])
    script = "\n".join([
        "set -eu",
        *_nic_lines(profile, node_env, set(env)),
        'printf "%s" "$GAUNTLET_PROBE_SRC" > /tmp/gauntlet_probe.py',
        'echo "gauntlet: probe index $JOB_COMPLETION_INDEX on $NODE_NAME"',
        # nccl-tests, where the image carries them, on this node's GPUs (parsed beside the torch figures)
        *([f'if command -v all_reduce_perf >/dev/null 2>&1; then echo "GAUNTLET_NCCL_TESTS_BEGIN all_reduce_perf"; '
           f'{nccl_tests} || true; echo "GAUNTLET_NCCL_TESTS_END"; fi'] if phase == "intra" else []),
        f"exec {launch} {shlex.join(probe_args)}",
    ]) + "\n"
    full_env = {**env, "GAUNTLET_PROBE_SRC": script_src}
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": names["job"], "namespace": profile.namespace, "labels": lab},
        "spec": {
            "completionMode": "Indexed", "completions": n, "parallelism": n, "backoffLimit": 0,
            "activeDeadlineSeconds": profile.hardware.network.probe_timeout_s,
            "template": {
                "metadata": {"labels": lab},
                "spec": {
                    "restartPolicy": "Never",
                    # the probe calls no Kubernetes API: no token in the pod
                    "serviceAccountName": profile.service_account, "automountServiceAccountToken": False,
                    "hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet",
                    "affinity": _affinity(profile, {"matchLabels": _selector(run_id, comp)}),
                    **_pool(profile),
                    "containers": [{
                        "name": "probe", "image": image, "imagePullPolicy": "IfNotPresent",
                        "command": ["/bin/sh", "-c", _literal(script)],
                        "env": _env_list(full_env),
                        "resources": rdma["resources"],
                        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}, *rdma["mounts"]],
                        "securityContext": rdma["securityContext"],
                    }],
                    "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}},
                                *rdma["volumes"]],
                },
            },
        },
    }


def probe_service(profile: Profile, phase: str, run_id: str) -> dict[str, Any]:
    """The rendezvous address of the inter-node probe: the pod with completion index 0."""
    names = probe_names(phase, run_id)
    comp = f"netprobe-{phase}"
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": names["service"], "namespace": profile.namespace, "labels": labels(run_id, comp)},
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                     "selector": {**_selector(run_id, comp), "batch.kubernetes.io/job-completion-index": "0"},
                     "ports": [{"name": "rdzv", "port": PROBE_PORT}]}}


def rdma_access_problems(profile: Profile) -> list[str]:
    """For a profile that declares RDMA (``rdma_required``): every pod it would run NCCL in (each engine's
    StatefulSet, the probe Jobs) that gets no RDMA device, read from these manifests: one line naming them,
    or none."""
    fab = profile.hardware.fabric
    if profile.hardware.kind != "kubernetes" or not profile.hardware.network.rdma_required:
        return []
    pods = [(f"engine {e} (StatefulSet)", engine_statefulset(profile, e, "0" * 8, "image"), "engine")
            for e in profile.engine_order()]
    pods.append(("NCCL probe (Job)", probe_job(profile, "inter", "0" * 8, "image", {}, "", []), "probe"))
    why = ("hardware.fabric.device_path without privileged: true (the device cgroup refuses it)"
           if fab.device_path and not fab.privileged else
           "no hardware.fabric.rdma_resource or device_path")
    without = [what for what, obj, container in pods
               if rdma_device_of(obj["spec"]["template"]["spec"], fab.rdma_resource, container) is None]
    return [f"hardware.network.rdma_required is true but the pods of {', '.join(without)} get no RDMA device "
            f"({why}): NCCL would fall back to NET/Socket; set hardware.fabric (docs/cluster.md, RDMA and NCCL "
            "inside the pods)"] if without else []
