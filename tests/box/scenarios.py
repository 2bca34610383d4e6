"""Conformance scenarios: the rendered kimi-k3-h20 template on the box, and the local runner beside it.

A :class:`Scenario` says what the GPU gates do (stand-ins, attempt by attempt), which workflow
parameters are set, and what is done to the run (a corrupted model cache, ``argo stop``).
:func:`run_on_box` submits the template with the real ``argo`` CLI, waits, and reads back an
:class:`Outcome` from the Workflow's status (every task's phase and attempts, the exit handler's
arguments) and from the API server (every pod ever created, what still carries the run's label).
:func:`run_locally` walks the same graph with the local runner, replaying each step's attempts as
the box saw them, and returns an Outcome of the same shape, so the two can be compared.

Which gates run for real on the box: preflight (a 96-shard sparse Kimi K3 layout on each node's
cache behind the hostPath), preflight-compare, deploy and teardown (server-side apply of the engine
StatefulSet and Services under the rendered Role's own service-account token; the engine ranks are
played by the kubelet's stand-in engine), regress, report and cleanup. The rest need GPUs and are
played by ``box/standin.py``.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from box.build import cache_root
from box.podwatch import pod_events
from gauntlet.params import load_profile, profile_path
from gauntlet.workflows.graph import build_graph
from gauntlet.workflows.render import RUN_LABEL, cron_name, render_documents, template_name

__all__ = ["Scenario", "Outcome", "SCENARIOS", "PROFILE", "GPU_STANDINS", "BoxSession",
           "run_locally", "replay_table", "OTHER_TEAM", "OTHER_NODE", "GENERAL_NODE", "box_nodes", "pool_taints",
           "step_argv", "upstream_of", "CARRIERS"]

PROFILE = "kimi-k3-h20"
REPO = Path(__file__).resolve().parents[2]
DONE = ("Succeeded", "Failed", "Error")
OTHER_TEAM = {"team": "other-team"}            # labels of the objects gauntlet must never touch
OTHER_NODE = "team-b-node"                     # another team's GPU node (tainted as GPU nodes are)
GENERAL_NODE = "box-general"                   # the cluster's general pool: no GPUs, no taints
# the taint GPU node pools commonly carry (GKE puts it on every GPU node); another team's node has it
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def pool_taints(profile: Any) -> list[dict[str, str]]:
    """The pool nodes' taints, made from the profile's tolerations: what a cluster that needs them has.

    ``Exists`` tolerates any value of its key: the taint gets the value ``present``; a toleration without an
    effect tolerates every effect: the taint is ``NoSchedule``; one without a key tolerates every taint and
    says nothing about the pool's, so it makes none."""
    taints = []
    for t in profile.hardware.tolerations:
        if not t.key:
            continue
        value = "present" if t.operator == "Exists" else (t.value or "")
        taints.append({"key": t.key, "value": value, "effect": t.effect or "NoSchedule"})
    return taints


def box_nodes(profile: Any) -> dict[str, Any]:
    """The process kubelet's nodes for a profile: its pool nodes (its GPUs, taints from its tolerations),
    another team's GPU node (same GPUs, the common GPU taint) and a general node without GPUs or taints,
    where the pods that need no pool node (report, regress, cleanup, the janitor) are scheduled."""
    pool = [n.name for n in profile.hardware.nodes]
    taints = pool_taints(profile)
    rdma = profile.hardware.fabric.rdma_resource        # the pool's RDMA device plugin, as on the cluster
    # 2 TiB a node, as 8-GPU servers such as the H20's commonly have: the engine pod requests /dev/shm, its resident
    # size and HiCache's host pool (steps/backends/kubernetes/manifests.py engine_resources)
    return {"nodes": [*pool, OTHER_NODE, GENERAL_NODE], "gpus_per_node": profile.hardware.gpus_per_node, "memory": "2Ti",
            "node_gpus": {GENERAL_NODE: 0}, "taints": {**{n: taints for n in pool}, OTHER_NODE: [GPU_TAINT]},
            "extended": {n: {rdma: "64"} for n in pool} if rdma else {}}

