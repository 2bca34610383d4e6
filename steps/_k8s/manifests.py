"""Pure builders of every object a run creates on the cluster, as plain dicts.

Each object carries ``gauntlet.dev/run=<uid>`` (and component/engine labels), so
teardown and cleanup can find exactly what this run made. Nothing here talks to
the API: these dicts are validated offline (kubernetes-validate) and applied by
:mod:`gauntlet.steps._k8s.apply`.

The engine is one StatefulSet with one replica per node (parallel pod management,
required anti-affinity, node affinity to the profile's nodes). A StatefulSet has one
pod template, so the template carries every rank's argv (built by
:func:`gauntlet.steps.engine_cmd.engine_command`) and the pod picks its own by ordinal: the
argvs differ only in node rank (and vLLM's ``--headless`` on workers), the env only
in the node's NIC.
"""

from __future__ import annotations

import shlex
from typing import Any

from gauntlet.params.models import EngineSpec, Profile
from gauntlet.steps._k8s import COMPONENT_LABEL, ENGINE_LABEL, RUN_LABEL, dns_name
from gauntlet.steps.engine_cmd import Placement, engine_command, engine_env

__all__ = ["DIST_PORT", "PROBE_PORT", "labels", "engine_names", "rank_argvs", "engine_statefulset",
           "headless_service", "client_service", "engine_objects", "endpoint_url", "probe_names", "probe_job",
           "probe_service", "socket_env"]

DIST_PORT = 20000          # rendezvous port on the leader (sglang --dist-init-addr, vllm --master-port)
PROBE_PORT = 29555         # torchrun's rendezvous in the network probe
HOSTNAME = "kubernetes.io/hostname"


def labels(run_id: str, component: str, engine: str | None = None) -> dict[str, str]:
    out = {RUN_LABEL: run_id, COMPONENT_LABEL: component, "app.kubernetes.io/managed-by": "gauntlet"}
    if engine:
        out[ENGINE_LABEL] = engine
    return out


def _selector(run_id: str, component: str, engine: str | None = None) -> dict[str, str]:
    sel = {RUN_LABEL: run_id, COMPONENT_LABEL: component}
    if engine:
        sel[ENGINE_LABEL] = engine
    return sel


def engine_names(engine: str, run_id: str, variant: str | None = None) -> dict[str, str]:
    """StatefulSet, headless Service and client Service names for one engine (and variant) of a run."""
    base = dns_name("g", engine, *([variant] if variant else []), run_id[:8], limit=40)
    return {"statefulset": base, "headless": f"{base}-hl", "client": base}


def socket_env(profile: Profile) -> dict[str, str]:
    """NCCL/GLOO socket interface when the profile fixes one for every node."""
    ifn = profile.hardware.network.socket_ifname
    return {"NCCL_SOCKET_IFNAME": ifn, "GLOO_SOCKET_IFNAME": ifn} if ifn else {}


def rank_argvs(profile: Profile, engine: str, spec: EngineSpec, leader: str) -> list[list[str]]:
    """One argv per node rank; only --node-rank (and vLLM's --headless) differ between them."""
    n = max(1, len(profile.hardware.nodes))
    m = profile.model
    return [engine_command(engine, spec, model_path=m.mount_path, served_name=m.served_name,
                           placement=Placement(nnodes=n, node_rank=r, dist_addr=f"{leader}:{DIST_PORT}"
                                               if n > 1 else None))
            for r in range(n)]


def _nic_lines(profile: Profile) -> list[str]:
    """sh lines exporting this node's NCCL/GLOO socket interface, where the profile names one per node."""
    per_node = [(n.name, n.rdma_ifname) for n in profile.hardware.nodes if n.rdma_ifname]
    if not per_node or profile.hardware.network.socket_ifname:
        return []
    lines = ['case "$NODE_NAME" in']
    for node, ifn in per_node:
        q = shlex.quote(ifn)
        lines.append(f"  {shlex.quote(node)}) export NCCL_SOCKET_IFNAME={q} GLOO_SOCKET_IFNAME={q} ;;")
    return lines + ["esac"]


