"""Pure plans of the box's process kubelet (:mod:`box.kubelet`): no API calls, no processes.

What a pod's container runs (image table, command/args rules, stand-in rewrite), with
what environment (env, envFrom, fieldRef, ``$(VAR)``), with which bind mounts, and the
pod status it reports (phase, conditions, container statuses).
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["LOOPBACK", "HOST_PATH", "GPU", "ImageRun", "Mount", "ConfigError", "ContainerRun", "find_image",
           "expand_refs", "field_ref", "format_map", "go_quote", "resolve_env", "container_argv", "mount_plan",
           "hosts_text", "downward_files", "task_path", "standin_key", "standin_behaviours",
           "choose_behaviour", "standin_argv", "engine_argv", "container_status", "pod_phase", "pod_status"]

LOOPBACK = "127.0.0.1"
HOST_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
GPU = "nvidia.com/gpu"
STEP_LABEL = "gauntlet.dev/step"
NODE_NAME_ANNOTATION = "workflows.argoproj.io/node-name"
WORKFLOW_LABEL = "workflows.argoproj.io/workflow"
RETRY_SUFFIX = re.compile(r"[(]\d+[)]$")     # Argo names a retry's attempts <task>(0), <task>(1), ...


@dataclass(frozen=True)
class ImageRun:
    """How an image reference runs on this machine: its ENTRYPOINT/CMD, PATH, WORKDIR, ENV, and the host
    directories the image would carry (container path → host path, e.g. the repo at /opt/gauntlet/app)."""

    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    path: tuple[str, ...] = HOST_PATH
    workdir: str = "/"
    env: Mapping[str, str] = field(default_factory=dict)
    mounts: Mapping[str, str] = field(default_factory=dict)


ImageKey = str | Callable[[str], bool]


def find_image(images: Mapping[ImageKey, ImageRun], ref: str) -> ImageRun | None:
    """Exact key, else the longest ``prefix*`` key, else the first predicate that accepts ``ref``."""
    if ref in images:
        return images[ref]
    prefixes = [k for k in images if isinstance(k, str) and k.endswith("*") and ref.startswith(k[:-1])]
    if prefixes:
        return images[max(prefixes, key=len)]
    return next((run for k, run in images.items() if callable(k) and k(ref)), None)


class ConfigError(Exception):
    """What a kubelet reports as CreateContainerConfigError: a missing ConfigMap/Secret (key) not marked optional."""


def expand_refs(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: defined names are replaced, undefined ones kept, ``$$`` is ``$``."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            if text[i + 1] == "$":
                out.append("$")
                i += 2
                continue
            end = text.find(")", i + 2) if text[i + 1] == "(" else -1
            if end != -1:
                name = text[i + 2:end]
                out.append(env[name] if name in env else text[i:end + 1])
                i = end + 1
                continue
        out.append(text[i])
        i += 1
    return "".join(out)


def go_quote(s: str) -> str:
    """Go's strconv.Quote for what labels and annotations hold (printable Unicode kept as is)."""
    esc = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r", "\a": "\\a", "\b": "\\b",
           "\f": "\\f", "\v": "\\v"}
    return '"' + "".join(esc.get(c) or (c if c.isprintable() else f"\\x{ord(c):02x}" if ord(c) < 0x80
                                         else f"\\u{ord(c):04x}") for c in s) + '"'


def format_map(m: Mapping[str, str]) -> str:
    """The kubelet's downward API format for labels/annotations: sorted ``key="value"`` lines, no final newline."""
    return "\n".join(f"{k}={go_quote(m[k])}" for k in sorted(m))