PASS: dict[str, Any] = {"exit": 0}
# the steps that run whatever happened before them and read each earlier task's phase (--upstream)
CARRIERS = ("sglang/teardown", "vllm/teardown", "regress", "report")
# The gates that need GPUs (or the engine image) and are played on the box.
GPU_STANDINS: dict[str, list[dict[str, Any]]] = {
    "engine-check": [PASS], "nodes": [PASS], "network": [PASS], "smoke": [PASS],
    "perf": [{"exit": 0, "outputs": {"unlock_C32": "false"}}],
    "longctx": [{"exit": 0, "outputs": {"unlock_all_lower": "false"}}],
    "experiment": [PASS], "experiment-baseline": [PASS],
}
# Gate 6 for real but for the bench client (box/standin.py `measured`): the experiment deploys its variant
# (server-side apply under the rendered Role, placed by the scheduler, ranks played by the stand-in engine),
# measures it with a stand-in client and tears that variant down; the baseline's phases the same way
MEASURED: dict[str, Any] = {"measure": "stand-in"}
# A file both the perf step's pod and the engine's pods see (the checkout is visible in every box container):
# the stand-in bench client creates it, the engine stand-in of rank 1 then exits (box/standin.py)
RANK_CRASH_SIGNAL = str(REPO / "build" / "box-signals" / f"rank-crash-{time.time_ns()}")


@dataclass(frozen=True)
class Scenario:
    name: str
    plays: dict[str, list[dict[str, Any]]] = field(default_factory=dict)   # step or task path -> attempts
    parameters: dict[str, str] = field(default_factory=dict)
    corrupt_node: str | None = None           # truncate one shard of this node's model cache
    nightly: bool = False                     # submit from the CronWorkflow instead of the template
    stop_after: str | None = None             # `argo stop` once this task path is Running
    expect_phase: str = "Succeeded"
    expect: dict[str, str] = field(default_factory=dict)     # task path -> phase (both back ends)
    # `argo stop` has no local counterpart to replay: Argo leaves the stopped task's node Running and
    # creates no node for the tasks it never reached, while a local Ctrl-C records Failed and Omitted
    local_counterpart: bool = True
    # labels put on the run's namespace for this scenario only (removed after it): Pod Security's enforce level
    namespace_labels: dict[str, str] = field(default_factory=dict)

    def standins(self) -> dict[str, list[dict[str, Any]]]:
        return {**GPU_STANDINS, **self.plays}


