"""The control plane in a box: real etcd, kube-apiserver, kube-controller-manager, kube-scheduler and Argo's controller.

Everything listens on 127.0.0.1 only (but for one thing we cannot change: Argo's
workflow-controller serves its health check on ``:6060``, hard-coded in v4.0.5's
``cmd/workflow-controller/main.go``), runs as child processes in their own process
groups, and keeps its state in a temporary directory that :meth:`ControlPlane.stop`
removes. Argo v4.0.5 has published security advisories: it is used here in tests,
on loopback, never exposed.

- etcd: ``go.etcd.io/etcd/server/v3``'s embedded server (``tests/box/k8s/etcd``).
- kube-apiserver: ``k8s.io/kubernetes/cmd/kube-apiserver`` with ``--authorization-mode=RBAC``,
  a serving certificate from our own CA, a static admin token (group ``system:masters``)
  and service-account tokens signed by a key of the box (the TokenRequest API works, so
  pods authenticate as their service account and RBAC decides).
- kube-controller-manager: the controllers the gates rely on (StatefulSet, Job, garbage
  collector, namespace, service-account, root CA publisher, PersistentVolume binder, node
  lifecycle: it lifts the ``node.kubernetes.io/not-ready`` taint the API server puts on every new
  Node once the kubelet reports Ready), leader election off.
- kube-scheduler: ``k8s.io/kubernetes/cmd/kube-scheduler`` at the API server's pin, with the default
  profile (every default plugin: NodeAffinity, TaintToleration, NodeResourcesFit on ``nvidia.com/gpu``,
  NodePorts, InterPodAffinity, VolumeBinding, DefaultPreemption), leader election off, no serving port.
  It authenticates as ``system:kube-scheduler`` (its own token and kubeconfig, ``scheduler.kubeconfig``),
  so the API server's bootstrap RBAC role for the scheduler decides what it may do, as on a cluster.
- Argo: ``workflow-controller`` (executor image ``quay.io/argoproj/argoexec:<version>``, which
  the process kubelet maps to the box's own ``argoexec``), Argo's full CRDs from the same
  module, server-side applied, and the ``argo`` CLI for submit/stop/terminate/lint.

No kubelet or kube-proxy runs here: :mod:`box.kubelet` registers the Nodes and runs the pods the
scheduler bound to them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3
import yaml

from box.build import Binaries, ensure_built

__all__ = ["ControlPlane", "BoxError", "ARGO_NAMESPACE", "KCM_CONTROLLERS"]

ARGO_NAMESPACE = "argo"
ADMIN_TOKEN = "gauntlet-box-admin"
SCHEDULER_TOKEN = "gauntlet-box-scheduler"
SCHEDULER_USER = "system:kube-scheduler"          # the user the bootstrap ClusterRoleBinding names
KCM_CONTROLLERS = ("statefulset", "job", "garbage-collector-controller", "namespace", "serviceaccount",
                   "root-ca-certificate-publisher-controller", "ttl-after-finished", "replicaset", "endpointslice",
                   "persistentvolume-binder-controller", "node-lifecycle-controller")
# Argo's requeue and pod-status timings, shortened through the environment variables its
# controller reads (configuration, not a patch). The requeue is a fixed wait between two reconciles of a workflow,
# so each step of a serial DAG waits up to that long for the next: 1 s is the floor Argo's own comment sets
# (rate_limiters.go: lower, and the informer is unlikely to be up to date).
ARGO_ENV = {"LEADER_ELECTION_DISABLE": "true", "DEFAULT_REQUEUE_TIME": "1s", "RECENTLY_STARTED_POD_DURATION": "2s",
            "ARGO_PROGRESS_PATCH_TICK_DURATION": "0", "INFORMER_WRITE_BACK": "true"}


# The box shares two cores with the rest of the suite: an API server starved for a while answers late, not never.
# A connection (the TLS handshake included) is tried again on every method; a read only on the methods urllib3
# deems idempotent (a POST is never sent twice). What still fails raises urllib3's MaxRetryError, naming the URL.
_RETRIES = urllib3.Retry(total=None, connect=5, read=2, status=0, other=0, redirect=False, backoff_factor=1.0,
                         raise_on_status=False)
_TIMEOUT = urllib3.Timeout(connect=30, read=60)


class BoxError(RuntimeError):
    """The box did not come up; the message names the component and the tail of its log."""


def _die_with_parent() -> None:
    """In the child: SIGKILL when the process that started the box dies (a killed pytest leaks nothing)."""
    import ctypes
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)        # PR_SET_PDEATHSIG


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _openssl(*args: str, cwd: Path) -> None:
    r = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if r.returncode:
        raise BoxError(f"openssl {args[0]} failed: {r.stderr.strip()[-300:]}")


def make_pki(d: Path) -> None:
    """A CA, a serving certificate for 127.0.0.1/localhost/kubernetes.default.svc, a service-account key."""
    d.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "30",
             "-subj", "/CN=gauntlet-box-ca", cwd=d)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "apiserver.key", "-out", "apiserver.csr",
             "-subj", "/CN=kube-apiserver", cwd=d)
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,"
                               "DNS:kubernetes.default,DNS:kubernetes.default.svc,"
                               "DNS:kubernetes.default.svc.cluster.local\n")
    _openssl("x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "apiserver.crt", "-days", "30", "-extfile", "san.ext", cwd=d)
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=d)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)


@dataclass
class _Proc:
    name: str
    popen: subprocess.Popen
    log: Path


@dataclass
class ControlPlane:
    """Start with :meth:`start` (or as a context manager); everything stops with :meth:`stop`."""

    workdir: Path | None = None
    argo_config: dict[str, Any] = field(default_factory=dict)   # workflow-controller-configmap's config
    binaries: Binaries | None = None
    port: int = 0
    procs: list[_Proc] = field(default_factory=list)
    _own_workdir: bool = False

    # ---- addresses and credentials ----
    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca_file(self) -> Path:
        return self.workdir / "pki" / "ca.crt"

    @property
    def admin_token(self) -> str:
        return ADMIN_TOKEN

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    @property
    def scheduler_kubeconfig(self) -> Path:
        return self.workdir / "scheduler.kubeconfig"

    @property
    def bin_dir(self) -> Path:
        return self.binaries.bin_dir

    # ---- lifecycle ----
    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self, timeout_s: float = 240) -> ControlPlane:
        t0 = time.monotonic()
        self.binaries = self.binaries or ensure_built()
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="gauntlet-box-"))
            self._own_workdir = True
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self._start(t0, timeout_s)
        except BaseException:
            self.stop()
            raise
        self.startup_s = round(time.monotonic() - t0, 1)
        return self

    def _start(self, t0: float, timeout_s: float) -> None:
        w = self.workdir
        pki = w / "pki"
        make_pki(pki)
        (w / "tokens.csv").write_text(f'{ADMIN_TOKEN},admin,admin,"system:masters"\n'
                                      f'{SCHEDULER_TOKEN},{SCHEDULER_USER},{SCHEDULER_USER}\n')
        etcd_port, peer_port = free_port(), free_port()
        etcd = self._spawn("etcd", [str(self.bin_dir / "etcd"), "-data-dir", str(w / "etcd"),
                                    "-listen-client", f"http://127.0.0.1:{etcd_port}",
                                    "-listen-peer", f"http://127.0.0.1:{peer_port}"])
        self._wait(lambda: "ready" in etcd.log.read_text(), etcd, t0 + timeout_s, "etcd ready")
        self.port = free_port()
        api = self._spawn("kube-apiserver", [
            str(self.bin_dir / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={self.port}",
            f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--token-auth-file={w / 'tokens.csv'}",
            "--authorization-mode=RBAC", "--anonymous-auth=false",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-cluster-ip-range=10.96.0.0/16", "--allow-privileged=true",
            "--enable-priority-and-fairness=false", "--profiling=false", "--v=1",
            # the "kubernetes" Service endpoints may not be a loopback address; nothing in the box uses them
            "--endpoint-reconciler-type=none",
        ])
        self._wait(lambda: self._ready("/readyz"), api, t0 + timeout_s, "kube-apiserver /readyz")
        self._write_kubeconfig(self.kubeconfig, ADMIN_TOKEN, ARGO_NAMESPACE)
        self._spawn("kube-controller-manager", [
            str(self.bin_dir / "kube-controller-manager"), f"--kubeconfig={self.kubeconfig}",
            f"--controllers={','.join(KCM_CONTROLLERS)}", "--leader-elect=false",
            f"--service-account-private-key-file={pki / 'sa.key'}", f"--root-ca-file={self.ca_file}",
            "--use-service-account-credentials=false", "--bind-address=127.0.0.1", "--secure-port=0",
            "--concurrent-statefulset-syncs=5", "--v=1",
        ])
        self._write_kubeconfig(self.scheduler_kubeconfig, SCHEDULER_TOKEN, "default")
        (w / "scheduler.yaml").write_text(yaml.safe_dump({
            "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(self.scheduler_kubeconfig)},
            "leaderElection": {"leaderElect": False}}))
        sched = self._spawn("kube-scheduler", [
            str(self.bin_dir / "kube-scheduler"), f"--config={w / 'scheduler.yaml'}", "--secure-port=0", "--v=1"])
        self._wait(lambda: "Starting Kubernetes Scheduler" in sched.log.read_text(), sched, t0 + timeout_s,
                   "kube-scheduler start")
        self._install_argo()
        ctrl = self._spawn("workflow-controller", [
            str(self.bin_dir / "workflow-controller"), f"--kubeconfig={self.kubeconfig}",
            "--namespace", ARGO_NAMESPACE, "--configmap", "workflow-controller-configmap",
            "--executor-image", self.executor_image, "--loglevel", "info"], env=ARGO_ENV)
        self._wait(lambda: "Starting Workflow Controller" in ctrl.log.read_text()
                   or "Started" in ctrl.log.read_text(), ctrl, t0 + timeout_s, "workflow-controller start")

    @property
    def executor_image(self) -> str:
        return f"quay.io/argoproj/argoexec:{self.binaries.argo_version}"

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.popen.poll() is None:
                try:
                    os.killpg(p.popen.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        for p in reversed(self.procs):
            try:
                p.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.popen.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.popen.wait()
        self.procs.clear()
        if self._own_workdir and self.workdir and not os.environ.get("GAUNTLET_BOX_KEEP"):
            shutil.rmtree(self.workdir, ignore_errors=True)

    # ---- processes ----
    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> _Proc:
        log = self.workdir / f"{name}.log"
        fh = log.open("ab")
        p = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True, env={**os.environ, **(env or {})}, cwd=self.workdir,
                             preexec_fn=_die_with_parent)
        fh.close()
        proc = _Proc(name, p, log)
        self.procs.append(proc)
        return proc

    def process(self, name: str) -> _Proc:
        return next(p for p in self.procs if p.name == name)

    def restart(self, name: str) -> None:
        """Kill a component with SIGKILL and start it again with the same arguments (fault injection)."""
        old = self.process(name)
        os.killpg(old.popen.pid, signal.SIGKILL)
        old.popen.wait()
        self.procs.remove(old)
        new = self._spawn(name, list(old.popen.args), env=ARGO_ENV if name == "workflow-controller" else None)
        self._wait(lambda: new.popen.poll() is None, new, time.monotonic() + 10, f"{name} restart")

    def _wait(self, ok: Any, proc: _Proc, deadline: float, what: str) -> None:
        while time.monotonic() < deadline:
            if proc.popen.poll() is not None:
                raise BoxError(f"{proc.name} exited {proc.popen.returncode} before {what}: "
                               + " | ".join(proc.log.read_text(errors="replace").splitlines()[-8:]))
            try:
                if ok():
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
        raise BoxError(f"timed out waiting for {what}: "
                       + " | ".join(proc.log.read_text(errors="replace").splitlines()[-8:]))

    # ---- API ----
    def _ssl(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def _pool(self) -> urllib3.PoolManager:
        """One connection pool per box (its CA): kept-alive connections, no TLS handshake per call."""
        pool = getattr(self, "_http", None)
        if pool is None:
            pool = self._http = urllib3.PoolManager(ssl_context=self._ssl(), maxsize=8)
        return pool

    def _ready(self, path: str) -> bool:
        try:
            return self.request("GET", path, retry=False)[0] == 200
        except (urllib3.exceptions.HTTPError, OSError):
            return False

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
                token: str | None = None, retry: bool = True) -> tuple[int, Any]:
        """One raw API call (admin unless `token`); returns (status, parsed JSON or text). ``retry`` False: one
        try (a readiness poll asks again itself)."""
        data = None
        if body is not None:
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        r = self._pool().request(method, self.url + path, body=data, retries=_RETRIES if retry else False,
                                 timeout=_TIMEOUT,
                                 headers={"Authorization": f"Bearer {token or ADMIN_TOKEN}",
                                          "Content-Type": content_type, "Accept": "application/json"})
        status, text = r.status, r.data.decode(errors="replace")
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    def apply(self, obj: dict[str, Any], manager: str = "gauntlet-box") -> dict[str, Any]:
        """Server-side apply one object as admin (the box's own set-up: CRDs, namespaces, fixtures)."""
        path = api_path(obj)
        status, out = self.request("PATCH", f"{path}?fieldManager={manager}&force=true", json.dumps(obj),
                                   content_type="application/apply-patch+yaml")
        if status >= 300:
            raise BoxError(f"apply {obj['kind']} {obj['metadata']['name']}: {status} {str(out)[:300]}")
        return out

    def api_client(self, token: str | None = None) -> Any:
        """A kubernetes.client.ApiClient for the box (admin unless `token`)."""
        from kubernetes import client
        cfg = client.Configuration()
        cfg.host = self.url
        cfg.ssl_ca_cert = str(self.ca_file)
        cfg.api_key = {"authorization": f"Bearer {token or ADMIN_TOKEN}"}
        return client.ApiClient(cfg)

    def _write_kubeconfig(self, path: Path, token: str, namespace: str) -> None:
        cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "box",
               "clusters": [{"name": "box", "cluster": {"server": self.url, "certificate-authority": str(self.ca_file)}}],
               "users": [{"name": "user", "user": {"token": token}}],
               "contexts": [{"name": "box", "context": {"cluster": "box", "user": "user", "namespace": namespace}}]}
        path.write_text(yaml.safe_dump(cfg))

    def create(self, obj: dict[str, Any]) -> None:
        """Create one object as admin; an existing one is left as it is (409)."""
        path = api_path(obj).rsplit("/", 1)[0]
        status, out = self.request("POST", path, obj)
        if status >= 300 and status != 409:
            raise BoxError(f"create {obj['kind']} {obj['metadata']['name']}: {status} {str(out)[:300]}")

    def _install_argo(self) -> None:
        # created, not server-side applied: the full CRDs are large and SSA's field tracking on them
        # costs tens of seconds on a loaded 2-core machine
        for f in sorted(self.binaries.crd_dir.glob("*.yaml")):
            self.create(yaml.safe_load(f.read_text()))
        deadline = time.monotonic() + 30
        for f in sorted(self.binaries.crd_dir.glob("*.yaml")):
            name = yaml.safe_load(f.read_text())["metadata"]["name"]
            while True:
                _, crd = self.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
                conds = {c["type"]: c["status"] for c in (crd.get("status") or {}).get("conditions", [])}
                if conds.get("Established") == "True":
                    break
                if time.monotonic() > deadline:
                    raise BoxError(f"CRD {name} not established after 30s")
                time.sleep(0.2)
        self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ARGO_NAMESPACE}})
        self.set_argo_config(self.argo_config)

    def set_argo_config(self, config: dict[str, Any]) -> None:
        """The workflow-controller-configmap (the controller watches it and reloads)."""
        data = {k: v if isinstance(v, str) else yaml.safe_dump(v) for k, v in config.items()}
        data.setdefault("metricsConfig", yaml.safe_dump({"enabled": False}))
        data.setdefault("telemetryConfig", yaml.safe_dump({"enabled": False}))
        self.apply({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "workflow-controller-configmap", "namespace": ARGO_NAMESPACE},
                    "data": data})

    def argo(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """The real `argo` CLI against the box (submit, stop, terminate, get, lint)."""
        return subprocess.run([str(self.bin_dir / "argo"), "--kubeconfig", str(self.kubeconfig), *args],
                              capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "ARGO_SERVER": ""})