def field_ref(pod: dict[str, Any], path: str) -> str:
    """A fieldRef's value; IPs are the loopback address (the box has no pod network)."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if m:
        return (meta.get(m.group(1)) or {}).get(m.group(2), "")
    values = {"metadata.name": meta.get("name", ""), "metadata.namespace": meta.get("namespace", ""),
              "metadata.uid": meta.get("uid", ""), "metadata.labels": format_map(meta.get("labels") or {}),
              "metadata.annotations": format_map(meta.get("annotations") or {}),
              "spec.nodeName": spec.get("nodeName", ""), "spec.serviceAccountName": spec.get("serviceAccountName", ""),
              "status.podIP": LOOPBACK, "status.hostIP": LOOPBACK, "status.podIPs": LOOPBACK,
              "status.hostIPs": LOOPBACK}
    if path not in values:
        raise ConfigError(f"unsupported fieldPath {path!r}")
    return values[path]


Lookup = Callable[[str], Mapping[str, str] | None]   # ConfigMap/Secret name → its data (None: no such object)


def _key_ref(ref: dict[str, Any], kind: str, lookup: Lookup) -> str | None:
    data = lookup(ref["name"])
    if data is None or ref["key"] not in data:
        if ref.get("optional"):
            return None
        what = f'{kind} "{ref["name"]}" not found' if data is None else f'couldn\'t find key {ref["key"]} in {kind} {ref["name"]}'
        raise ConfigError(what)
    return data[ref["key"]]


def resolve_env(container: dict[str, Any], pod: dict[str, Any], base: Mapping[str, str], configmap: Lookup,
                secret: Lookup) -> dict[str, str]:
    """base (image env, service env), then envFrom, then env in order, each value ``$(VAR)``-expanded."""
    env = dict(base)
    for src in container.get("envFrom") or []:
        kind, ref = ("ConfigMap", src["configMapRef"]) if "configMapRef" in src else ("Secret", src["secretRef"])
        data = (configmap if kind == "ConfigMap" else secret)(ref["name"])
        if data is None:
            if ref.get("optional"):
                continue
            raise ConfigError(f'{kind.lower()} "{ref["name"]}" not found')
        env.update({src.get("prefix", "") + k: v for k, v in data.items()})
    for e in container.get("env") or []:
        vf = e.get("valueFrom")
        if vf is None:
            value: str | None = expand_refs(e.get("value") or "", env)
        elif "fieldRef" in vf:
            value = field_ref(pod, vf["fieldRef"]["fieldPath"])
        elif "configMapKeyRef" in vf:
            value = _key_ref(vf["configMapKeyRef"], "configmap", configmap)
        elif "secretKeyRef" in vf:
            value = _key_ref(vf["secretKeyRef"], "secret", secret)
        elif "resourceFieldRef" in vf:
            res = vf["resourceFieldRef"]["resource"]
            kind_, _, name = res.partition(".")
            value = str(((container.get("resources") or {}).get(kind_) or {}).get(name, "0"))
        else:
            raise ConfigError(f"env {e['name']}: unsupported valueFrom {sorted(vf)}")
        if value is not None:
            env[e["name"]] = value
    return env


def container_argv(container: dict[str, Any], image: ImageRun, env: Mapping[str, str]) -> list[str]:
    """command replaces the image's ENTRYPOINT (and drops its CMD); args replace CMD; ``$(VAR)`` expanded."""
    command, args = container.get("command"), container.get("args")
    if command:
        argv = [*command, *(args or [])]
    else:
        argv = [*image.entrypoint, *(args if args is not None else image.cmd)]
    return [expand_refs(a, env) for a in argv]


@dataclass(frozen=True)
class Mount:
    source: str            # host path
    target: str            # path in the container
    read_only: bool = False


def mount_plan(container: dict[str, Any], volume_dirs: Mapping[str, str], extra: Sequence[Mount] = ()) -> list[Mount]:
    """The container's bind mounts, parents before children (a deeper target is mounted inside a shallower one)."""
    mounts = list(extra)
    for vm in container.get("volumeMounts") or []:
        if vm["name"] not in volume_dirs:
            raise ConfigError(f"volumeMount {vm['name']!r}: no such volume in the pod")
        src = volume_dirs[vm["name"]]
        sub = vm.get("subPath") or ""
        mounts.append(Mount(os.path.join(src, sub) if sub else src, vm["mountPath"], bool(vm.get("readOnly"))))
    return sorted(mounts, key=lambda m: len([p for p in m.target.split("/") if p]))