FAIL: dict[str, Any] = {"exit": 1}
# what the experimental-blocked scenario's failing gates say (their verdicts' detail, which report.md must quote)
VLLM_REFUSES = "rank 0: vllm serve: unrecognized arguments: --speculative-config-x (the image does not know it)"
NO_DRAFT = "sglang refused to start: DSpark requires setting --speculative-draft-model-path"
SCENARIOS: tuple[Scenario, ...] = (
    Scenario("all-pass", expect={"preflight-0": "Succeeded", "preflight-1": "Succeeded",
                                 "preflight-compare": "Succeeded", "sglang/deploy": "Succeeded",
                                 "sglang/teardown": "Succeeded", "regress": "Succeeded", "report": "Succeeded",
                                 "prewarm-0": "Skipped", "vllm": "Skipped", "cleanup": "Succeeded",
                                 "pull-sglang-0": "Succeeded", "pull-sglang-1": "Succeeded",
                                 "pull-vllm-0": "Skipped"}),
    Scenario("gate0-corrupt-model", corrupt_node="h20-node-02", expect_phase="Failed",
             expect={"preflight-0": "Succeeded", "preflight-1": "Failed", "preflight-compare": "Omitted",
                     "engine-check-sglang": "Omitted", "nodes-0": "Omitted", "sglang": "Omitted",
                     "cleanup": "Succeeded"}),
    Scenario("transient-early-then-pass", plays={"sglang/smoke": [{"exit": 75}, PASS]},
             expect={"sglang/smoke": "Succeeded", "cleanup": "Succeeded"}),
    Scenario("transient-late-then-pass", plays={"sglang/smoke": [{"exit": 75, "after_s": 15}, PASS]},
             expect={"sglang/smoke": "Succeeded", "cleanup": "Succeeded"}),
    # the teardown runs whatever happened before it: it releases the engine, then fails (the sequence's leaf)
    Scenario("failed-verdict-not-retried", plays={"sglang/smoke": [FAIL, PASS]}, expect_phase="Failed",
             expect={"sglang/deploy": "Succeeded", "sglang/smoke": "Failed", "sglang/perf": "Omitted",
                     "sglang/teardown": "Failed", "sglang": "Failed", "regress": "Failed", "report": "Failed",
                     "cleanup": "Succeeded"}),
    # "regress" also names the suspect task's step: play that one as "no suspicion"
    Scenario("nightly-regression", nightly=True, expect_phase="Failed",
             plays={"regress": [FAIL], "sglang/suspect": [{"exit": 0, "outputs": {"suspect": "false"}}]},
             expect={"regress": "Failed", "report": "Failed", "cleanup": "Succeeded"}),
    Scenario("stop-mid-run", plays={"sglang/perf": [{"exit": 0, "after_s": 25}]}, stop_after="sglang/perf",
             expect_phase="Failed", expect={"sglang/deploy": "Succeeded", "cleanup": "Succeeded"},
             local_counterpart=False),
    # Gate 6 never holds two engines' GPUs: the baseline runs its phases, is released, then each variant in turn
    # perf runs for real too (bench client stood in): its evidence is the variants' measure-phase baseline
    Scenario("gate6-one-engine-at-a-time", plays={"experiment": [MEASURED], "experiment-baseline": [MEASURED],
                                                  "sglang/perf": [MEASURED]},
             expect={"sglang/baseline-phases": "Succeeded", "sglang/release-baseline": "Succeeded",
                     "sglang/exp-prefix-cache": "Succeeded", "sglang/exp-dspark": "Succeeded",
                     "sglang/exp-hicache": "Succeeded", "sglang/exp-symm-mem": "Succeeded",
                     "sglang/teardown": "Succeeded", "cleanup": "Succeeded"}),
    # The real perf step (bench client stood in) while rank 1 of the engine crashes and its kubelet restarts
    # it: the rank watch fails perf with "rank 1 restarted during perf" instead of a later, wrong cause
    Scenario("rank-restarts-during-perf", expect_phase="Failed",
             plays={"engine": [{"exit": 137, "on_file": RANK_CRASH_SIGNAL, "ranks": [1]}, {}],
                    "sglang/perf": [{**MEASURED, "touch": RANK_CRASH_SIGNAL, "hold_s": 20}]},
             expect={"sglang/deploy": "Succeeded", "sglang/smoke": "Succeeded", "sglang/perf": "Failed",
                     "sglang/longctx": "Omitted", "sglang/teardown": "Failed", "sglang": "Failed",
                     "cleanup": "Succeeded"}),
    # Both engines. vLLM's image refuses a planned flag at Gate 0 and SGLang's DSpark variant finds no draft (what
    # the profile anticipates): Gate 1 and the SGLang sequence still run, the variant after DSpark too, SGLang's
    # teardown releases its engine and carries the failure, vLLM's sequence is Omitted, regress and report run
    # (report.md names each task that did not pass), and the workflow ends Failed
    Scenario("experimental-blocked-baseline-reports", parameters={"engines": "both"}, expect_phase="Failed",
             plays={"engine-check-vllm": [{"exit": 1, "detail": VLLM_REFUSES}],
                    "sglang/exp-dspark": [{"exit": 1, "detail": NO_DRAFT}]},
             expect={"engine-check-sglang": "Succeeded", "engine-check-vllm": "Failed", "nodes-0": "Succeeded",
                     "network": "Succeeded", "sglang/deploy": "Succeeded", "sglang/exp-prefix-cache": "Succeeded",
                     "sglang/exp-dspark": "Failed", "sglang/exp-hicache": "Succeeded", "sglang/teardown": "Failed",
                     "sglang": "Failed", "vllm": "Omitted", "regress": "Failed", "report": "Failed",
                     "cleanup": "Succeeded"}),
    # The namespace labelled Pod Security baseline: the real PodSecurity admission would refuse every GPU and
    # model-cache pod of the run; the real params step (its own pod admitted at baseline) reads the label first and
    # fails the run in one line naming it, before any GPU is requested
    Scenario("pod-security-baseline", namespace_labels={"pod-security.kubernetes.io/enforce": "baseline"},
             expect_phase="Failed",
             expect={"params": "Failed", "prewarm-0": "Omitted", "preflight-0": "Omitted", "preflight-1": "Omitted",
                     "engine-check-sglang": "Omitted", "nodes-0": "Omitted", "network": "Omitted",
                     "sglang": "Omitted", "cleanup": "Succeeded"}),
)