def _launch_script(profile: Profile, argvs: list[list[str]]) -> str:
    """sh: the node's NIC (by node name), then exec this pod's rank's argv (by StatefulSet ordinal)."""
    lines = ["set -eu", *_nic_lines(profile)]
    lines.append('rank="${POD_NAME##*-}"')
    lines.append('echo "gauntlet: rank $rank on $NODE_NAME ($HOST_IP)"')
    lines.append('case "$rank" in')
    for r, argv in enumerate(argvs):
        lines.append(f"  {r}) exec {shlex.join(argv)} ;;")
    lines.append('  *) echo "gauntlet: unexpected rank $rank" >&2; exit 2 ;;')
    lines.append("esac")
    return "\n".join(lines) + "\n"


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _env_list(env: dict[str, str]) -> list[dict[str, Any]]:
    return [_field_env("POD_NAME", "metadata.name"), _field_env("NODE_NAME", "spec.nodeName"),
            _field_env("HOST_IP", "status.hostIP")] + [{"name": k, "value": v} for k, v in sorted(env.items())]


def _affinity(profile: Profile, sel: dict[str, str]) -> dict[str, Any]:
    return {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": HOSTNAME, "operator": "In",
                                   "values": [n.name for n in profile.hardware.nodes]}]}]}},
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": dict(sel)}, "topologyKey": HOSTNAME}]},
    }


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
            "command": ["/bin/sh", "-c", script], "env": [_field_env("NODE_NAME", "spec.nodeName")],
            "volumeMounts": [_model_mount(profile)]}


def engine_statefulset(profile: Profile, engine: str, run_id: str, image: str, spec: EngineSpec | None = None,
                       variant: str | None = None) -> dict[str, Any]:
    """The engine: one pod per node, all ranks' argv in the template, model read-only, /dev/shm, GPUs."""
    spec = spec or profile.engines[engine]
    names = engine_names(engine, run_id, variant)
    ns = profile.namespace
    lab = labels(run_id, "engine", engine)
    sel = _selector(run_id, "engine", engine)
    leader = f"{names['statefulset']}-0.{names['headless']}.{ns}.svc.cluster.local"
    argvs = rank_argvs(profile, engine, spec, leader)
    env = {**engine_env(engine, spec), **socket_env(profile)}
    if engine == "vllm":
        env["VLLM_HOST_IP"] = "$(HOST_IP)"        # Kubernetes expands $(VAR) from the env listed before it
    container = {
        "name": "engine", "image": image, "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/sh", "-c", _launch_script(profile, argvs)],
        "env": _env_list(env),
        "ports": [{"name": "http", "containerPort": spec.port}, {"name": "dist", "containerPort": DIST_PORT}],
        "resources": _gpu_resources(profile),
        "volumeMounts": [_model_mount(profile), {"name": "dshm", "mountPath": "/dev/shm"}],
        "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}},   # RDMA pins memory
    }
    if variant:
        lab["gauntlet.dev/variant"] = variant
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": names["statefulset"], "namespace": ns, "labels": lab},
        "spec": {
            "replicas": max(1, len(profile.hardware.nodes)),
            "serviceName": names["headless"],
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": sel},
            "template": {
                "metadata": {"labels": lab},
                "spec": {
                    "serviceAccountName": profile.service_account,
                    "hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet",
                    "affinity": _affinity(profile, sel),
                    "terminationGracePeriodSeconds": 60,
                    "initContainers": [_marker_init(profile, image)],
                    "containers": [container],
                    "volumes": _volumes(profile, spec.shm_size_gib),
                },
            },
        },
    }


def headless_service(profile: Profile, engine: str, run_id: str, variant: str | None = None) -> dict[str, Any]:
    """Stable per-rank DNS (<sts>-0.<headless>) for the rendezvous; ready or not."""
    names = engine_names(engine, run_id, variant)
    spec = profile.engines[engine]
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": names["headless"], "namespace": profile.namespace,
                         "labels": labels(run_id, "engine", engine)},
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                     "selector": _selector(run_id, "engine", engine),
                     "ports": [{"name": "http", "port": spec.port}, {"name": "dist", "port": DIST_PORT}]}}