def keep_under_tmp(paths: Sequence[str], mounted: set[str] | frozenset[str] = frozenset()) -> list[Mount]:
    """Bind mounts that keep the outermost of ``paths`` lying under /tmp visible at the same place inside a
    container whose /tmp is covered (its private /tmp, or a volume mounted there), each once, none inside
    another, none where a volume already sits."""
    tmp = {r for r in (Path(p).resolve() for p in paths) if r.is_relative_to("/tmp") and r.exists()}
    outer = sorted(str(r) for r in tmp if not any(r != q and r.is_relative_to(q) for q in tmp))
    return [Mount(p, p) for p in outer if p not in mounted]


def mountpoint_on_host(mounts: Sequence[Mount], index: int) -> str:
    """Where mount ``index``'s target must exist before it is mounted: inside an earlier mount's source
    when an earlier target contains it, else on the host itself."""
    target = mounts[index].target.rstrip("/") or "/"
    for m in reversed(mounts[:index]):
        parent = m.target.rstrip("/")
        if parent and target.startswith(parent + "/"):
            return os.path.join(m.source, target[len(parent) + 1:])
    return target


def hosts_text(services: Sequence[dict[str, Any]], statefulsets: Sequence[dict[str, Any]],
               pods: Sequence[dict[str, Any]], own_hostname: str, address: str = LOOPBACK) -> str:
    """/etc/hosts for a pod: every Service and StatefulSet/subdomain pod name resolves to ``address``, a
    loopback address (the kubelet's own one in 127/8, so two boxes on one machine do not share ports)."""
    lines = ["# the box's process kubelet: no cluster network, every Service and pod is on " + address,
             f"{LOOPBACK}\tlocalhost {own_hostname}", "::1\tlocalhost ip6-localhost ip6-loopback"]

    def add(names: list[str]) -> None:
        lines.append(f"{address}\t" + " ".join(names))

    for s in sorted(services, key=lambda s: (s["metadata"]["namespace"], s["metadata"]["name"])):
        n, ns = s["metadata"]["name"], s["metadata"]["namespace"]
        add([f"{n}.{ns}.svc.cluster.local", f"{n}.{ns}.svc", f"{n}.{ns}", n])
    members = set()
    for st in statefulsets:
        spec, ns = st.get("spec") or {}, st["metadata"]["namespace"]
        if spec.get("serviceName"):
            members |= {(f"{st['metadata']['name']}-{i}", spec["serviceName"], ns)
                        for i in range(int(spec.get("replicas", 1) or 0))}
    for p in pods:
        spec = p.get("spec") or {}
        if spec.get("subdomain"):
            members.add((spec.get("hostname") or p["metadata"]["name"], spec["subdomain"], p["metadata"]["namespace"]))
    for host, sub, ns in sorted(members):
        add([f"{host}.{sub}.{ns}.svc.cluster.local", f"{host}.{sub}.{ns}.svc", f"{host}.{sub}.{ns}"])
    return "\n".join(lines) + "\n"


