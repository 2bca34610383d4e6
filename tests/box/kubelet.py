"""The box's process kubelet: Nodes, and the pods bound to them run as local processes, on the `kubernetes` client.

:class:`ProcessKubelet` registers a Node per name (hostname, os and arch labels, cpu/memory/pods
capacity and, on a node with GPUs, ``nvidia.com/gpu``; the node's taints; Ready, its Lease in
``kube-node-lease`` and its Ready heartbeat renewed every ``heartbeat_s``), and runs each pod
the REAL kube-scheduler bound to one of its nodes (``spec.nodeName``; :mod:`box.controlplane`
runs the scheduler, which decides taints, affinity, anti-affinity, host ports and GPU counts,
and writes ``Unschedulable`` on a pod it cannot place) as processes of this machine: init
containers in order, then every container at once, each in its own mount and PID namespace
(:mod:`box.nsexec`) with its volumes bind-mounted at their mountPaths (emptyDir, hostPath, persistentVolumeClaim, configMap, secret, downwardAPI, projected with
a real TokenRequest token), a per-pod /etc/hosts and a termination-message file. It
reports phase, conditions and container states through the ``status`` subresource,
restarts containers by restartPolicy with a back-off, enforces activeDeadlineSeconds,
and on deletion SIGTERMs, waits the grace period, SIGKILLs and finalises the delete.

Argo's pods get what Argo's executor gives them because the REAL ``argoexec`` runs:
``argoexec init`` copies itself and the template into /var/run/argo, ``argoexec emissary``
runs the step and saves its outputs, ``argoexec wait`` writes the WorkflowTaskResult with
the pod's own service-account token. Nothing here writes a WorkflowTaskResult. Gates that
need GPUs are played by ``box/standin.py``: only the command after the emissary's ``--``
changes, attempt n of a task gets the n-th behaviour of the stand-in table, and a
behaviour ``{"real": true}`` runs that attempt's real command (the first attempt of
cleanup exits 75, the second cleans for real). Engine pods
(label ``gauntlet.dev/component=engine``) run their init containers for real and a
stand-in engine (rank 0 answers /health, /v1/models, /v1/completions on 127.0.0.1);
the table's ``"engine"`` entry gives the engine containers a behaviour per start
(``{"exit": 1, "after_s": 2}``: every rank exits 1 after 2 s, as an engine that dies
while loading; with a second, empty behaviour it serves after one restart).

What a real kubelet does that this one does not:

- images: no pulls, no layers, no root filesystem; an image reference maps (through the
  constructor's table) to a PATH, an entrypoint and working dir on this machine. A
  container sees this machine's filesystem with its volumes, its own /etc/hosts and its
  own empty /tmp mounted over it. An image
  not in the table is ErrImagePull, then ImagePullBackOff, and the pod stays Pending, as
  on a real node (a real kubelet does not fail a pod for that, whatever its restartPolicy);
- cgroups and resource limits: nothing is limited or accounted, so no OOMKilled; no user
  namespaces or security contexts (everything runs as root); no native sidecars;
- networking: no pod network, CNI, kube-proxy or cluster DNS. Every pod and Service is
  127.0.0.1 through a per-pod /etc/hosts (Service names, StatefulSet pod names), rewritten
  in place as Services appear; ports are host ports, so two pods on one port collide;
- scheduling: none here; it runs only what the scheduler bound, and does not re-check a bound
  pod (a real kubelet's admission refuses a pod whose resources, host ports or taints do not fit
  the node: the scheduler has already decided those). A claim's PV hostPath is used when the
  claim is bound to one (the box binds its claims to hostPath PVs: the scheduler places no pod
  whose claim is unbound), else a per-claim dir;
- devices: ``nvidia.com/gpu`` is a number in the Node's capacity; no device plugin allocates a GPU;
- probes: none run; a running container is ready;
- volume errors (a missing hostPath Directory, a missing ConfigMap) keep the pod Pending
  and are retried, with an event, as a real kubelet's FailedMount;
- the kubelet API: :mod:`box.kubeletserver` serves only ``pods/log`` and a stream-less
  ``pods/exec`` (the command runs in the container's namespaces, the caller gets an error
  and no output); attach, port-forward, exec's streams, stats and metrics do not exist.
  That is enough for Argo's controller, which signals running pods on ``argo stop`` and
  ``argo terminate`` through ``pods/exec`` (``argoexec kill 15 1``, errors ignored): the
  step really gets SIGTERM. With ``tls=False`` there is no endpoint: ``pods/log`` answers
  500 and a stopped step runs to its end; :meth:`ProcessKubelet.logs` works either way.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from box.podplan import (GPU, HOST_PATH, LOOPBACK, ConfigError, ContainerRun, ImageKey, ImageRun, Mount,
                         choose_behaviour, container_argv, downward_files, engine_argv, find_image, hosts_text,
                         keep_under_tmp, mount_plan, mountpoint_on_host, pod_phase, pod_status, resolve_env,
                         standin_argv, standin_behaviours, standin_key)
from box.podwatch import pod_events

__all__ = ["ProcessKubelet", "ImageRun", "default_images"]

REPO = Path(__file__).resolve().parents[2]
BOX = Path(__file__).resolve().parent
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
ENGINE_LABEL = ("gauntlet.dev/component", "engine")
ENGINE_STANDIN = "engine"   # stand-in table key for the engine ranks: {"exit": N, "after_s": S} per start
TERMINAL = ("Succeeded", "Failed")
# a pod Unschedulable or stuck pulling fails the step that waits on it after this many seconds on the box
# (gauntlet.steps.backends.kubernetes.stuck; 300 on a cluster): set in the step image's env, as an image's ENV would
BOX_STUCK_GRACE_S = "20"


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# what images/steps/Dockerfile copies into /opt/gauntlet/app
IMAGE_APP = ("pyproject.toml", "README.md", "contract", "workflows", "steps", "params")


def image_app_dir(repo: Path = REPO) -> Path:
    """/opt/gauntlet/app as the step image has it: links to the project's own folders only, so an
    engine-image step's `cp -a /opt/gauntlet/app` copies what the image holds, not the venv and caches."""
    d = Path(tempfile.gettempdir()) / f"gauntlet-box-app-{hashlib.sha256(str(repo).encode()).hexdigest()[:8]}"
    d.mkdir(exist_ok=True)
    for name in IMAGE_APP:
        link = d / name
        if not link.is_symlink():
            link.symlink_to(repo / name)
    # lib/gauntlet/{workflows,steps,params}: the `gauntlet.*` namespace the Dockerfile links for engine images
    (d / "lib" / "gauntlet").mkdir(parents=True, exist_ok=True)
    for name in ("contract", "workflows", "steps", "params"):
        link = d / "lib" / "gauntlet" / name
        if not link.is_symlink():
            link.symlink_to(repo / name)
    return d


