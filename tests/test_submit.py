"""`gauntlet submit`: dry-run commands, and create-then-update through Hera's WorkflowsService.

No Argo server runs here: `ArgoDouble` implements only the six endpoints submit
uses (create/get/update for workflow templates and cron workflows), answering 409
on a second create as the real server does.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import ThreadingHTTPServer

import pytest
from loopback import JsonHandler


class _Handler(JsonHandler):
    store: dict = {}
    calls: list = []

    def _parts(self):
        parts = self.path.split("?")[0].strip("/").split("/")  # api v1 <kind> <ns> [name]
        return parts[2], parts[3], parts[4] if len(parts) > 4 else None

    def _body(self):
        return json.loads(self.rfile.read(int(self.headers["Content-Length"])))

    def do_POST(self):
        kind, ns, _ = self._parts()
        body = self._body()
        obj = body.get("template") or body.get("cronWorkflow")
        key = (kind, ns, obj["metadata"]["name"])
        self.calls.append(("create", key, self.headers.get("Authorization")))
        if key in self.store:
            return self._send(409, {"code": 6, "message": "already exists"})
        obj["metadata"]["resourceVersion"] = "1"
        self.store[key] = obj
        self._send(200, obj)

    def do_GET(self):
        kind, ns, name = self._parts()
        obj = self.store.get((kind, ns, name))
        self._send(200, obj) if obj else self._send(404, {"code": 5, "message": "not found"})

    def do_PUT(self):
        kind, ns, name = self._parts()
        body = self._body()
        obj = body.get("template") or body.get("cronWorkflow")
        key = (kind, ns, name)
        self.calls.append(("update", key, obj["metadata"].get("resourceVersion")))
        obj["metadata"]["resourceVersion"] = str(int(self.store[key]["metadata"]["resourceVersion"]) + 1)
        self.store[key] = obj
        self._send(200, obj)


@pytest.fixture
def argo():
    _Handler.store, _Handler.calls = {}, []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", _Handler
    srv.shutdown()


def _submit(*args):
    return subprocess.run([sys.executable, "-m", "gauntlet.workflows.cli", "submit", "--profile", "kimi-k3-h20", *args],
                          capture_output=True, text=True)


def test_dry_run_prints_argo_commands(tmp_path):
    r = _submit("--dry-run", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "argo template create -n gauntlet" in r.stdout
    assert "argo cron create -n gauntlet" in r.stdout
    assert "argo submit -n gauntlet --from workflowtemplate/gauntlet-kimi-k3-h20" in r.stdout
    assert "kubectl apply --server-side" in r.stdout
    # the ConfigMap every step pod reads its profile from goes with the RBAC; the janitor beside the nightly
    assert "gauntlet-kimi-k3-h20.profile.yaml" in r.stdout and "gauntlet-kimi-k3-h20.rbac.yaml" in r.stdout
    assert "argo cron create -n gauntlet" in r.stdout and "gauntlet-janitor.cronworkflow.yaml" in r.stdout


def test_submit_creates_then_updates(argo, tmp_path):
    url, h = argo
    r = _submit("--host", url, "--token", "t0k", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "created workflowtemplate/gauntlet-kimi-k3-h20" in r.stdout
    assert "created cronworkflow/gauntlet-kimi-k3-h20-nightly" in r.stdout
    assert "created cronworkflow/gauntlet-janitor" in r.stdout
    wt = h.store[("workflow-templates", "gauntlet", "gauntlet-kimi-k3-h20")]
    assert wt["spec"]["onExit"] == "cleanup"
    assert any(c[2] == "Bearer t0k" for c in h.calls if c[0] == "create")
    r = _submit("--host", url, "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "updated workflowtemplate/gauntlet-kimi-k3-h20" in r.stdout
    assert ("update", ("workflow-templates", "gauntlet", "gauntlet-kimi-k3-h20"), "1") in h.calls


def test_submit_without_host_is_a_usage_error(tmp_path):
    r = _submit("--out", str(tmp_path))
    assert r.returncode == 2 and "--host is required" in r.stderr and "Traceback" not in r.stderr


def test_unreachable_server_is_transient(tmp_path):
    r = _submit("--host", "http://127.0.0.1:9", "--out", str(tmp_path))
    assert r.returncode == 75, r.stderr
    assert "TransientError: submit: cannot reach" in r.stderr
    assert "Traceback" not in r.stderr
