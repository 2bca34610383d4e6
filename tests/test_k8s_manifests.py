"""The cluster objects a run creates: real-schema validation, labels, and the one-template/per-rank contract."""

from __future__ import annotations

import shlex

import kubernetes_validate
import pytest
from box.podplan import expand_refs

from gauntlet.params import load_images, load_profile
from gauntlet.steps.backends.kubernetes import RUN_LABEL
from gauntlet.steps.backends.kubernetes import manifests as M
from gauntlet.steps.gates.network import probe_env

KIMI = load_profile("kimi-k3-h20")
IMAGES = load_images()
UID = "5b1c7a0e-3d2f-4e6a-9b8c-0123456789ab"
K8S_VERSION = "1.37.0"


def all_objects(profile=KIMI):
    objs = []
    for engine, spec in profile.engines.items():
        objs += M.engine_objects(profile, engine, UID, IMAGES[spec.image].ref)
    env = probe_env(profile, profile.baseline_engine)
    for phase in ("intra", "inter"):
        objs.append(M.probe_job(profile, phase, UID, IMAGES["sglang"].ref, env, "print('probe')", ["--sizes", "1"]))
    objs.append(M.probe_service(profile, "inter", UID))
    return objs


@pytest.mark.parametrize("profile", ["kimi-k3-h20", "h200-1gpu"])
def test_every_manifest_validates_against_the_real_schema(profile):
    for o in all_objects(load_profile(profile)):
        kubernetes_validate.validate(o, K8S_VERSION, strict=True)


def test_a_typo_is_caught_by_the_schema():
    sts = M.engine_statefulset(KIMI, "sglang", UID, IMAGES["sglang"].ref)
    sts["spec"]["podManagmentPolicy"] = "Parallel"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, K8S_VERSION, strict=True)


def test_everything_carries_the_run_label():
    for o in all_objects():
        assert o["metadata"]["labels"][RUN_LABEL] == UID
        tmpl = o.get("spec", {}).get("template")
        if tmpl:
            assert tmpl["metadata"]["labels"][RUN_LABEL] == UID