def default_images(bin_dir: str | Path, executor_image: str, repo: Path = REPO) -> dict[ImageKey, ImageRun]:
    """The box's image table: the executor image → the box's argoexec; the step images (params/images.yaml)
    → the project's venv with the repo at /opt/gauntlet/app (the step image's WORKDIR); engine images →
    host tools with the venv's python3 (their init containers run `sh`/`test`; the engine is a stand-in).
    The step image's env sets the box's short stuck-pod grace (:data:`BOX_STUCK_GRACE_S`)."""
    from gauntlet.params import load_images

    venv_bin = str(repo / ".venv" / "bin")
    argoexec = ImageRun(path=(str(bin_dir), *HOST_PATH))
    app = "/opt/gauntlet/app"
    content = str(image_app_dir(repo))
    steps = ImageRun(entrypoint=("gauntlet",), path=(venv_bin, *HOST_PATH), workdir=app,
                     env={"PYTHONUNBUFFERED": "1",
                          "PYTHONDONTWRITEBYTECODE": "1", "GAUNTLET_POD_STUCK_GRACE_S": BOX_STUCK_GRACE_S},
                     mounts={app: content})
    engine = ImageRun(path=(*HOST_PATH[:2], venv_bin, *HOST_PATH[2:]), workdir="/", mounts={app: content})
    table: dict[ImageKey, ImageRun] = {executor_image: argoexec, "quay.io/argoproj/argoexec:*": argoexec}
    for img in load_images(repo / "params" / "images.yaml").values():
        run = engine if img.engine else steps
        for ref in (img.ref, img.internal, f"{img.repository}:{img.tag}", f"{img.repository}@{img.digest}"):
            table[ref] = run
    return table


class _Guarded(threading.Thread):
    """A daemon thread whose exceptions are logged and kept, never lost."""

    def __init__(self, kubelet: ProcessKubelet, name: str, fn: Callable[[], None]):
        super().__init__(name=name, daemon=True)
        self.kubelet, self.fn = kubelet, fn

    def run(self) -> None:
        try:
            self.fn()
        except Exception as exc:  # the whole point: record it where the lead can see it
            self.kubelet._fault(f"thread {self.name}", exc)