def downward_files(items: Sequence[dict[str, Any]], pod: dict[str, Any], container: dict[str, Any] | None = None
                   ) -> dict[str, str]:
    """A downwardAPI volume's files (path → text)."""
    out = {}
    for it in items:
        if "fieldRef" in it:
            out[it["path"]] = field_ref(pod, it["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in it:
            kind, _, name = it["resourceFieldRef"]["resource"].partition(".")
            out[it["path"]] = str((((container or {}).get("resources") or {}).get(kind) or {}).get(name, "0"))
    return out


def standin_key(pod: dict[str, Any]) -> str:
    """What attempts of one Argo task share: the workflow and the node name without its retry suffix ``(n)``."""
    meta = pod["metadata"]
    node = (meta.get("annotations") or {}).get(NODE_NAME_ANNOTATION) or re.sub(r"-\d+$", "", meta["name"])
    wf = (meta.get("labels") or {}).get(WORKFLOW_LABEL, "")
    return f"{meta['namespace']}/{wf}/{RETRY_SUFFIX.sub('', node)}"


def task_path(pod: dict[str, Any]) -> str:
    """The Argo task's path in the workflow, as the UI nests it: ``sglang/smoke`` for node ``<wf>.sglang.smoke(1)``."""
    meta = pod["metadata"]
    node = (meta.get("annotations") or {}).get(NODE_NAME_ANNOTATION, "")
    wf = (meta.get("labels") or {}).get(WORKFLOW_LABEL, "")
    if wf and node.startswith(wf + "."):
        node = node[len(wf) + 1:]
    return RETRY_SUFFIX.sub("", node).replace(".", "/")


def standin_behaviours(standins: Mapping[str, Sequence[dict[str, Any]]], pod: dict[str, Any]
                       ) -> tuple[str, Sequence[dict[str, Any]]] | None:
    """(step, behaviours) when the pod's task path (``sglang/smoke``), task name (``smoke``) or step label is
    in the table, in that order."""
    step = (pod["metadata"].get("labels") or {}).get(STEP_LABEL)
    path = task_path(pod)
    for key in (path, path.rsplit("/", 1)[-1], step):
        if key and key in standins:
            return (step or key), standins[key]
    return None


def choose_behaviour(behaviours: Sequence[dict[str, Any]], attempt: int) -> dict[str, Any]:
    """The attempt's behaviour (0-based); the last one repeats."""
    if not behaviours:
        return {}
    return dict(behaviours[min(attempt, len(behaviours) - 1)])


def _flag(argv: Sequence[str], name: str) -> str | None:
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def standin_argv(argv: Sequence[str], python: str, script: str, step: str, behaviour: dict[str, Any]) -> list[str]:
    """Replace the command after the emissary's ``--`` (the whole argv without one) by the stand-in."""
    head, tail = (list(argv[:argv.index("--") + 1]), list(argv[argv.index("--") + 1:])) if "--" in argv \
        else ([], list(argv))
    if behaviour.get("measure") in ("stand-in", "runner"):    # the real step (runner), part stood in (standin.py)
        return head + [python, script, "measured", "--behaviour", json.dumps(behaviour, sort_keys=True), "--", *tail]
    out = _flag(tail, "--out") or f"/tmp/standin-{step}"
    return head + [python, script, "step", "--step", step, "--out", out, "--behaviour",
                   json.dumps(behaviour, sort_keys=True)]


def engine_argv(pod: dict[str, Any], container: dict[str, Any], python: str, script: str,
                behaviour: dict[str, Any] | None = None, host: str = LOOPBACK) -> list[str]:
    """The stand-in engine for one rank: the container's http port, the rank from the pod's ordinal,
    the served name from the engine's own argv; a behaviour with ``exit`` makes it exit after ``after_s``."""
    ports = container.get("ports") or []
    port = next((p["containerPort"] for p in ports if p.get("name") == "http"), ports[0]["containerPort"] if ports
                else 8000)
    suffix = pod["metadata"]["name"].rsplit("-", 1)[-1]
    rank = int(suffix) if suffix.isdigit() else 0
    text = " ".join([*(container.get("command") or []), *(container.get("args") or [])])
    m = re.search(r"--served-model-name[= ]+(\S+)", text)
    name = shlex.split(m.group(1))[0] if m else "model"
    argv = [python, script, "engine", "--port", str(port), "--rank", str(rank), "--served-name", name]
    argv += ["--host", host] if host != LOOPBACK else []
    return argv + ["--behaviour", json.dumps(behaviour, sort_keys=True)] if behaviour else argv


@dataclass
class ContainerRun:
    """One container's state as the kubelet reports it."""

    name: str
    image: str
    init: bool = False
    state: str = "waiting"            # waiting | running | terminated
    reason: str = "ContainerCreating"
    message: str = ""
    started_at: str | None = None
    finished_at: str | None = None
    exit_code: int | None = None
    restart_count: int = 0
    last: dict[str, Any] | None = None
    container_id: str = ""

    def terminated(self) -> dict[str, Any]:
        t = {"exitCode": self.exit_code, "reason": self.reason, "startedAt": self.started_at,
             "finishedAt": self.finished_at, "containerID": self.container_id}
        if self.message:
            t["message"] = self.message
        return t

    @property
    def ever_ran(self) -> bool:
        return self.started_at is not None or self.restart_count > 0


def container_status(c: ContainerRun) -> dict[str, Any]:
    if c.state == "running":
        state: dict[str, Any] = {"running": {"startedAt": c.started_at}}
    elif c.state == "terminated":
        state = {"terminated": c.terminated()}
    else:
        state = {"waiting": {"reason": c.reason, **({"message": c.message} if c.message else {})}}
    out = {"name": c.name, "image": c.image, "imageID": c.image if "@" in c.image else f"box://{c.image}",
           "state": state, "lastState": {"terminated": c.last} if c.last else {}, "ready": c.state == "running",
           "restartCount": c.restart_count, "started": c.state == "running"}
    if c.container_id:
        out["containerID"] = c.container_id
    return out


def pod_phase(restart_policy: str, inits: Sequence[ContainerRun], mains: Sequence[ContainerRun]) -> str:
    """The kubelet's phase rules for the box's cases (no sidecar init containers)."""
    if any(c.state == "terminated" and c.exit_code != 0 for c in inits) and restart_policy == "Never":
        return "Failed"
    if any(not c.ever_ran for c in mains):
        return "Pending"
    if all(c.state == "terminated" for c in mains):
        failed = any(c.exit_code != 0 for c in mains)
        if restart_policy == "Never":
            return "Failed" if failed else "Succeeded"
        if restart_policy == "OnFailure" and not failed:
            return "Succeeded"
    return "Running"


def _condition(kind: str, ok: bool, reason: str = "", now: str = "") -> dict[str, Any]:
    c = {"type": kind, "status": "True" if ok else "False", "lastTransitionTime": now, "lastProbeTime": None}
    if reason and not ok:
        c["reason"] = reason
    return c


def pod_status(phase: str, inits: Sequence[ContainerRun], mains: Sequence[ContainerRun], start_time: str,
               now: str, reason: str = "", message: str = "") -> dict[str, Any]:
    """The status subresource the kubelet writes: phase, IPs, conditions, container statuses."""
    initialized = all(c.state == "terminated" and c.exit_code == 0 for c in inits)
    ready = phase == "Running" and all(c.state == "running" for c in mains)
    not_ready = "PodCompleted" if phase in ("Succeeded", "Failed") else "ContainersNotReady"
    status: dict[str, Any] = {
        "phase": phase, "podIP": LOOPBACK, "podIPs": [{"ip": LOOPBACK}], "hostIP": LOOPBACK,
        "hostIPs": [{"ip": LOOPBACK}], "startTime": start_time,
        "conditions": [_condition("PodReadyToStartContainers", True, now=now),
                       _condition("Initialized", initialized, "ContainersNotInitialized", now),
                       _condition("Ready", ready, not_ready, now), _condition("ContainersReady", ready, not_ready, now),
                       _condition("PodScheduled", True, now=now)],
        "containerStatuses": [container_status(c) for c in mains],
    }
    if inits:
        status["initContainerStatuses"] = [container_status(c) for c in inits]
    if reason:
        status["reason"] = reason
    if message:
        status["message"] = message
    return status
