"""Pods on the GPU pool: pinned to its nodes with its tolerations; nothing else tolerates it; the runs volume's
access mode; deadlines that count Pending (issue 18).

Offline: manifests are validated with kubernetes-validate and the WorkflowTemplate with the strict Argo schema
lint, as the rest of the suite does. That a tainted node refuses a pod without the toleration is the real
scheduler's call (the box's scenarios); that Argo fails a Pending node past ``timeout`` only without a
retryStrategy is read from Argo's controller source (workflows/render.py ``_placement`` cites the lines).
"""

from __future__ import annotations

import copy
import subprocess
import sys

import kubernetes_validate
import pytest
import yaml

from gauntlet.params import ProfileError, load_images, load_profile
from gauntlet.params.loader import PROFILES_DIR
from gauntlet.steps import needs_of
from gauntlet.steps.backends.kubernetes import manifests as M
from gauntlet.steps.gates.network import probe_env
from gauntlet.workflows import render as R
from gauntlet.workflows.graph import build_graph
from gauntlet.workflows.lint import lint_documents, profile_rules

KIMI = load_profile("kimi-k3-h20")
IMAGES = load_images()
UID = "5b1c7a0e-3d2f-4e6a-9b8c-0123456789ab"
GPU_TAINT = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def _with(profile, **hardware):
    return profile.model_copy(update={"hardware": profile.hardware.model_copy(update=hardware)})


def _template(profile) -> dict:
    return R._template(profile, build_graph(profile, "argo"), IMAGES).to_dict()