class _Pod:
    """One pod on this kubelet: its processes, its container states, its status reports."""

    def __init__(self, kubelet: ProcessKubelet, pod: dict[str, Any]):
        self.k, self.pod = kubelet, pod
        meta, spec = pod["metadata"], pod["spec"]
        self.ns, self.name, self.uid = meta["namespace"], meta["name"], meta["uid"]
        self.dir = kubelet.workdir / "pods" / f"{self.ns}_{self.name}_{self.uid[:8]}"
        self.policy = spec.get("restartPolicy", "Always")
        self.inits = [ContainerRun(c["name"], c["image"], init=True, reason="PodInitializing")
                      for c in spec.get("initContainers") or []]
        self.mains = [ContainerRun(c["name"], c["image"],
                                   reason="PodInitializing" if self.inits else "ContainerCreating")
                      for c in spec["containers"]]
        self.procs: dict[str, subprocess.Popen] = {}
        self.lock = threading.RLock()
        self.stopping = threading.Event()
        self.start_time = now()
        self.started_mono = time.monotonic()
        self.phase, self.reason, self.message = "Pending", "", ""
        self.volumes: dict[str, str] = {}
        self.plans: dict[str, dict[str, Any]] = {}
        self.done = False
        self.thread = _Guarded(kubelet, f"pod {self.ns}/{self.name}", self._lifecycle)

    # ---- status ----
    def report(self) -> None:
        with self.lock:
            if self.phase not in TERMINAL:
                self.phase = pod_phase(self.policy, self.inits, self.mains)
            status = pod_status(self.phase, self.inits, self.mains, self.start_time, now(), self.reason, self.message)
            self.k._patch_pod_status(self.ns, self.name, status)

    def _set(self, c: ContainerRun, **fields: Any) -> None:
        with self.lock:
            for k, v in fields.items():
                setattr(c, k, v)
        self.report()

    # ---- lifecycle ----
    def _lifecycle(self) -> None:
        try:
            self.report()
            if not self._prepare_volumes():
                return
            specs = {c["name"]: c for c in self.pod["spec"].get("initContainers") or []}
            for c in self.inits:
                if not self._run(c, specs[c.name]):
                    return
            specs = {c["name"]: c for c in self.pod["spec"]["containers"]}
            workers = [_Guarded(self.k, f"container {self.name}/{c.name}", lambda c=c: self._run(c, specs[c.name]))
                       for c in self.mains]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
        finally:
            self.done = True
            if not self.k.stopping.is_set():
                self.report()
            # Every Argo pod's emptyDir holds a ~150 MB copy of argoexec: a finished pod's volumes are
            # reclaimed at once (a real kubelet waits for the pod's deletion), so a session's disk stays bounded.
            if not os.environ.get("GAUNTLET_BOX_KEEP"):
                shutil.rmtree(self.dir / "volumes", ignore_errors=True)
            self.k._wake.set()

    def _prepare_volumes(self) -> bool:
        delay = self.k.backoff_s[0]
        while not self.stopping.is_set():
            try:
                self.volumes = self.k._materialise_volumes(self)
                return True
            except (ConfigError, OSError) as exc:
                msg = f"MountVolume.SetUp failed: {exc}"
                self.k._event(self.pod, "FailedMount", msg, "Warning")
                for c in self.inits[:1] or self.mains:
                    self._set(c, reason="ContainerCreating", message=msg)
                self.stopping.wait(delay)
                delay = min(delay * 2, self.k.backoff_s[1])
        return False

    def _run(self, c: ContainerRun, spec: dict[str, Any]) -> bool:
        """Run one container to its end, restarting it as restartPolicy says; True when it ended with 0."""
        delay = self.k.backoff_s[0]
        while not self.stopping.is_set():
            image = find_image(self.k.images, c.image)
            if image is None:
                msg = f'Failed to pull image "{c.image}": not in the box\'s image table'
                self.k._event(self.pod, "Failed", msg, "Warning")
                self._set(c, state="waiting", reason="ErrImagePull", message=msg)
                self.stopping.wait(delay)
                self._set(c, reason="ImagePullBackOff", message=f'Back-off pulling image "{c.image}"')
                self.stopping.wait(delay)
                delay = min(delay * 2, self.k.backoff_s[1])
                continue
            try:
                plan = self.k._container_plan(self, spec, image, c)
            except ConfigError as exc:
                self._set(c, state="waiting", reason="CreateContainerConfigError", message=str(exc))
                self.stopping.wait(delay)
                continue
            code = self._exec(c, spec, plan)
            if self.stopping.is_set():
                return False
            again = self.policy == "Always" and not c.init or (self.policy != "Never" and code != 0)
            if not again:
                return code == 0
            back = f"back-off {delay:.0f}s restarting failed container={c.name} pod={self.name}"
            self._set(c, state="waiting", reason="CrashLoopBackOff", message=back, last=c.terminated(),
                      restart_count=c.restart_count + 1, exit_code=None, started_at=None, finished_at=None)
            self.stopping.wait(delay)
            delay = min(delay * 2, self.k.backoff_s[1])
        return False

    def _exec(self, c: ContainerRun, spec: dict[str, Any], plan: dict[str, Any]) -> int:
        """Start the container's process, wait for it, record how it ended."""
        plan_file = self.dir / "plans" / f"{c.name}-{c.restart_count}.json"
        plan_file.parent.mkdir(parents=True, exist_ok=True)
        plan_file.write_text(json.dumps(plan, indent=1))
        self.plans[c.name] = plan
        log = self.k.workdir / "logs" / self.ns / self.name / self.uid[:8] / f"{c.name}.{c.restart_count}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        term = self.dir / "termination" / c.name
        term.write_text("")
        with self.lock:
            if self.stopping.is_set():
                return 137
            with open(log, "ab") as out:
                proc = subprocess.Popen([self.k.python, str(BOX / "nsexec.py"), str(plan_file)], stdout=out,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
            self.procs[c.name] = proc
        self._set(c, state="running", reason="", message="", started_at=now(), container_id=f"process://{proc.pid}")
        code = proc.wait()
        code = 128 - code if code < 0 else code
        message = term.read_text(errors="replace")[:4096] if term.exists() else ""
        if not message and code != 0 and spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            message = "\n".join(log.read_text(errors="replace").splitlines()[-80:])[-2048:]
        reason = "Completed" if code == 0 else "Error"
        self._set(c, state="terminated", exit_code=code, reason=reason, message=message, finished_at=now())
        return code

    def kill(self, grace_s: float, reason: str = "", message: str = "") -> None:
        """SIGTERM every container, wait up to grace_s, SIGKILL what is left."""
        self.stopping.set()
        with self.lock:
            if reason:
                self.phase, self.reason, self.message = "Failed", reason, message
            procs = [p for p in self.procs.values() if p.poll() is None]
        for p in procs:
            _signal(p, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for p in procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for p in procs:
            _signal(p, signal.SIGKILL)
            p.wait()

    def deadline_passed(self) -> bool:
        limit = self.pod["spec"].get("activeDeadlineSeconds")
        return limit is not None and time.monotonic() - self.started_mono > int(limit)


def own_loopback() -> str:
    """An address of 127/8 (all on the loopback interface on Linux) derived from this process's pid."""
    pid = os.getpid()
    return f"127.{100 + (pid >> 16) % 100}.{(pid >> 8) & 255}.{max(1, min(254, pid & 255))}"


def _signal(proc: subprocess.Popen, sig: int) -> None:
    """nsexec forwards SIGTERM to the container's PID 1; its death (SIGKILL) takes the whole PID namespace."""
    try:
        os.kill(proc.pid, sig)
    except ProcessLookupError:
        pass


class ProcessKubelet:
    """Nodes and local-process pods for the box (see the module docstring for what it is not).

    ``api_client``: an admin ``kubernetes.client.ApiClient``; ``nodes``: node names to register;
    ``gpus_per_node``: each node's ``nvidia.com/gpu`` capacity, ``node_gpus``: per node, instead (0: none
    advertised, as on a node without the device plugin); ``taints``: node → its ``spec.taints``;
    ``images``: image reference (exact, ``prefix*`` or predicate) → :class:`ImageRun` (:func:`default_images`);
    ``standins``: task or step name → behaviours per attempt (``{"exit", "status", "after_s", "outputs"}``, or
    ``{"real": true}`` for the real command); the key ``"engine"``: the engine containers' behaviour per start;
    ``workdir``: pods, volumes, PVC dirs (:meth:`claim_dir`), logs, stand-in attempts and ``kubelet.log`` go here;
    ``host_roots``: node → a directory standing for that node's root filesystem in hostPath volumes (two
    nodes, two model caches), a node not in it uses this machine's paths;
    ``tls``: (cert, key) of the kubelet endpoint for ``pods/log`` and ``pods/exec`` (:mod:`box.kubeletserver`);
    None: a self-signed one (an API server without ``--kubelet-certificate-authority`` does not verify it);
    False: no endpoint (``pods/log`` through the API server then answers 500);
    ``extended``: node → other extended resources it advertises (an RDMA device plugin's, a number as ``nvidia.com/gpu``);
    ``address``: the loopback address every Service and StatefulSet pod name resolves to and the stand-in
    engine listens on (default: one of 127/8 of this kubelet's own, so two boxes on one machine, whose engines
    listen on the same container port, do not collide).
    """

    def __init__(self, api_client: Any, nodes: Sequence[str], *, workdir: str | Path,
                 images: Mapping[ImageKey, ImageRun], standins: Mapping[str, Sequence[dict[str, Any]]] | None = None,
                 gpus_per_node: int = 0, node_gpus: Mapping[str, int] | None = None,
                 taints: Mapping[str, Sequence[dict[str, Any]]] | None = None,
                 cpu: str = "64", memory: str = "512Gi", max_pods: int = 110,
                 ca_file: str | None = None, python: str | None = None, resync_s: float = 2.0,
                 heartbeat_s: float = 10.0, backoff_s: tuple[float, float] = (1.0, 10.0),
                 tls: tuple[str | Path, str | Path] | None | bool = None, host_roots: Mapping[str, str | Path] | None = None,
                 address: str | None = None, extended: Mapping[str, Mapping[str, str]] | None = None):
        from kubernetes import client

        self.api = api_client
        self.core = client.CoreV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.coord = client.CoordinationV1Api(api_client)
        self.nodes = list(nodes)
        self.workdir = Path(workdir).resolve()
        self.images, self.standins = images, dict(standins or {})
        self.gpus = {n: (node_gpus or {}).get(n, gpus_per_node) for n in self.nodes}
        self.extended = {n: dict((extended or {}).get(n, {})) for n in self.nodes}   # e.g. an RDMA device plugin's
        self.taints = {n: [dict(t) for t in (taints or {}).get(n, ())] for n in self.nodes}
        self.cpu, self.memory, self.max_pods = cpu, memory, max_pods
        cfg = api_client.configuration
        self.ca_file = ca_file or cfg.ssl_ca_cert
        self.api_port = str(cfg.host.rsplit(":", 1)[-1]).strip("/") if cfg.host.count(":") > 1 else "443"
        venv_python = REPO / ".venv" / "bin" / "python"
        self.python = python or (str(venv_python) if venv_python.exists() else sys.executable)
        self.resync_s, self.heartbeat_s, self.backoff_s = resync_s, heartbeat_s, backoff_s
        self._hosts_at = 0.0
        self.pods: dict[str, _Pod] = {}
        self.started: set[str] = set()
        self.hosts_files: dict[str, Path] = {}
        self.errors: list[str] = []
        self.stopping = threading.Event()
        self._wake = threading.Event()
        self._attempts_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.log = logging.getLogger(f"box.kubelet.{id(self):x}")
        self.tls, self.server = tls, None
        self.registered_at = now()
        self.host_roots = {n: Path(r) for n, r in (host_roots or {}).items()}
        self.address = address or own_loopback()

    def set_standins(self, standins: Mapping[str, Sequence[dict[str, Any]]]) -> None:
        """Replace the stand-in table (pods started from now on use it); attempts already counted stay."""
        self.standins = dict(standins)

    def claim_dir(self, namespace: str, claim: str) -> Path:
        """Where a PersistentVolumeClaim not bound to a hostPath PV lives on this machine."""
        return self.workdir / "pvc" / namespace / claim

    # ---- life ----
    def __enter__(self) -> ProcessKubelet:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(self.workdir / "kubelet.log")
        handler.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(levelname)s %(message)s"))
        self.log.addHandler(handler)
        self.log.setLevel(logging.INFO)
        self.log.propagate = False
        if self.tls is not False:
            from box.kubeletserver import KubeletServer, self_signed_cert

            cert, key = self.tls if isinstance(self.tls, tuple) else self_signed_cert(self.workdir / "pki")
            self.server = KubeletServer(cert, key, logs=self._logs_or_none, exec_=self._exec_in).start()
        for n in self.nodes:
            self._register(n)
        for name, fn in (("heartbeat", self._heartbeat_loop), ("pod-watch", self._watch_loop),
                         ("sync", self._sync_loop)):
            t = _Guarded(self, name, fn)
            t.start()
            self._threads.append(t)
        self.log.info("started: nodes %s, api port %s, workdir %s", self.nodes, self.api_port, self.workdir)

    def stop(self, grace_s: float = 2.0) -> None:
        """Kill every process this kubelet started (SIGTERM, grace_s, SIGKILL); pods are left as they are."""
        self.stopping.set()
        self._wake.set()
        pods = list(self.pods.values())
        killers = [threading.Thread(target=p.kill, args=(grace_s,), daemon=True) for p in pods]
        for t in killers:
            t.start()
        for t in killers:
            t.join()
        for t in self._threads:
            t.join(timeout=5)
        if self.server:
            self.server.stop()
        self.log.info("stopped")

    def logs(self, namespace: str, pod: str, container: str, previous: bool = False) -> str:
        """A container's stdout+stderr (the previous instance's with previous=True), '' when none: ``kubectl logs``
        read straight from this kubelet's files (the API server's ``pods/log`` serves the same text)."""
        d = self._log_dir(namespace, pod)
        runs = sorted(d.glob(f"{container}.*.log"), key=lambda f: int(f.name.rsplit(".", 2)[-2])) if d else []
        pick = runs[-2:-1] if previous else runs[-1:]
        return pick[0].read_text(errors="replace") if pick else ""

    def _logs_or_none(self, namespace: str, pod: str, container: str, previous: bool) -> str | None:
        known = self._log_dir(namespace, pod) is not None
        return self.logs(namespace, pod, container, previous) if known else None

    def _exec_in(self, namespace: str, pod: str, container: str, argv: list[str]) -> int | None:
        """Run argv in a running container's mount and PID namespaces (nsenter); its exit code."""
        run = next((p for p in self.pods.values() if (p.ns, p.name) == (namespace, pod)), None)
        proc = run.procs.get(container) if run else None
        if not argv or proc is None or proc.poll() is not None:
            return None
        try:
            child = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0]
        except (OSError, IndexError):
            return None
        env = run.plans.get(container, {}).get("env") or {"PATH": ":".join(HOST_PATH)}
        self.log.info("exec in %s/%s/%s: %s", namespace, pod, container, argv)
        r = subprocess.run(["nsenter", "-t", child, "-m", "-p", "--", *argv], env=env, capture_output=True,
                           timeout=60)
        self.log.info("exec in %s/%s/%s: exit %s %s", namespace, pod, container, r.returncode,
                      (r.stdout + r.stderr).decode(errors="replace")[-300:])
        return r.returncode

    def _log_dir(self, ns: str, pod: str) -> Path | None:
        """The newest pod of that name's log dir (a StatefulSet pod comes back with the same name, a new uid)."""
        dirs = list((self.workdir / "logs" / ns / pod).glob("*/"))
        return max(dirs, key=lambda d: d.stat().st_mtime) if dirs else None

    def _fault(self, where: str, exc: BaseException) -> None:
        line = f"{where}: {type(exc).__name__}: {exc}"
        self.errors.append(line)
        self.log.exception(line, exc_info=exc)

    # ---- nodes ----
    def _node_status(self, name: str) -> dict[str, Any]:
        t, since = now(), self.registered_at
        cap = {"cpu": self.cpu, "memory": self.memory, "pods": str(self.max_pods)}
        if self.gpus[name]:
            cap[GPU] = str(self.gpus[name])
        cap.update(self.extended[name])
        conds = [{"type": kind, "status": "False", "reason": f"KubeletHas{ok}", "lastHeartbeatTime": t,
                  "lastTransitionTime": since} for kind, ok in (("MemoryPressure", "SufficientMemory"),
                                                             ("DiskPressure", "NoDiskPressure"),
                                                             ("PIDPressure", "SufficientPID"))]
        conds.append({"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": t,
                      "lastTransitionTime": since, "message": "the box's process kubelet is posting ready status"})
        return {"capacity": cap, "allocatable": cap, "conditions": conds,
                "addresses": [{"type": "InternalIP", "address": LOOPBACK}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": self.server.port if self.server else 0}},
                "nodeInfo": {"kubeletVersion": "v1.37.2-box", "kubeProxyVersion": "", "operatingSystem": "linux",
                             "architecture": "amd64", "containerRuntimeVersion": "process://box",
                             "osImage": "box", "kernelVersion": os.uname().release, "machineID": "", "systemUUID": "",
                             "bootID": ""}}

    def _register(self, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
        body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
                "spec": {"taints": self.taints[name]}, "status": self._node_status(name)}
        try:
            self.core.create_node(body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            self.core.patch_node(name, {"metadata": {"labels": labels}, "spec": {"taints": self.taints[name]}})
        self._heartbeat(name)

    def _heartbeat(self, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        self.core.patch_node_status(name, {"status": self._node_status(name)})
        renew = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        try:
            self.coord.patch_namespaced_lease(name, "kube-node-lease", {"spec": {"renewTime": renew,
                                                                                   "holderIdentity": name}})
        except ApiException as exc:
            if exc.status != 404:
                raise
            uid = self.core.read_node(name).metadata.uid
            self.coord.create_namespaced_lease("kube-node-lease", {
                "metadata": {"name": name, "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name,
                                                                "uid": uid}]},
                "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": renew}})

    def _heartbeat_loop(self) -> None:
        while not self.stopping.wait(self.heartbeat_s):
            for n in self.nodes:
                try:
                    self._heartbeat(n)
                except Exception as exc:  # keep beating: one failed renewal must not stop the next
                    self._fault(f"heartbeat {n}", exc)

    # ---- watching and syncing ----
    def _watch_loop(self) -> None:
        """The watch only wakes the sync loop (which lists everything itself)."""
        def rewatch(exc: Exception) -> None:   # a dropped watch is normal on shutdown; otherwise note it
            self.log.warning("pod watch: %s: %s; rewatching", type(exc).__name__, exc)
            self.stopping.wait(1)

        for _ in pod_events(self.core.list_pod_for_all_namespaces, stop=self.stopping, timeout_s=20,
                            on_error=rewatch, _request_timeout=30):
            self._wake.set()

    def _sync_loop(self) -> None:
        while not self.stopping.is_set():
            self._wake.wait(self.resync_s)
            self._wake.clear()
            if self.stopping.is_set():
                return
            try:
                self._sync()
            except Exception as exc:  # next resync retries
                self._fault("sync", exc)

    def _sync(self) -> None:
        pods = self._list(self.core.list_pod_for_all_namespaces)
        seen = {p["metadata"]["uid"] for p in pods}
        for uid, p in list(self.pods.items()):
            if uid not in seen and not p.stopping.is_set():
                self.log.info("pod %s/%s is gone: killing its processes", p.ns, p.name)
                threading.Thread(target=p.kill, args=(2.0,), daemon=True).start()
            if uid not in seen and p.done:
                self.pods.pop(uid)
                self.hosts_files.pop(uid, None)
        for pod in pods:
            if pod["spec"].get("nodeName") in self.nodes:
                self._sync_pod(pod)
        self._refresh_hosts(pods)

    def _sync_pod(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        uid, run = meta["uid"], self.pods.get(meta["uid"])
        if meta.get("deletionTimestamp"):
            if run and not run.stopping.is_set():
                grace = meta.get("deletionGracePeriodSeconds")
                grace = pod["spec"].get("terminationGracePeriodSeconds", 30) if grace is None else grace
                self._event(pod, "Killing", "Stopping containers")
                threading.Thread(target=self._terminate, args=(run, float(grace)), daemon=True).start()
            elif not run or run.done:
                self._finalise(pod)
            return
        if run:
            if run.deadline_passed() and not run.stopping.is_set():
                self._event(pod, "DeadlineExceeded", "Pod was active on the node longer than the specified deadline",
                            "Warning")
                threading.Thread(target=run.kill, args=(2.0, "DeadlineExceeded",
                                 "Pod was active on the node longer than the specified deadline"), daemon=True).start()
            return
        if uid in self.started or (pod.get("status") or {}).get("phase") in TERMINAL:
            return
        if (pod.get("status") or {}).get("phase") == "Running":   # ran under an earlier kubelet: its processes are gone
            self._patch_pod_status(meta["namespace"], meta["name"], {
                "phase": "Failed", "reason": "KubeletRestarted",
                "message": "the box's process kubelet restarted; this pod's processes are gone"})
            return
        self.started.add(uid)
        run = _Pod(self, pod)
        self.pods[uid] = run
        self.log.info("starting pod %s/%s on %s", run.ns, run.name, pod["spec"]["nodeName"])
        run.thread.start()

    def _terminate(self, run: _Pod, grace: float) -> None:
        run.kill(grace)
        run.thread.join(timeout=10)
        self._finalise(run.pod)

    def _finalise(self, pod: dict[str, Any]) -> None:
        """What a real kubelet does once the containers are gone: delete with grace 0 (this uid only)."""
        from kubernetes.client.exceptions import ApiException

        meta = pod["metadata"]
        try:
            self.core.delete_namespaced_pod(meta["name"], meta["namespace"], grace_period_seconds=0,
                                            body={"preconditions": {"uid": meta["uid"]}, "gracePeriodSeconds": 0})
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise

    # ---- volumes ----
    def _materialise_volumes(self, run: _Pod) -> dict[str, str]:
        """Each volume as a host path: emptyDir/configMap/secret/downwardAPI/projected under the pod's dir."""
        dirs: dict[str, str] = {}
        for v in run.pod["spec"].get("volumes") or []:
            name, own = v["name"], run.dir / "volumes" / v["name"]
            if "emptyDir" in v:
                own.mkdir(parents=True, exist_ok=True)
                dirs[name] = str(own)
            elif "hostPath" in v:
                root = self.host_roots.get(run.pod["spec"]["nodeName"])
                hp = v["hostPath"]
                dirs[name] = self._host_path({**hp, "path": str(root / hp["path"].lstrip("/")) if root else hp["path"]})
            elif "persistentVolumeClaim" in v:
                dirs[name] = self._claim_dir(run.ns, v["persistentVolumeClaim"]["claimName"])
            elif any(k in v for k in ("configMap", "secret", "downwardAPI", "projected")):
                self._write_files(own, self._volume_files(run, v))
                dirs[name] = str(own)
            else:
                raise ConfigError(f"volume {name!r}: type {sorted(set(v) - {'name'})} is not supported by the box")
        return dirs

    @staticmethod
    def _host_path(hp: dict[str, Any]) -> str:
        path, kind = hp["path"], hp.get("type") or ""
        if kind == "DirectoryOrCreate":
            Path(path).mkdir(parents=True, exist_ok=True)
        elif kind == "Directory" and not Path(path).is_dir():
            raise ConfigError(f"hostPath type check failed: {path} is not a directory")
        elif kind == "File" and not Path(path).is_file():
            raise ConfigError(f"hostPath type check failed: {path} is not a file")
        return path

    def _claim_dir(self, ns: str, claim: str) -> str:
        """The PV's hostPath when the claim is bound to one; else a per-claim dir under the workdir."""
        pvc = self.core.read_namespaced_persistent_volume_claim(claim, ns)
        if pvc.spec.volume_name:
            pv = self.core.read_persistent_volume(pvc.spec.volume_name)
            if pv.spec.host_path:
                return self._host_path({"path": pv.spec.host_path.path, "type": "DirectoryOrCreate"})
        d = self.claim_dir(ns, claim)
        d.mkdir(parents=True, exist_ok=True)
        return str(d)

    def _volume_files(self, run: _Pod, v: dict[str, Any]) -> dict[str, tuple[bytes, int]]:
        """path → (content, mode) of a configMap, secret, downwardAPI or projected volume."""
        sources = v["projected"].get("sources") or [] if "projected" in v else [v]
        default_mode = (v.get("projected") or v.get("configMap") or v.get("secret") or v.get("downwardAPI")
                        or {}).get("defaultMode", 0o644)
        files: dict[str, tuple[bytes, int]] = {}
        for src in sources:
            if "configMap" in src or "secret" in src:
                kind = "configMap" if "configMap" in src else "secret"
                ref = src[kind]
                name = ref.get("name") or ref.get("secretName")
                data = self._configmap(run.ns, name, binary=True) if kind == "configMap" else \
                    self._secret(run.ns, name, binary=True)
                if data is None:
                    if ref.get("optional"):
                        continue
                    raise ConfigError(f'{kind.lower()} "{name}" not found')
                items = ref.get("items") or [{"key": k, "path": k} for k in data]
                for it in items:
                    if it["key"] not in data:
                        if ref.get("optional"):
                            continue
                        raise ConfigError(f"{kind} {name}: no key {it['key']!r}")
                    files[it["path"]] = (data[it["key"]], it.get("mode", default_mode))
            elif "downwardAPI" in src:
                for path, text in downward_files(src["downwardAPI"].get("items") or [], run.pod).items():
                    files[path] = (text.encode(), default_mode)
            elif "serviceAccountToken" in src:
                t = src["serviceAccountToken"]
                files[t["path"]] = (self._token(run.pod, t.get("audience"), t.get("expirationSeconds", 3607)).encode(),
                                    default_mode)
            elif "clusterTrustBundle" in src or "podCertificate" in src:
                raise ConfigError(f"projected source {sorted(src)} is not supported by the box")
        return files

    @staticmethod
    def _write_files(root: Path, files: Mapping[str, tuple[bytes, int]]) -> None:
        for rel, (data, mode) in files.items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_bytes(data)
            os.chmod(tmp, mode)
            os.replace(tmp, path)
        root.mkdir(parents=True, exist_ok=True)

    def _configmap(self, ns: str, name: str, binary: bool = False) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            cm = self.core.read_namespaced_config_map(name, ns)
        except ApiException as exc:
            if exc.status == 404:
                return self._root_ca(name, binary)
            raise
        data: dict[str, Any] = {k: (v.encode() if binary else v) for k, v in (cm.data or {}).items()}
        if binary:
            data.update({k: base64.b64decode(v) for k, v in (cm.binary_data or {}).items()})
        return data

    def _root_ca(self, name: str, binary: bool) -> dict[str, Any] | None:
        """kube-root-ca.crt is published by kube-controller-manager; without it, the box's CA file."""
        if name != "kube-root-ca.crt" or not self.ca_file:
            return None
        pem = Path(self.ca_file).read_bytes()
        return {"ca.crt": pem if binary else pem.decode()}

    def _secret(self, ns: str, name: str, binary: bool = False) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            s = self.core.read_namespaced_secret(name, ns)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        raw = {k: base64.b64decode(v) for k, v in (s.data or {}).items()}
        return raw if binary else {k: v.decode(errors="replace") for k, v in raw.items()}

    def _token(self, pod: dict[str, Any], audience: str | None, expiration: int) -> str:
        """A real bound token from the TokenRequest API, for the pod's service account."""
        meta = pod["metadata"]
        sa = pod["spec"].get("serviceAccountName") or "default"
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"audiences": [audience] if audience else [], "expirationSeconds": max(600, expiration),
                         "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                                            "uid": meta["uid"]}}}
        resp = self.core.create_namespaced_service_account_token(sa, meta["namespace"], body, _preload_content=False)
        return json.loads(resp.data)["status"]["token"]

    # ---- containers ----
    def _container_plan(self, run: _Pod, spec: dict[str, Any], image: ImageRun, c: ContainerRun) -> dict[str, Any]:
        """argv, env, cwd and bind mounts for nsexec (the stand-in table decides the argv of stood-in steps)."""
        pod = run.pod
        base = {"PATH": ":".join(image.path), "HOSTNAME": pod["spec"].get("hostname") or run.name,
                "HOME": "/root", "LANG": "C.UTF-8", **image.env,
                "KUBERNETES_SERVICE_HOST": LOOPBACK, "KUBERNETES_SERVICE_PORT": self.api_port,
                "KUBERNETES_SERVICE_PORT_HTTPS": self.api_port,
                "KUBERNETES_PORT": f"tcp://{LOOPBACK}:{self.api_port}"}
        env = resolve_env(spec, pod, base, lambda n: self._configmap(run.ns, n), lambda n: self._secret(run.ns, n))
        argv = container_argv(spec, image, env)
        labels = pod["metadata"].get("labels") or {}
        if not c.init and labels.get(ENGINE_LABEL[0]) == ENGINE_LABEL[1]:
            # the table's "engine" entry: behaviour per start of an engine container (every pod, every restart);
            # the stand-in engine replaces the launch script, the per-rank sampler it starts included (on loopback
            # every rank's would want the same host port; the sampler is tested on its own: tests/test_telemetry.py)
            behaviour = choose_behaviour(self.standins.get(ENGINE_STANDIN) or [],
                                         self._attempt(f"{ENGINE_STANDIN}/{run.ns}/{run.name}/{c.name}",
                                                       f"{run.uid}/{c.restart_count}"))
            argv = engine_argv(pod, spec, self.python, str(BOX / "standin.py"), behaviour, self.address)
        elif c.name == "main" and (found := standin_behaviours(self.standins, pod)):
            step, behaviours = found
            behaviour = choose_behaviour(behaviours, self._attempt(standin_key(pod), run.uid))
            if not behaviour.get("real"):        # {"real": true}: this attempt runs the step itself
                argv = standin_argv(argv, self.python, str(BOX / "standin.py"), step, behaviour)
        if not argv:
            raise ConfigError(f"container {c.name}: no command and the image table gives no entrypoint")
        mounts = mount_plan(spec, run.volumes, self._extra_mounts(run, spec, image, c))
        for i, m in enumerate(mounts):
            if not os.path.exists(m.source):      # a subPath the kubelet creates on first use
                os.makedirs(m.source)
            self._ensure_mountpoint(m.source, mountpoint_on_host(mounts, i))
        return {"argv": argv, "env": env, "cwd": spec.get("workingDir") or image.workdir,
                "mounts": [[m.source, m.target, m.read_only] for m in mounts]}

    def _extra_mounts(self, run: _Pod, spec: dict[str, Any], image: ImageRun, c: ContainerRun) -> list[Mount]:
        """What the runtime and kubelet add: the image's own dirs, /etc/hosts, the termination-message file,
        a private /tmp, the service-account token (unless a volume already sits there or automount is off)."""
        hosts = run.dir / "etc-hosts"
        if not hosts.exists():
            hosts.write_text(self._hosts_text(run.name))
        self.hosts_files[run.uid] = hosts
        term = run.dir / "termination" / c.name
        term.parent.mkdir(parents=True, exist_ok=True)
        term.touch()
        extra = [Mount(src, dst) for dst, src in image.mounts.items()]
        extra += [Mount(str(hosts), "/etc/hosts"),
                  Mount(str(term), spec.get("terminationMessagePath") or "/dev/termination-log")]
        mounted = {vm["mountPath"].rstrip("/") for vm in spec.get("volumeMounts") or []}
        if "/tmp" not in mounted:     # an image's /tmp is the container's own, not shared with the host's
            tmp = run.dir / "tmp" / c.name
            tmp.mkdir(parents=True, exist_ok=True)
            os.chmod(tmp, 0o1777)
            extra.append(Mount(str(tmp), "/tmp"))
        # what the image table takes from this machine must stay visible under whatever covers /tmp, the private
        # /tmp or a volume there (Argo's wait container mounts its emptyDir at /tmp): a checkout (and its venv)
        # in /tmp, the image's app dir, a PATH entry there (argoexec's, when the box cache is under /tmp)
        extra += keep_under_tmp([str(REPO), *image.mounts.values(), *image.path], mounted)
        auto = run.pod["spec"].get("automountServiceAccountToken")
        if SA_DIR not in mounted and auto is not False:
            sa = run.dir / "serviceaccount"
            self._write_files(sa, {"token": (self._token(run.pod, None, 3607).encode(), 0o644),
                                   "namespace": (run.ns.encode(), 0o644),
                                   "ca.crt": (Path(self.ca_file).read_bytes() if self.ca_file else b"", 0o644)})
            extra.append(Mount(str(sa), SA_DIR, True))
        return extra

    @staticmethod
    def _ensure_mountpoint(source: str, where: str) -> None:
        """Create the mount point (a dir, or a file for a file source) on the host: this box runs as root."""
        if os.path.isdir(source):
            os.makedirs(where, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(where), exist_ok=True)
            if not os.path.exists(where):
                Path(where).touch()

    def _attempt(self, key: str, uid: str) -> int:
        """This pod's attempt number for its task, counted in a file so retries (and kubelets) share it."""
        with self._attempts_lock:
            path = self.workdir / "standin-attempts.json"
            seen = json.loads(path.read_text()) if path.exists() else {}
            uids = seen.setdefault(key, [])
            if uid not in uids:
                uids.append(uid)
                path.write_text(json.dumps(seen, indent=1, sort_keys=True))
            return uids.index(uid)

    def _refresh_hosts(self, pods: list[dict[str, Any]]) -> None:
        """Rewrite every running pod's /etc/hosts in place (the bind mount follows the inode, not the name)."""
        # at most once a resync: each refresh lists every service and StatefulSet, and a sync runs on every pod
        # event; a new peer's name reaches /etc/hosts within resync_s (a pod's first file is written whole)
        if not self.hosts_files or time.monotonic() - self._hosts_at < self.resync_s:
            return
        self._hosts_at = time.monotonic()
        services = self._list(self.core.list_service_for_all_namespaces)
        sets = self._list(self.apps.list_stateful_set_for_all_namespaces)
        for uid, path in list(self.hosts_files.items()):
            run = self.pods.get(uid)
            if run is None or run.done:
                self.hosts_files.pop(uid, None)
                continue
            text = hosts_text(services, sets, pods, run.name if run else "localhost", self.address)
            if path.exists() and path.read_text() != text:
                with open(path, "r+") as fh:
                    fh.write(text)
                    fh.truncate()

    def _hosts_text(self, hostname: str) -> str:
        return hosts_text(self._list(self.core.list_service_for_all_namespaces),
                          self._list(self.apps.list_stateful_set_for_all_namespaces),
                          self._list(self.core.list_pod_for_all_namespaces), hostname, self.address)

    @staticmethod
    def _list(method: Callable[..., Any]) -> list[dict[str, Any]]:
        """A list call's items as the API's own JSON (no model round trip)."""
        return json.loads(method(_preload_content=False).data)["items"]

    # ---- API writes ----
    def _patch_pod_status(self, ns: str, name: str, status: dict[str, Any]) -> None:
        from kubernetes.client.exceptions import ApiException

        if self.stopping.is_set():
            return
        try:
            self.core.patch_namespaced_pod_status(name, ns, {"status": status},
                                                  _content_type="application/merge-patch+json")
        except ApiException as exc:
            if exc.status != 404:
                self._fault(f"status of {ns}/{name}", exc)

    def _event(self, pod: dict[str, Any], reason: str, message: str, kind: str = "Normal") -> None:
        meta = pod["metadata"]
        t = now()
        body = {"metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:12]}", "namespace": meta["namespace"]},
                "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                                   "namespace": meta["namespace"], "uid": meta["uid"]},
                "reason": reason, "message": message, "type": kind, "count": 1, "firstTimestamp": t,
                "lastTimestamp": t, "source": {"component": "kubelet", "host": pod["spec"].get("nodeName") or ""}}
        try:
            self.core.create_namespaced_event(meta["namespace"], body)
        except Exception as exc:  # an event is a courtesy: never let it stop a pod
            self.log.warning("event %s on %s: %s", reason, meta["name"], exc)