_CLUSTER_SCOPED = {"Namespace", "Node", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                   "PersistentVolume", "PriorityClass", "ValidatingAdmissionPolicy",
                   "ValidatingAdmissionPolicyBinding"}


def api_path(obj: dict[str, Any]) -> str:
    """The REST path of one object (the kinds the box and its tests create)."""
    kind, name = obj["kind"], obj["metadata"]["name"]
    group_version = obj["apiVersion"]
    prefix = f"/api/{group_version}" if "/" not in group_version else f"/apis/{group_version}"
    plural = {"Namespace": "namespaces", "ServiceAccount": "serviceaccounts", "ConfigMap": "configmaps",
              "Secret": "secrets", "Service": "services", "Pod": "pods", "PersistentVolumeClaim":
              "persistentvolumeclaims", "PersistentVolume": "persistentvolumes", "PriorityClass": "priorityclasses", "Node": "nodes", "Role": "roles", "RoleBinding": "rolebindings",
              "ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings",
              "StatefulSet": "statefulsets", "Job": "jobs", "CustomResourceDefinition": "customresourcedefinitions",
              "WorkflowTemplate": "workflowtemplates", "CronWorkflow": "cronworkflows", "Workflow": "workflows",
              "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
              "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings"}[kind]
    if kind in _CLUSTER_SCOPED:
        return f"{prefix}/{plural}/{name}"
    return f"{prefix}/namespaces/{obj['metadata'].get('namespace', 'default')}/{plural}/{name}"