def test_statefulset_shape():
    sts = M.engine_statefulset(KIMI, "sglang", UID, IMAGES["sglang"].ref)
    spec = sts["spec"]
    assert spec["replicas"] == 2 and spec["podManagementPolicy"] == "Parallel"
    assert spec["serviceName"] == M.engine_names("sglang", UID)["headless"]
    pod = spec["template"]["spec"]
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert anti["topologyKey"] == "kubernetes.io/hostname" and anti["labelSelector"]["matchLabels"] == spec["selector"]["matchLabels"]
    nodes = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert nodes[0]["matchExpressions"][0]["values"] == ["h20-node-01", "h20-node-02"]
    (c,) = pod["containers"]             # the engine; its rank's telemetry sampler runs in it (tests/test_telemetry.py)
    assert c["name"] == "engine"
    assert c["image"] == IMAGES["sglang"].ref and "@sha256:" in c["image"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["model"] == {"name": "model", "mountPath": KIMI.model.mount_path, "readOnly": True}
    assert mounts["dshm"]["mountPath"] == "/dev/shm"
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["model"]["hostPath"]["path"] == KIMI.model.host_cache_path
    assert vols["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "128Gi"}
    env = {e["name"]: e.get("value") for e in c["env"]}
    # the profile's, and the one SGLang sets itself at start-up (steps/engines/sglang.py env)
    assert env["NCCL_CUMEM_ENABLE"] == "1" and env["NCCL_NVLS_ENABLE"] == "0"
    (init,) = pod["initContainers"]
    assert f"{KIMI.model.mount_path}/{KIMI.model.marker}" in init["command"][2]
    assert init["volumeMounts"][0]["readOnly"] is True


def rank_cases(script: str) -> dict[str, list[str]]:
    out = {}
    for line in script.splitlines():
        line = line.strip()
        if line[:2] in ("0)", "1)") and " exec " in line:
            out[line[0]] = shlex.split(line.split(" exec ", 1)[1].removesuffix(";;"))
    return out


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_ranks_differ_only_in_rank(engine):
    sts = M.engine_statefulset(KIMI, engine, UID, IMAGES[KIMI.engines[engine].image].ref)
    cases = rank_cases(sts["spec"]["template"]["spec"]["containers"][0]["command"][2])
    a, b = cases["0"], cases["1"]
    diff = [(x, y) for x, y in zip(a, b, strict=False) if x != y]
    if engine == "sglang":
        assert len(a) == len(b) and diff == [("0", "1")]
        assert a[a.index("--dist-init-addr") + 1].startswith(f"{M.engine_names(engine, UID)['statefulset']}-0.")
    else:
        assert set(b) - set(a) == {"--headless", "1"} and len(b) == len(a) + 1
        assert a[a.index("--node-rank") + 1] == "0" and b[b.index("--node-rank") + 1] == "1"
    assert a[a.index("--nnodes") + 1] == "2"


def test_per_node_nic_goes_by_node_name():
    nodes = [KIMI.hardware.nodes[0].model_copy(update={"rdma_ifname": "ibp1"}),
             KIMI.hardware.nodes[1].model_copy(update={"rdma_ifname": "ibp9"})]
    p = KIMI.model_copy(update={"hardware": KIMI.hardware.model_copy(update={"nodes": nodes})})
    script = M.engine_statefulset(p, "sglang", UID, "img")["spec"]["template"]["spec"]["containers"][0]["command"][2]
    assert "h20-node-01) export NCCL_SOCKET_IFNAME=ibp1 GLOO_SOCKET_IFNAME=ibp1" in script
    assert "h20-node-02) export NCCL_SOCKET_IFNAME=ibp9 GLOO_SOCKET_IFNAME=ibp9" in script


def test_client_service_targets_the_leader_only():
    svc = M.client_service(KIMI, "vllm", UID)
    assert svc["spec"]["selector"]["statefulset.kubernetes.io/pod-name"].endswith("-0")
    assert M.endpoint_url(KIMI, "vllm", UID) == f"http://{svc['metadata']['name']}.gauntlet.svc.cluster.local:8000"
    hl = M.headless_service(KIMI, "vllm", UID)
    assert hl["spec"]["clusterIP"] == "None" and hl["spec"]["publishNotReadyAddresses"] is True


def test_probe_job_runs_in_the_engine_image_with_its_env():
    env = probe_env(KIMI, "sglang")
    job = M.probe_job(KIMI, "inter", UID, IMAGES["sglang"].ref, env, "SRC", ["--sizes", "1048576"])
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == 2
    assert spec["backoffLimit"] == 0
    c = spec["template"]["spec"]["containers"][0]
    got = {e["name"]: e.get("value") for e in c["env"]}
    assert got["NCCL_CUMEM_ENABLE"] == "1" and got["GAUNTLET_PROBE_SRC"] == "SRC" and got["NCCL_DEBUG"] == "INFO"
    script = expand_refs(c["command"][2], {})       # what the kubelet hands to sh
    assert "--nnodes 2 --nproc-per-node 8" in script and '"$JOB_COMPLETION_INDEX"' in script
    svc = M.probe_service(KIMI, "inter", UID)
    assert svc["spec"]["selector"]["batch.kubernetes.io/job-completion-index"] == "0"
    assert M.probe_names("inter", UID)["service"] in c["command"][2]


def test_baseline_and_variant_select_only_their_own_pods():
    """Gate 6: the baseline's StatefulSet selector and anti-affinity exclude a variant's pods (the variant label
    is absent: DoesNotExist) and a variant's include only its own; both objects pass the real schema."""
    ref = IMAGES["sglang"].ref
    base = M.engine_statefulset(KIMI, "sglang", UID, ref)
    var = M.engine_statefulset(KIMI, "sglang", UID, ref, variant="prefix-cache")
    for sts in (base, var):
        kubernetes_validate.validate(sts, K8S_VERSION, strict=True)
        anti = sts["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"][0]["labelSelector"]
        assert anti == sts["spec"]["selector"]
    base_pod = base["spec"]["template"]["metadata"]["labels"]
    var_pod = var["spec"]["template"]["metadata"]["labels"]
    assert "gauntlet.dev/variant" not in base_pod and var_pod["gauntlet.dev/variant"] == "prefix-cache"
    # the baseline's: its labels, and no variant label at all; the variant's: its labels, its variant's name among them
    assert base["spec"]["selector"] == {"matchLabels": {k: base_pod[k] for k in base["spec"]["selector"]["matchLabels"]},
                                        "matchExpressions": [{"key": "gauntlet.dev/variant", "operator": "DoesNotExist"}]}
    assert var["spec"]["selector"] == {"matchLabels": {k: var_pod[k] for k in var["spec"]["selector"]["matchLabels"]}}
    assert var["spec"]["selector"]["matchLabels"]["gauntlet.dev/variant"] == "prefix-cache"
    assert base["metadata"]["name"] != var["metadata"]["name"]
    for svc in M.engine_objects(KIMI, "sglang", UID, ref, variant="prefix-cache")[:2]:
        assert svc["spec"]["selector"]["gauntlet.dev/variant"] == "prefix-cache"
        assert svc["metadata"]["labels"]["gauntlet.dev/variant"] == "prefix-cache"


def test_engine_selector_names_the_baseline_by_absence():
    assert M.engine_selector("sglang") == "gauntlet.dev/component=engine,gauntlet.dev/engine=sglang,!gauntlet.dev/variant"
    assert M.engine_selector("sglang", "dspark").endswith(",gauntlet.dev/variant=dspark")