@dataclass
class Outcome:
    phase: str
    tasks: dict[str, str]                          # task path -> phase
    attempts: dict[str, list[int | None]]          # task path -> exit code of each attempt
    outputs: dict[str, dict[str, str]]             # task path -> output parameters
    exit_status: str | None = None                 # --workflow-status the exit handler got
    exit_failures: str | None = None               # --failures, raw, as the exit handler got it
    gpu_pods: list[str] = field(default_factory=list)        # every pod ever created that requested GPUs
    labelled_left: dict[str, int] = field(default_factory=dict)  # object -> replicas/1 still held by the run
    run_dir: Path | None = None
    name: str = ""
    uid: str = ""
    seconds: float = 0.0                           # submit to finished (exit handler included)
    upstream: dict[str, list[str]] = field(default_factory=dict)   # CARRIERS' --upstream, as each step got it

    def failure_names(self) -> set[str]:
        """The displayNames in the exit handler's --failures, the workflow's own name as <workflow>."""
        return failure_names(self.exit_failures, self.name)


def failure_names(raw: str | None, workflow: str) -> set[str]:
    if raw is None:
        return set()
    text = json.loads(raw) if raw.startswith('"') else raw
    nodes = json.loads(text) if text else None
    return {("<workflow>" if n["displayName"] == workflow else n["displayName"]) for n in nodes or []}


# ------------------------------------------------------------------ the box side