def client_service(profile: Profile, engine: str, run_id: str, variant: str | None = None) -> dict[str, Any]:
    """What the bench client and the later gates talk to: the leader (rank 0) only."""
    names = engine_names(engine, run_id, variant)
    port = profile.engines[engine].port
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": names["client"], "namespace": profile.namespace,
                         "labels": labels(run_id, "engine", engine)},
            "spec": {"selector": {**_selector(run_id, "engine", engine),
                                  "statefulset.kubernetes.io/pod-name": f"{names['statefulset']}-0"},
                     "ports": [{"name": "http", "port": port, "targetPort": port}]}}


def engine_objects(profile: Profile, engine: str, run_id: str, image: str, spec: EngineSpec | None = None,
                   variant: str | None = None) -> list[dict[str, Any]]:
    """Services first (DNS must exist before the pods look each other up), then the StatefulSet."""
    return [headless_service(profile, engine, run_id, variant), client_service(profile, engine, run_id, variant),
            engine_statefulset(profile, engine, run_id, image, spec, variant)]


def endpoint_url(profile: Profile, engine: str, run_id: str, variant: str | None = None) -> str:
    names = engine_names(engine, run_id, variant)
    return f"http://{names['client']}.{profile.namespace}.svc.cluster.local:{profile.engines[engine].port}"


def probe_names(phase: str, run_id: str) -> dict[str, str]:
    base = dns_name("g", "netprobe", phase, run_id[:8], limit=40)
    return {"job": base, "service": f"{base}-rdzv"}


def probe_job(profile: Profile, phase: str, run_id: str, image: str, env: dict[str, str], script_src: str,
              probe_args: list[str]) -> dict[str, Any]:
    """Indexed Job, one pod per node. phase 'intra': each pod is its own world (all its GPUs);
    'inter': one world across the nodes, rank 0's pod is the rendezvous behind probe_service."""
    n = max(1, len(profile.hardware.nodes))
    g = max(1, profile.hardware.gpus_per_node)
    names = probe_names(phase, run_id)
    comp = f"netprobe-{phase}"
    lab = labels(run_id, comp)
    if phase == "intra":
        launch = f"torchrun --standalone --nproc-per-node {g} /tmp/gauntlet_probe.py"
    else:
        master = f"{names['service']}.{profile.namespace}.svc.cluster.local"
        launch = (f"torchrun --nnodes {n} --nproc-per-node {g} --node-rank \"$JOB_COMPLETION_INDEX\" "
                  f"--master-addr {master} --master-port {PROBE_PORT} /tmp/gauntlet_probe.py")
    script = "\n".join([
        "set -eu",
        *_nic_lines(profile),
        'printf "%s" "$GAUNTLET_PROBE_SRC" > /tmp/gauntlet_probe.py',
        'echo "gauntlet: probe index $JOB_COMPLETION_INDEX on $NODE_NAME"',
        # nccl-tests, where the image carries them, on this node's GPUs (parsed beside the torch figures)
        f'if [ "{phase}" = intra ] && command -v all_reduce_perf >/dev/null 2>&1; then '
        f'echo "GAUNTLET_NCCL_TESTS_BEGIN all_reduce_perf"; all_reduce_perf -b 1M -e 1G -f 4 -g {g} || true; '
        f'echo "GAUNTLET_NCCL_TESTS_END"; fi',
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
                    "serviceAccountName": profile.service_account,
                    "hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet",
                    "affinity": _affinity(profile, _selector(run_id, comp)),
                    "containers": [{
                        "name": "probe", "image": image, "imagePullPolicy": "IfNotPresent",
                        "command": ["/bin/sh", "-c", script],
                        "env": _env_list(full_env),
                        "resources": _gpu_resources(profile),
                        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
                        "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}},
                    }],
                    "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}],
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
