"""A small Kubernetes API double on 127.0.0.1 for the cluster back end's tests.

It implements ONLY the endpoints gauntlet's code calls, with the real paths and verbs
the kubernetes client sends, and nothing else (any other request is a 404 and is
recorded, so a test notices):

- server-side apply: ``PATCH`` with ``application/apply-patch+yaml`` (``fieldManager``,
  ``force``) on statefulsets, services, jobs (creates or replaces the applied fields);
- merge patch of ``statefulsets/{name}/scale``;
- ``GET`` one object, ``GET`` a list with an equality ``labelSelector`` (``k=v,k2=v2``),
  ``GET /api/v1/pods`` with ``fieldSelector=spec.nodeName=X``;
- ``DELETE`` statefulsets, services, jobs (their pods go with them);
- ``GET pods/{name}/log``;
- ``DELETE pods/{name}`` (the janitor, for a labelled pod with no owner);
- ``GET`` a list of Argo ``workflows`` (``argoproj.io/v1alpha1``; the janitor looks runs up by uid);
- an existence term in a ``labelSelector`` (``gauntlet.dev/run``);
- ``GET`` a list of ``events`` with ``fieldSelector=involvedObject.uid=X`` (why a controller made no pod);
- ``GET`` a Namespace, a ValidatingAdmissionPolicy and its binding by name (cluster-scoped, from ``add``).

A toy controller makes pods for StatefulSets (ordinal names, one per node listed in the
node affinity) and indexed Jobs; tests shape those pods' status and logs through
``pod_status`` and ``pod_log`` hooks, and refuse a pod through ``refuse`` (it returns the FailedCreate event
the owner then carries, as a real controller records one when the API server refuses its pod). Every request is kept in ``requests`` for the
RBAC test. It is not a Kubernetes: no watches, no resourceVersion conflicts, no
admission, no scheduling beyond the affinity list.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import uuid
from collections.abc import Callable
from http.server import ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from loopback import JsonHandler

__all__ = ["K8sDouble", "FakeEngine", "running"]

# plural -> (api prefix, kind)
RESOURCES = {
    "statefulsets": ("/apis/apps/v1", "StatefulSet"),
    "services": ("/api/v1", "Service"),
    "jobs": ("/apis/batch/v1", "Job"),
    "pods": ("/api/v1", "Pod"),
    "workflows": ("/apis/argoproj.io/v1alpha1", "Workflow"),
    "events": ("/api/v1", "Event"),
}
# cluster-scoped: path -> kind (GET by name only)
CLUSTER = {"/api/v1/namespaces": "Namespace",
           "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies": "ValidatingAdmissionPolicy",
           "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings": "ValidatingAdmissionPolicyBinding"}
_PATH = re.compile(r"^(?P<prefix>/api/v1|/apis/apps/v1|/apis/batch/v1|/apis/argoproj.io/v1alpha1)/namespaces/(?P<ns>[^/]+)/(?P<plural>[a-z]+)"
                   r"(?:/(?P<name>[^/]+)(?:/(?P<sub>[a-z]+))?)?$")


def running(pod: dict[str, Any]) -> dict[str, Any]:
    """Default pod status: Running and ready."""
    names = [c["name"] for c in pod["spec"].get("containers", [])]
    return {"phase": "Running", "containerStatuses": [
        {"name": n, "ready": True, "restartCount": 0, "state": {"running": {}}} for n in names]}


def _matches(labels: dict[str, str], selector: str | None) -> bool:
    if not selector:
        return True
    for term in selector.split(","):
        k, eq, v = term.partition("=")
        if not eq:
            if k.startswith("!"):                # a non-existence term: `!key`
                if k[1:] in labels:
                    return False
            elif k not in labels:                # an existence term: `key`
                return False
        elif labels.get(k) != v:
            return False
    return True


def _deep_merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


class K8sDouble:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}   # (plural, ns, name) -> object
        self.requests: list[tuple[str, str, dict[str, list[str]], str]] = []
        self.pod_status: Callable[[dict[str, Any]], dict[str, Any]] = running
        self.pod_log: Callable[[dict[str, Any], str | None], str] = lambda pod, container: f"log of {pod['metadata']['name']}\n"
        # (owner object, pod name) -> None to create the pod, or the FailedCreate event its owner gets instead
        self.refuse: Callable[[dict[str, Any], str], dict[str, Any] | None] = lambda owner, pod: None
        self.cluster: dict[tuple[str, str], dict[str, Any]] = {}          # (kind, name) -> cluster-scoped object
        self.unserved: set[str] = set()     # CLUSTER paths answered as an API server without them (before 1.30)
        self.lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None

    # --- test-side helpers -------------------------------------------------------------------
    def add(self, obj: dict[str, Any]) -> None:
        """Put an object in as someone else would have created it (e.g. another team's StatefulSet)."""
        m = obj["metadata"]
        if obj["kind"] in CLUSTER.values():
            with self.lock:
                self.cluster[(obj["kind"], m["name"])] = self._stamp(copy.deepcopy(obj))
            return
        plural = {v[1]: k for k, v in RESOURCES.items()}[obj["kind"]]
        with self.lock:
            self.objects[(plural, m["namespace"], m["name"])] = self._stamp(copy.deepcopy(obj))
            self.reconcile()

    def get(self, plural: str, ns: str, name: str) -> dict[str, Any] | None:
        return self.objects.get((plural, ns, name))

    def names(self, plural: str, ns: str | None = None) -> list[str]:
        return sorted(n for (p, s, n) in self.objects if p == plural and (ns is None or s == ns))

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> K8sDouble:
        double = self

        class Handler(JsonHandler):

            def _handle(self) -> None:
                u = urlparse(self.path)
                q = parse_qs(u.query)
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                ctype = self.headers.get("Content-Type", "")
                with double.lock:
                    double.requests.append((self.command, u.path, q, ctype))
                    code, body, rtype = double.dispatch(self.command, u.path, q, ctype, raw)
                self._send(code, body, rtype)

            do_GET = do_PATCH = do_DELETE = do_POST = do_PUT = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()

    # --- the API -------------------------------------------------------------------------------
    @staticmethod
    def _status(code: int, reason: str, message: str) -> tuple[int, dict[str, Any], str]:
        return code, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                      "reason": reason, "code": code}, "application/json"

    def _stamp(self, obj: dict[str, Any], manager: str | None = None) -> dict[str, Any]:
        m = obj.setdefault("metadata", {})
        m.setdefault("uid", str(uuid.uuid4()))
        m.setdefault("creationTimestamp", "2026-12-02T00:00:00Z")
        m["resourceVersion"] = str(int(m.get("resourceVersion", "0")) + 1)
        if manager:
            m["managedFields"] = [{"manager": manager, "operation": "Apply"}]
        return obj

    def dispatch(self, method: str, path: str, q: dict[str, list[str]], ctype: str, raw: bytes
                 ) -> tuple[int, Any, str]:
        if method == "GET" and path == "/api/v1/pods":
            field = (q.get("fieldSelector") or [""])[0]
            node = field.removeprefix("spec.nodeName=") if field.startswith("spec.nodeName=") else None
            items = [o for (p, _, _), o in sorted(self.objects.items()) if p == "pods"
                     and (node is None or o["spec"].get("nodeName") == node)]
            return 200, {"kind": "PodList", "apiVersion": "v1", "items": items}, "application/json"
        base, _, cname = path.rpartition("/")
        if base in self.unserved:
            return 404, "404 page not found\n", "text/plain"
        if method == "GET" and base in CLUSTER:
            found = self.cluster.get((CLUSTER[base], cname))
            if found is None:
                return self._status(404, "NotFound", f"{base.rsplit('/', 1)[1]} \"{cname}\" not found")
            return 200, found, "application/json"
        m = _PATH.match(path)
        if not m or m["plural"] not in RESOURCES or RESOURCES[m["plural"]][0] != m["prefix"]:
            return self._status(404, "NotFound", f"the double does not serve {method} {path}")
        plural, ns, name, sub = m["plural"], m["ns"], m["name"], m["sub"]
        kind = RESOURCES[plural][1]
        key = (plural, ns, name)
        if name is None:
            if method != "GET":
                return self._status(405, "MethodNotAllowed", f"{method} on a collection is not served")
            sel = (q.get("labelSelector") or [None])[0]
            field = (q.get("fieldSelector") or [""])[0]
            uid = field.removeprefix("involvedObject.uid=") if field.startswith("involvedObject.uid=") else None
            items = [o for (p, s, _), o in sorted(self.objects.items()) if p == plural and s == ns
                     and _matches(o["metadata"].get("labels") or {}, sel)
                     and (uid is None or (o.get("involvedObject") or {}).get("uid") == uid)]
            return 200, {"kind": f"{kind}List", "apiVersion": "v1", "items": items}, "application/json"
        obj = self.objects.get(key)
        if sub == "log" and plural == "pods" and method == "GET":
            if obj is None:
                return self._status(404, "NotFound", f"pods \"{name}\" not found")
            return 200, self.pod_log(obj, (q.get("container") or [None])[0]), "text/plain"
        if sub == "scale" and plural == "statefulsets" and method == "PATCH":
            if obj is None:
                return self._status(404, "NotFound", f"statefulsets.apps \"{name}\" not found")
            patch = json.loads(raw or b"{}")
            obj["spec"]["replicas"] = int(patch["spec"]["replicas"])
            self._stamp(obj)
            self.reconcile()
            return 200, {"kind": "Scale", "apiVersion": "autoscaling/v1", "metadata": {"name": name, "namespace": ns},
                         "spec": {"replicas": obj["spec"]["replicas"]}}, "application/json"
        if sub is not None:
            return self._status(404, "NotFound", f"the double does not serve {method} {path}")
        if method == "GET":
            if obj is None:
                return self._status(404, "NotFound", f"{plural} \"{name}\" not found")
            return 200, obj, "application/json"
        if method == "PATCH":
            if not ctype.startswith("application/apply-patch"):
                return self._status(415, "UnsupportedMediaType", f"only server-side apply is served, got {ctype}")
            if not q.get("fieldManager"):
                return self._status(400, "BadRequest", "fieldManager is required for apply patch")
            body = json.loads(raw)
            if body.get("kind") != kind or body["metadata"].get("name") != name:
                return self._status(400, "BadRequest", "kind/name in the body do not match the path")
            created = obj is None
            if created:
                new = copy.deepcopy(body)
            else:
                new = copy.deepcopy(obj)
                new["metadata"] = _deep_merge(obj["metadata"], body["metadata"])
                new["spec"] = copy.deepcopy(body.get("spec", {}))
            self.objects[key] = self._stamp(new, q["fieldManager"][0])
            self.reconcile()
            return (201 if created else 200), self.objects[key], "application/json"
        if method == "DELETE":
            if obj is None:
                return self._status(404, "NotFound", f"{plural} \"{name}\" not found")
            del self.objects[key]
            self.reconcile()
            return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success"}, "application/json"
        return self._status(405, "MethodNotAllowed", f"{method} not served")

    # --- a toy controller -----------------------------------------------------------------------
    def _nodes_of(self, template: dict[str, Any]) -> list[str]:
        try:
            terms = template["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
                "nodeSelectorTerms"]
            return list(terms[0]["matchExpressions"][0]["values"])
        except (KeyError, IndexError, TypeError):
            return []

    def _make_pod(self, ns: str, name: str, template: dict[str, Any], extra_labels: dict[str, str], node: str | None,
                  owner: tuple[str, str]) -> None:
        key = ("pods", ns, name)
        if key in self.objects:
            return
        owner_obj = self.objects.get(({"StatefulSet": "statefulsets", "Job": "jobs"}[owner[0]], ns, owner[1]))
        event = self.refuse(owner_obj, name) if owner_obj is not None else None
        if event is not None:           # the API server refused the pod: its owner carries the controller's event
            ev = copy.deepcopy(event)
            ev.setdefault("metadata", {}).update(name=f"{owner[1]}.failedcreate", namespace=ns)
            ev["involvedObject"] = {"kind": owner[0], "name": owner[1], "namespace": ns,
                                    "uid": owner_obj["metadata"]["uid"]}
            self.objects[("events", ns, ev["metadata"]["name"])] = ev
            return
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": ns,
                            "labels": {**(template.get("metadata", {}).get("labels") or {}), **extra_labels},
                            "ownerReferences": [{"kind": owner[0], "name": owner[1]}]},
               "spec": {**copy.deepcopy(template.get("spec", {})), "nodeName": node}}
        pod["status"] = self.pod_status(pod)
        self.objects[key] = self._stamp(pod)

    def reconcile(self) -> None:
        owners = {(o["kind"], s, n) for (p, s, n), o in self.objects.items() if p in ("statefulsets", "jobs")}
        for (p, s, n), pod in list(self.objects.items()):     # garbage-collect orphaned pods
            if p == "pods" and pod["metadata"].get("ownerReferences"):
                ref = pod["metadata"]["ownerReferences"][0]
                if (ref["kind"], s, ref["name"]) not in owners:
                    del self.objects[(p, s, n)]
        for (p, ns, name), o in list(self.objects.items()):
            if p == "statefulsets":
                want = int(o["spec"].get("replicas", 1))
                nodes = self._nodes_of(o["spec"]["template"])
                for i in range(want):
                    self._make_pod(ns, f"{name}-{i}", o["spec"]["template"],
                                   {"statefulset.kubernetes.io/pod-name": f"{name}-{i}",
                                    "apps.kubernetes.io/pod-index": str(i)},
                                   nodes[i] if i < len(nodes) else None, ("StatefulSet", name))
                for (pp, s, pn) in list(self.objects):
                    if pp == "pods" and s == ns and re.fullmatch(rf"{re.escape(name)}-(\d+)", pn) \
                            and int(pn.rsplit("-", 1)[1]) >= want:
                        del self.objects[(pp, s, pn)]
                pods = [x for i in range(want) if (x := self.objects.get(("pods", ns, f"{name}-{i}")))]
                o["status"] = {"replicas": want,
                               "readyReplicas": sum(1 for x in pods if x["status"].get("phase") == "Running")}
            elif p == "jobs":
                n = int(o["spec"].get("completions", 1))
                nodes = self._nodes_of(o["spec"]["template"])
                for i in range(n):
                    self._make_pod(ns, f"{name}-{i}-x{i}", o["spec"]["template"],
                                   {"batch.kubernetes.io/job-completion-index": str(i), "job-name": name},
                                   nodes[i] if i < len(nodes) else None, ("Job", name))
                pods = [x for (pp, s, _), x in self.objects.items() if pp == "pods" and s == ns
                        and (x["metadata"].get("ownerReferences") or [{}])[0].get("name") == name]
                o["status"] = {"succeeded": sum(1 for x in pods if x["status"].get("phase") == "Succeeded"),
                               "failed": sum(1 for x in pods if x["status"].get("phase") == "Failed")}


class FakeEngine:
    """An OpenAI-ish engine on loopback: /health and a one-token /v1/completions (what readiness asks)."""

    def __init__(self, healthy: bool = True) -> None:
        self.healthy = healthy
        self.calls: list[str] = []
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeEngine:
        eng = self

        class Handler(JsonHandler):

            def do_GET(self) -> None:
                eng.calls.append(f"GET {self.path}")
                self._send(200 if eng.healthy and self.path == "/health" else 503, {})

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                req = json.loads(self.rfile.read(n) or b"{}")
                eng.calls.append(f"POST {self.path} max_tokens={req.get('max_tokens')}")
                self._send(200, {"id": "c", "object": "text_completion", "model": req.get("model"),
                                 "choices": [{"index": 0, "text": " Hello", "finish_reason": "length"}],
                                 "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()