def _pinned(t: dict) -> list[str] | None:
    req = ((t.get("affinity") or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    if not req:
        return None
    (term,) = req["nodeSelectorTerms"]
    (expr,) = term["matchExpressions"]
    assert (expr["key"], expr["operator"]) == ("kubernetes.io/hostname", "In")
    return expr["values"]


def test_the_kimi_profile_tolerates_the_gpu_taint():
    assert [t.manifest() for t in KIMI.hardware.tolerations] == [GPU_TAINT]
    assert KIMI.runs_access_mode == "ReadWriteMany"


@pytest.mark.parametrize("tol,needle", [
    ({"key": "nvidia.com/gpu", "operator": "Exists", "value": "x"}, "value: must be absent with operator Exists"),
    ({"key": "nvidia.com/gpu", "operator": "In"}, "hardware.tolerations.0.operator"),
    ({"key": "nvidia.com/gpu", "effect": "NoEvict"}, "hardware.tolerations.0.effect"),
    ({"key": "nvidia.com/gpu", "tolerationSeconds": 5}, "hardware.tolerations.0.tolerationSeconds: unknown key"),
])
def test_a_bad_toleration_is_one_line_naming_the_field(tmp_path, tol, needle):
    data = yaml.safe_load((PROFILES_DIR / "kimi-k3-h20.yaml").read_text())
    data["hardware"]["tolerations"] = [tol]
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError) as exc:
        load_profile(p)
    assert needle in str(exc.value)
    r = subprocess.run([sys.executable, "-m", "gauntlet.workflows.cli", "lint", "--profile", str(p)],
                       capture_output=True, text=True)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and needle in lines[0], r.stderr


@pytest.mark.parametrize("priority", [None, "gpu-batch"])
def test_engine_and_probe_pods_carry_the_pool_tolerations(priority):
    prof = _with(KIMI, priority_class_name=priority)
    objs = []
    for engine, spec in prof.engines.items():
        objs += M.engine_objects(prof, engine, UID, IMAGES[spec.image].ref)
    env = probe_env(prof, prof.baseline_engine)
    for phase in ("intra", "inter"):
        objs.append(M.probe_job(prof, phase, UID, IMAGES["sglang"].ref, env, "print('probe')", ["--sizes", "1"]))
    pods = [o["spec"]["template"]["spec"] for o in objs if o["kind"] in ("StatefulSet", "Job")]
    assert len(pods) == 4
    for pod in pods:
        assert pod["tolerations"] == [GPU_TAINT]
        assert _pinned(pod) == ["h20-node-01", "h20-node-02"]
        assert pod.get("priorityClassName") == priority
    for o in objs:
        kubernetes_validate.validate(o, "1.37.0", strict=True)


def test_a_profile_without_tolerations_renders_none():
    prof = _with(KIMI, tolerations=[])
    sts = M.engine_statefulset(prof, "sglang", UID, IMAGES["sglang"].ref)
    assert "tolerations" not in sts["spec"]["template"]["spec"] and "priorityClassName" not in sts["spec"]["template"]["spec"]


def test_every_pool_pod_of_the_template_is_pinned_and_tolerates_and_no_other_pod_does():
    prof = _with(KIMI, priority_class_name="gpu-batch")
    wt = _template(prof)
    pool, other = [], []
    for t in wt["spec"]["templates"]:
        if "container" not in t:
            continue
        mounts = {v["name"] for v in t["container"].get("volumeMounts", [])}
        gpus = "nvidia.com/gpu" in (t["container"].get("resources", {}).get("requests") or {})
        per_node = t["container"]["args"][:1] == ["step"] and needs_of(t["container"]["args"][1]).per_node
        (pool if mounts & {"model-cache", "model-cache-rw"} or gpus or per_node else other).append(t)
    names = {t["name"] for t in pool}
    # engine-check mounts the model's hostPath: before issue 18 it could land on any node; Gate 1's pulls
    # mount nothing and take no GPU but are pinned to their node (the image is pulled there)
    assert {"engine-check-sglang", "engine-check-vllm", "preflight-0", "preflight-1", "nodes-0", "nodes-1",
            "pull-sglang-0", "pull-vllm-1"} <= names
    for t in pool:
        assert t["tolerations"] == [GPU_TAINT], t["name"]
        assert t["priorityClassName"] == "gpu-batch", t["name"]
        assert set(_pinned(t)) <= {"h20-node-01", "h20-node-02"}, t["name"]
        assert "nodeSelector" not in t
    by = {t["name"]: t for t in pool}
    assert _pinned(by["preflight-1"]) == ["h20-node-02"] and _pinned(by["nodes-0"]) == ["h20-node-01"]
    assert _pinned(by["pull-vllm-1"]) == ["h20-node-02"]
    assert _pinned(by["engine-check-vllm"]) == ["h20-node-01", "h20-node-02"]
    assert other and all("tolerations" not in t and "affinity" not in t and "priorityClassName" not in t
                         for t in other)
    assert lint_documents([("wt", wt)]) == []          # the strict Argo schema accepts every new field
    assert profile_rules(prof, [("wt", wt)]) == []


def test_a_gate_that_never_exits_75_has_a_deadline_that_counts_pending():
    """Argo checks ``timeout`` on the task's node while it is Pending; with a retryStrategy that node is the
    Retry node, Running, so only a template without one can fail while its pod is unschedulable."""
    wt = _template(KIMI)
    by = {t["name"]: t for t in wt["spec"]["templates"] if "container" in t}
    for name in ("preflight-0", "nodes-1", "engine-check-sglang"):
        t = by[name]
        assert "retryStrategy" not in t
        assert t["timeout"] == f"{t['activeDeadlineSeconds']}s"     # Argo refuses a bare number
    for name in ("prewarm-0", "seq-deploy", "cleanup"):
        assert "retryStrategy" in by[name] and "timeout" not in by[name]
    assert all(needs_of(s).transient is False for s in ("preflight", "nodes", "engine-check"))


def test_the_lint_catches_a_pool_pod_without_tolerations_and_an_outsider_with_them():
    wt = _template(KIMI)
    bad = copy.deepcopy(wt)
    by = {t["name"]: t for t in bad["spec"]["templates"]}
    del by["engine-check-vllm"]["tolerations"]
    del by["preflight-0"]["affinity"]
    by["report"]["tolerations"] = [GPU_TAINT]
    found = profile_rules(KIMI, [("wt", bad)])
    rules = sorted((f.rule, f.message.split("'")[1]) for f in found)
    assert rules == [("pool-outsider", "report"), ("pool-pinning", "preflight-0"),
                     ("pool-tolerations", "engine-check-vllm")], found


@pytest.mark.parametrize("mode", ["ReadWriteOnce", "ReadWriteOncePod"])
def test_lint_refuses_a_runs_volume_two_nodes_cannot_share(mode):
    prof = KIMI.model_copy(update={"runs_access_mode": mode})
    found = profile_rules(prof, [])
    assert len(found) == 1 and found[0].path == "runs_access_mode", found
    # the first concurrent pair: prewarm-0/1 (when prewarm runs), as preflight-0/1 would be
    assert "prewarm-0 (on h20-node-01) and prewarm-1 (on h20-node-02)" in found[0].message


def test_preflight_alone_also_mounts_the_runs_volume_on_two_nodes_at_once():
    from gauntlet.workflows import placement_lint as P
    graph = build_graph(KIMI, "argo")
    by = {t.name: t for t in graph.main.tasks}
    assert by["preflight-0"].node != by["preflight-1"].node
    assert "preflight-0" not in P._ancestors(by, "preflight-1") and "preflight-1" not in P._ancestors(by, "preflight-0")


def test_one_node_may_keep_its_runs_volume_read_write_once_but_never_read_only():
    one = load_profile("h200-1gpu")
    assert profile_rules(one.model_copy(update={"runs_access_mode": "ReadWriteOnce"}), []) == []
    (f,) = profile_rules(one.model_copy(update={"runs_access_mode": "ReadOnlyMany"}), [])
    assert "every step writes its evidence" in f.message


def test_gauntlet_lint_profile_names_the_field(tmp_path):
    data = yaml.safe_load((PROFILES_DIR / "kimi-k3-h20.yaml").read_text())
    data["runs_access_mode"] = "ReadWriteOnce"
    data["active_deadline_s"] = 7 * 24 * 3600         # whatever `gauntlet plan` asks of the kimi profile now
    p = tmp_path / "rwo.yaml"
    p.write_text(yaml.safe_dump(data))
    r = subprocess.run([sys.executable, "-m", "gauntlet.workflows.cli", "lint", "--profile", str(p)],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "runs_access_mode: ReadWriteOnce" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