class BoxSession:
    """The box prepared for the kimi-k3-h20 template: namespace, RBAC, template, cron, model caches."""

    def __init__(self, box: Any, kubelet: Any, node_roots: dict[str, Path], pvc_root: Path):
        self.box, self.kubelet, self.node_roots, self.pvc_root = box, kubelet, node_roots, pvc_root
        self.profile = load_profile(PROFILE)
        self.ns = self.profile.namespace
        self.docs = render_documents(self.profile)
        self.pods_seen: dict[str, dict[str, Any]] = {}
        self.pod_events: list[tuple[float, str, dict[str, Any]]] = []     # (monotonic time, ADDED/MODIFIED/DELETED, pod)
        self._watch = threading.Thread(target=self._watch_pods, daemon=True)
        self._stop = threading.Event()

    # set-up -------------------------------------------------------
    def prepare(self) -> None:
        from gauntlet.steps.model.synth import synth_from_profile
        from gauntlet.steps.model.marker import write_marker

        box = self.box
        box.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.ns}})
        self._runs_volume()
        for _name, doc in self.docs.items():
            for d in doc if isinstance(doc, list) else [doc]:
                box.apply(d)
        # one sparse 96-shard layout per profile in the box's cache, hard-linked into each node's cache
        m = self.profile.model
        key = hashlib.sha256(m.model_dump_json().encode()).hexdigest()[:12]
        seed = cache_root() / "models" / f"{self.profile.name}-{key}"
        if not (seed / m.marker).is_file():
            shutil.rmtree(seed, ignore_errors=True)
            synth_from_profile(self.profile, seed, sparse=True)
            write_marker(seed, m.revision, m.marker)
        for node in self.node_roots:
            cache = self.model_cache(node)
            if not (cache / m.marker).is_file():
                cache.parent.mkdir(parents=True, exist_ok=True)
                subprocess.run(["cp", "-al", str(seed), str(cache)], check=True)
        self.apply_other_team()
        self._watch.start()

    def _runs_volume(self) -> None:
        """The runs volume every step mounts at /runs: a claim pre-bound to a hostPath PV (the kubelet's claim
        dir), bound by kube-controller-manager's PV binder, as an administrator's static volume is. The
        scheduler places no pod whose claim is unbound."""
        claim = self.profile.runs_pvc
        modes = [getattr(self.profile, "runs_access_mode", "ReadWriteMany")]     # the profile's, as lint checks
        pv = f"{self.ns}-{claim}"
        self.box.apply({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
                        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": modes, "storageClassName": "",
                                 "persistentVolumeReclaimPolicy": "Retain",
                                 "hostPath": {"path": str(self.kubelet.claim_dir(self.ns, claim)),
                                              "type": "DirectoryOrCreate"},
                                 "claimRef": {"namespace": self.ns, "name": claim}}})
        self.box.apply({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                        "metadata": {"name": claim, "namespace": self.ns},
                        "spec": {"accessModes": modes, "storageClassName": "", "volumeName": pv,
                                 "resources": {"requests": {"storage": "1Gi"}}}})
        wait_for(lambda: (self.box.request("GET", f"/api/v1/namespaces/{self.ns}/persistentvolumeclaims/{claim}")[1]
                          .get("status") or {}).get("phase") == "Bound", 60, f"claim {claim} bound to {pv}")

    def model_cache(self, node: str) -> Path:
        return self.node_roots[node] / self.profile.model.host_cache_path.lstrip("/")

    def apply_other_team(self) -> None:
        """Another team's StatefulSet with a GPU pod in the same namespace: gauntlet must never touch it."""
        labels = {**OTHER_TEAM, "app": "team-b-serving"}
        self.box.apply({"apiVersion": "apps/v1", "kind": "StatefulSet",
                        "metadata": {"name": "team-b-serving", "namespace": self.ns, "labels": labels},
                        "spec": {"replicas": 1, "serviceName": "team-b-serving",
                                 "selector": {"matchLabels": labels},
                                 "template": {"metadata": {"labels": labels}, "spec": {
                                     "nodeSelector": {"kubernetes.io/hostname": OTHER_NODE},
                                     "tolerations": [{"key": GPU_TAINT["key"], "operator": "Exists",
                                                      "effect": GPU_TAINT["effect"]}],
                                     "containers": [{"name": "serve", "image": "team-b/serving:1",
                                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}})
        # the test's "before" must be the settled state: the first test on a fresh box read it before
        # kube-controller-manager had created the pod, and then saw the pod appear as if gauntlet had made it
        wait_for(lambda: self.other_team_state()["pods"] == ["team-b-serving-0"], 60, "the other team's pod created")

    def other_team_state(self) -> dict[str, Any]:
        _, sts = self.box.request("GET", f"/apis/apps/v1/namespaces/{self.ns}/statefulsets/team-b-serving")
        _, pods = self.box.request("GET", f"/api/v1/namespaces/{self.ns}/pods?labelSelector=team%3Dother-team")
        return {"replicas": (sts.get("spec") or {}).get("replicas"),
                "pods": sorted(p["metadata"]["name"] for p in pods.get("items", [])
                               if not p["metadata"].get("deletionTimestamp"))}

    def _watch_pods(self) -> None:
        """Every pod ever created in the namespace (Argo's podGC may delete one before we look), each version
        once: a stream that starts over after an error sends again the versions already seen."""
        from kubernetes import client

        core = client.CoreV1Api(self.box.api_client())
        seen: set[tuple[str, str, str]] = set()
        for ev in pod_events(core.list_namespaced_pod, self.ns, stop=self._stop, timeout_s=5,
                             on_error=lambda _: time.sleep(0.5)):
            pod = ev["object"]
            meta = pod["metadata"]
            key = (meta["uid"], meta.get("resourceVersion", ""), ev["type"])
            if key not in seen:
                seen.add(key)
                self.pods_seen.setdefault(meta["uid"], pod)
                self.pod_events.append((time.monotonic(), ev["type"], pod))

    def close(self) -> None:
        self._stop.set()

    def unfinished(self) -> list[str]:
        """The namespace's workflows not finished yet (running, or Pending on the pool's mutex)."""
        status, body = self.box.request("GET", f"/apis/argoproj.io/v1alpha1/namespaces/{self.ns}/workflows")
        if status != 200:
            raise AssertionError(f"listing workflows: {status} {str(body)[:300]}")
        return sorted(w["metadata"]["name"] for w in body.get("items", [])
                      if not (w.get("status") or {}).get("finishedAt"))

    def stop_leftovers(self, grace_s: float = 240) -> list[str]:
        """End what a test left unfinished, so that no later test on this box waits behind it on the pool's mutex:
        ``argo stop`` (the exit handler still releases), then ``argo terminate`` for what outlives ``grace_s``.
        The names it stopped (a test that leaves a run behind is wrong, and its own failure says why)."""
        left = self.unfinished()
        for name in left:
            self.box.argo("stop", "-n", self.ns, name)
        deadline = time.monotonic() + grace_s
        while left and time.monotonic() < deadline and set(self.unfinished()) & set(left):
            time.sleep(2)
        for name in set(self.unfinished()) & set(left):
            self.box.argo("terminate", "-n", self.ns, name)
        return left

    # one scenario -------------------------------------------------
    def submit(self, sc: Scenario, timeout_s: float = 600) -> Outcome:
        self.kubelet.set_standins(sc.standins())
        self.label_namespace(sc.namespace_labels)
        params = {"engines": "sglang", "results-uri": "/runs/results", "retry-backoff": "1s", **sc.parameters}
        if sc.corrupt_node:
            shard = sorted(self.model_cache(sc.corrupt_node).glob("*.safetensors"))[3]
            size = shard.stat().st_size
            # the shard is a hard link shared with the other node: give this node its own sparse copy first
            private = shard.with_name(shard.name + ".private")
            subprocess.run(["cp", "--sparse=always", str(shard), str(private)], check=True)
            private.replace(shard)
            with shard.open("r+b") as fh:
                fh.truncate(size - 1)
        try:
            src = f"cronwf/{cron_name(self.profile)}" if sc.nightly else f"workflowtemplate/{template_name(self.profile)}"
            argv = ["submit", "-n", self.ns, "--from", src, "-o", "name"]
            for k, v in params.items():
                argv += ["-p", f"{k}={v}"]
            r = self.box.argo(*argv)
            if r.returncode:
                raise AssertionError(f"argo submit failed: {r.stderr.strip() or r.stdout.strip()}")
            name = r.stdout.strip().split("/")[-1]
            t0 = time.monotonic()
            seen_before = set(self.pods_seen)
            wf = self._wait(name, sc, timeout_s)
        finally:
            if sc.corrupt_node:
                with shard.open("r+b") as fh:
                    fh.truncate(size)
            self.label_namespace({k: None for k in sc.namespace_labels})
        out = outcome_from_workflow(wf, list(self.pods_seen.values()))
        out.seconds = round(time.monotonic() - t0, 1)
        out.gpu_pods = sorted(p["metadata"]["name"] for uid, p in self.pods_seen.items()
                              if uid not in seen_before and (p["metadata"].get("labels") or {}).get(RUN_LABEL)
                              == wf["metadata"]["uid"] and requests_gpu(p))
        out.labelled_left = self.held(wf["metadata"]["uid"])
        out.run_dir = self.pvc_root / "pvc" / self.ns / self.profile.runs_pvc / wf["metadata"]["uid"]
        return out

    def _wait(self, name: str, sc: Scenario, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        stopped = False
        while time.monotonic() < deadline:
            _, wf = self.box.request("GET", f"/apis/argoproj.io/v1alpha1/namespaces/{self.ns}/workflows/{name}")
            st = wf.get("status") or {}
            if sc.stop_after and not stopped and running(st, sc.stop_after):
                r = self.box.argo("stop", "-n", self.ns, name)
                assert r.returncode == 0, f"argo stop: {r.stderr}"
                stopped = True
            if st.get("phase") in DONE and st.get("finishedAt"):
                return wf
            time.sleep(1)
        raise AssertionError(f"workflow {name} not finished after {timeout_s:.0f}s: phase "
                             f"{(wf.get('status') or {}).get('phase')}, nodes "
                             f"{ {n['displayName']: n['phase'] for n in (wf.get('status') or {}).get('nodes', {}).values()} }")

    def label_namespace(self, labels: dict[str, str | None]) -> None:
        """Set (a value) or remove (None) labels of the run's namespace, as an administrator would."""
        if not labels:
            return
        status, out = self.box.request("PATCH", f"/api/v1/namespaces/{self.ns}",
                                       json.dumps({"metadata": {"labels": labels}}),
                                       content_type="application/merge-patch+json")
        if status >= 300:
            raise AssertionError(f"labelling namespace {self.ns}: {status} {str(out)[:300]}")

    def held(self, uid: str) -> dict[str, int]:
        """What still carries the run's label and holds something: StatefulSet replicas, live pods, Jobs."""
        sel = f"labelSelector={RUN_LABEL}%3D{uid}"
        held: dict[str, int] = {}
        _, sts = self.box.request("GET", f"/apis/apps/v1/namespaces/{self.ns}/statefulsets?{sel}")
        for s in sts.get("items", []):
            held[f"StatefulSet/{s['metadata']['name']}"] = int(s["spec"].get("replicas") or 0)
        _, jobs = self.box.request("GET", f"/apis/batch/v1/namespaces/{self.ns}/jobs?{sel}")
        for j in jobs.get("items", []):
            held[f"Job/{j['metadata']['name']}"] = 1
        _, pods = self.box.request("GET", f"/api/v1/namespaces/{self.ns}/pods?{sel}")
        for p in pods.get("items", []):
            if requests_gpu(p) and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                held[f"Pod/{p['metadata']['name']}"] = 1
        return {k: v for k, v in held.items() if v}


def requests_gpu(pod: dict[str, Any]) -> bool:
    for c in (pod.get("spec") or {}).get("containers", []) + (pod.get("spec") or {}).get("initContainers", []):
        res = c.get("resources") or {}
        if any("nvidia.com/gpu" in (res.get(k) or {}) for k in ("requests", "limits")):
            return True
    return False


def running(status: dict[str, Any], path: str) -> bool:
    return any(p == path and ph == "Running" for p, ph in task_phases(status).items())


def _paths(status: dict[str, Any]) -> dict[str, str]:
    """node id -> task path (engine sequences prefix their tasks: ``sglang/deploy``)."""
    nodes = status.get("nodes") or {}
    root = next((i for i, n in nodes.items() if n.get("boundaryID") in (None, "") and n.get("type") == "DAG"), None)
    paths = {}
    for i, n in nodes.items():
        b = n.get("boundaryID")
        if i == root:
            continue
        prefix = "" if b in (None, "", root) else nodes.get(b, {}).get("displayName", "?") + "/"
        paths[i] = prefix + n["displayName"]
    return paths


_ATTEMPT = re.compile(r"^(.*)\((\d+)\)$")


def task_phases(status: dict[str, Any]) -> dict[str, str]:
    nodes = status.get("nodes") or {}
    out = {}
    for i, path in _paths(status).items():
        if _ATTEMPT.match(path) and nodes[i].get("type") == "Pod":
            continue
        if path.endswith(".onExit"):
            path = "cleanup"
        out[path] = nodes[i]["phase"]
    return out


def outcome_from_workflow(wf: dict[str, Any], pods: list[dict[str, Any]]) -> Outcome:
    st = wf.get("status") or {}
    nodes = st.get("nodes") or {}
    paths = _paths(st)
    attempts: dict[str, list[int | None]] = {}
    outputs: dict[str, dict[str, str]] = {}
    for i, path in sorted(paths.items(), key=lambda kv: kv[1]):
        n = nodes[i]
        if n.get("type") != "Pod":
            continue
        m = _ATTEMPT.match(path)
        task = m.group(1) if m else path
        task = "cleanup" if task.endswith(".onExit") else task
        code = (n.get("outputs") or {}).get("exitCode")
        attempts.setdefault(task, []).append(int(code) if code not in (None, "") else None)
        params = {p["name"]: p.get("value", "") for p in (n.get("outputs") or {}).get("parameters", [])}
        if params:
            outputs[task] = params
    exit_args = exit_handler_argv(pods, wf["metadata"]["name"])
    status_arg = _opt(exit_args, "--workflow-status")
    failures_arg = _opt(exit_args, "--failures")
    upstream = {p: up for p in CARRIERS if (up := upstream_of(step_argv(pods, wf["metadata"]["name"], p))) is not None}
    return Outcome(st.get("phase", "?"), task_phases(st), attempts, outputs, status_arg, failures_arg,
                   name=wf["metadata"]["name"], uid=wf["metadata"]["uid"], upstream=upstream)


def exit_handler_argv(pods: list[dict[str, Any]], workflow: str) -> list[str]:
    """The exit handler's argv as its pod ran it (Argo substituted it into the container's args)."""
    for p in pods:
        meta = p["metadata"]
        if (meta.get("labels") or {}).get("workflows.argoproj.io/workflow") != workflow:
            continue
        node = (meta.get("annotations") or {}).get("workflows.argoproj.io/node-name", "")
        if _ATTEMPT.sub(r"\1", node) != f"{workflow}.onExit" or not node.endswith("(0)"):
            continue             # the exit handler's first attempt: <workflow>.onExit(0)
        main = next(c for c in p["spec"]["containers"] if c["name"] == "main")
        argv = list(main.get("command") or []) + list(main.get("args") or [])
        return argv[argv.index("--") + 1:] if "--" in argv else argv
    return []


def step_argv(pods: list[dict[str, Any]], workflow: str, path: str) -> list[str] | None:
    """The gauntlet argv of task ``path``'s first attempt (``sglang/teardown``) as Argo substituted it into its
    pod (node ``<workflow>.sglang.teardown`` or its first retry ``...(0)``); None when no pod ran it."""
    node = f"{workflow}.{path.replace('/', '.')}"
    for p in pods:
        meta = p["metadata"]
        name = (meta.get("annotations") or {}).get("workflows.argoproj.io/node-name", "")
        if (meta.get("labels") or {}).get("workflows.argoproj.io/workflow") == workflow and name in (node, f"{node}(0)"):
            main = next(c for c in p["spec"]["containers"] if c["name"] == "main")
            argv = list(main.get("command") or []) + list(main.get("args") or [])
            return argv[argv.index("--") + 1:] if "--" in argv else argv
    return None


def upstream_of(argv: list[str] | None) -> list[str] | None:
    """The ``--upstream TASK=PHASE ...`` items of a step's argv (None: no such flag)."""
    if not argv or "--upstream" not in argv:
        return None
    rest = argv[argv.index("--upstream") + 1:]
    return rest[:next((i for i, a in enumerate(rest) if a.startswith("--")), len(rest))]


def _opt(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv and argv.index(flag) + 1 < len(argv) else None


# ------------------------------------------------------------------ the local side

def replay_table(box: Outcome) -> dict[str, list[dict[str, Any]]]:
    """{task path: [behaviour per attempt]}: what each step did on the box, for the local runner."""
    table: dict[str, list[dict[str, Any]]] = {}
    for path, codes in box.attempts.items():
        if path == "cleanup":
            continue
        plays = []
        for code in codes:
            plays.append({"exit": 1 if code is None else code, "outputs": box.outputs.get(path, {})})
        table[path] = plays
    return table


def run_locally(sc: Scenario, box: Outcome, workdir: Path) -> Outcome:
    """The local runner on the same graph, each step replaying its box attempts; cleanup plays too."""
    from gauntlet.workflows.local import Runner

    profile = load_profile(PROFILE)
    # the cluster's graph (the nightly's for a scenario the CronWorkflow submits), every task played by a stand-in
    graph = build_graph(profile, "argo", "nightly" if sc.nightly else "qualification")
    run_dir = workdir / f"local-{sc.name}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    table = replay_table(box)
    table["cleanup"] = [{"exit": 0}]
    tf = workdir / f"standins-{sc.name}.json"
    shutil.rmtree(str(tf) + ".attempts", ignore_errors=True)
    tf.write_text(json.dumps(table))
    params = {k: v[0] for k, v in graph.parameters.items()}
    params.update({"engines": "sglang", "results-uri": "/runs/results", "retry-backoff": "1s", **sc.parameters,
                   "run-dir": str(run_dir)})
    env = {"GAUNTLET_STANDINS": str(tf), "GAUNTLET_RUN_DIR": str(run_dir),
           "PYTHONPATH": f"{REPO / 'tests'}:{REPO}"}
    import io
    runner = Runner(graph, profile_path(PROFILE), run_dir, params, python=sys.executable, cli="box.scenario_cli",
                    stream=io.StringIO(), cwd=REPO, env=env)
    status = runner.run()
    tasks = {r.path: r.phase for r in runner.results}
    attempts = {r.path: list(r.attempts) for r in runner.results if r.step}
    argv = json.loads((run_dir / "cleanup" / "argv.0.json").read_text())
    upstream = {p: up for p in CARRIERS if (run_dir / p / "argv.0.json").is_file()
                and (up := upstream_of(json.loads((run_dir / p / "argv.0.json").read_text()))) is not None}
    return Outcome(status, tasks, attempts, {}, _opt(argv, "--workflow-status"), _opt(argv, "--failures"),
                   run_dir=run_dir, name=runner._workflow_vars()["name"], upstream=upstream)


def wait_for(pred: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def kill_tree(p: subprocess.Popen) -> None:
    p.kill()
    p.wait()
