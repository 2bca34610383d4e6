"""RDMA inside the engine and NCCL-probe pods as the profile declares it, Gate 1's per-node NCCL/GLOO env passed on
to network and deploy, lint's refusal of an RDMA profile whose pods get no device, and Gate 1 judging the transport
NCCL really used, on real NCCL logs from an H200 and on lines written from NCCL's own format strings
(tests/fixtures/nccl/README.md)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import sysfs_tree as T
import yaml

from gauntlet.contract import UsageError
from gauntlet.params import load_images, load_profile
from gauntlet.params.loader import PROFILES_DIR
from gauntlet.params.models import FabricSpec
from gauntlet.steps.cluster import fabric as _fabric
from gauntlet.steps.gates import deploy
from gauntlet.steps.gates import network
from gauntlet.steps.gates import nodes
from gauntlet.steps.backends.kubernetes import manifests as M
from gauntlet.steps.runner import run_step
from gauntlet.workflows import refs
from gauntlet.workflows.graph import build_graph
from gauntlet.workflows.lint import profile_rules
from gauntlet.workflows.render import render_documents

KIMI = load_profile("kimi-k3-h20")
ONE = load_profile("h200-1gpu")
IMAGES = load_images()
UID = "5b1c7a0e-3d2f-4e6a-9b8c-0123456789ab"
FIX = Path(__file__).parent / "fixtures" / "nccl"
NODE_ENV = {"h20-node-01": {"NCCL_SOCKET_IFNAME": "ibp0", "GLOO_SOCKET_IFNAME": "ibp0",
                            "NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1", "NCCL_IB_GID_INDEX": "3"},
            "h20-node-02": {"NCCL_SOCKET_IFNAME": "ibp1", "GLOO_SOCKET_IFNAME": "ibp1",
                            "NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1", "NCCL_IB_GID_INDEX": "3"}}


def with_fabric(profile=KIMI, **fabric):
    return profile.model_copy(update={"hardware": profile.hardware.model_copy(
        update={"fabric": FabricSpec(**fabric)})})


def pod_of(obj):
    return obj["spec"]["template"]["spec"]


def nccl_pods(profile, node_env=None):
    engine = M.engine_statefulset(profile, "sglang", UID, IMAGES["sglang"].ref, node_env=node_env)
    probe = M.probe_job(profile, "inter", UID, IMAGES["sglang"].ref, network.probe_env(profile, "sglang"),
                        "print('probe')", ["--sizes", "1"], node_env)
    return {"engine": engine, "probe": probe}


# ---- the pods carry the fabric ------------------------------------------------------------------------------

def test_kimi_pods_request_the_rdma_resource_with_ipc_lock_and_validate():
    for container, obj in nccl_pods(KIMI, NODE_ENV).items():
        kubernetes_validate.validate(obj, "1.37.0", strict=True)
        c = next(x for x in pod_of(obj)["containers"] if x["name"] == container)
        for side in ("requests", "limits"):
            assert c["resources"][side]["rdma/hca_shared_devices_a"] == "1", container
            assert c["resources"][side]["nvidia.com/gpu"] == "8", container
        assert c["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}
        assert M.rdma_device_of(pod_of(obj), "rdma/hca_shared_devices_a", container) == \
            "resource rdma/hca_shared_devices_a: 1"


def test_device_path_form_mounts_the_host_directory_privileged():
    prof = with_fabric(device_path="/dev/infiniband", privileged=True, capabilities=["IPC_LOCK", "SYS_RESOURCE"])
    for container, obj in nccl_pods(prof).items():
        kubernetes_validate.validate(obj, "1.37.0", strict=True)
        spec = pod_of(obj)
        c = next(x for x in spec["containers"] if x["name"] == container)
        assert {"name": "rdma-dev", "mountPath": "/dev/infiniband"} in c["volumeMounts"]
        assert {"name": "rdma-dev", "hostPath": {"path": "/dev/infiniband", "type": "Directory"}} in spec["volumes"]
        assert c["securityContext"] == {"capabilities": {"add": ["IPC_LOCK", "SYS_RESOURCE"]}, "privileged": True}
        assert "rdma/hca_shared_devices_a" not in c["resources"]["limits"]
        assert M.rdma_device_of(spec, None, container) == "/dev/infiniband (privileged)"


def test_gate1_env_is_exported_by_node_name_and_the_profile_value_wins():
    """Each node's settings from Gate 1 in the launch script's case on $NODE_NAME; a value the profile fixes is
    plain env for every node and never overridden per node."""
    prof = with_fabric(rdma_resource="rdma/hca_shared_devices_a", ib_hca="=mlx5_bond_0:1")
    for container, obj in nccl_pods(prof, NODE_ENV).items():
        c = next(x for x in pod_of(obj)["containers"] if x["name"] == container)
        script = c["command"][2]
        assert ("h20-node-01) export NCCL_SOCKET_IFNAME=ibp0 GLOO_SOCKET_IFNAME=ibp0 NCCL_IB_GID_INDEX=3 ;;"
                in script), script
        assert "h20-node-02) export NCCL_SOCKET_IFNAME=ibp1 GLOO_SOCKET_IFNAME=ibp1" in script
        assert "NCCL_IB_HCA=" not in script.split("esac")[0]            # the profile's, not Gate 1's
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["NCCL_IB_HCA"] == "=mlx5_bond_0:1"


def test_the_shell_runs_the_case_and_exports_this_nodes_values(tmp_path):
    obj = nccl_pods(KIMI, NODE_ENV)["engine"]
    script = next(x for x in pod_of(obj)["containers"] if x["name"] == "engine")["command"][2]
    nic = script.split('rank="')[0].replace("$$", "$")        # the kubelet reads $$ as $
    out = subprocess.run(["sh", "-c", nic + 'echo "$NCCL_SOCKET_IFNAME|$NCCL_IB_HCA|$NCCL_IB_GID_INDEX"'],
                         env={"NODE_NAME": "h20-node-02", "PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    assert out.stdout.strip() == "ibp1|=mlx5_0:1,mlx5_1:1|3", out.stderr


# ---- lint refuses an RDMA profile whose pods get no device ----------------------------------------------------

@pytest.mark.parametrize("fabric, why", [({}, "no hardware.fabric.rdma_resource or device_path"),
                                         ({"device_path": "/dev/infiniband"}, "without privileged: true")])
def test_lint_refuses_rdma_profile_without_a_device_in_one_line(fabric, why):
    (f,) = profile_rules(with_fabric(**fabric), [])
    assert f.rule == "rdma-device" and why in f.message
    assert "engine sglang (StatefulSet), engine vllm (StatefulSet), NCCL probe (Job)" in f.message
    assert profile_rules(KIMI, []) == []
    assert profile_rules(ONE, []) == []           # rdma_required: false (one node)


def test_gauntlet_lint_profile_refuses_without_a_traceback(tmp_path):
    data = yaml.safe_load((PROFILES_DIR / "kimi-k3-h20.yaml").read_text())
    del data["hardware"]["fabric"]
    p = tmp_path / "no-rdma.yaml"
    p.write_text(yaml.safe_dump(data))
    r = subprocess.run([sys.executable, "-m", "gauntlet.workflows.cli", "lint", "--profile", str(p)],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "[rdma-device]" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len([x for x in r.stderr.splitlines() if "rdma-device" in x]) == 1


def test_a_bad_fabric_is_one_profile_error():
    with pytest.raises(ValueError, match="give one way into the fabric"):
        FabricSpec(rdma_resource="rdma/hca_shared_devices_a", device_path="/dev/infiniband")
    with pytest.raises(ValueError, match="ib_hca"):
        FabricSpec(ib_hca="mlx5_0; reboot")


# ---- Gate 1's outputs reach network and deploy ------------------------------------------------------------------

def test_graph_passes_each_nodes_env_to_network_and_networks_to_every_deploy():
    g = build_graph(KIMI, "argo")
    net = g.main.task("network")
    assert net.args == ("--nccl-env", f"h20-node-01={refs.output('nodes-0', 'nccl_env')}",
                        f"h20-node-02={refs.output('nodes-1', 'nccl_env')}")
    assert "nccl_env" in g.main.task("nodes-0").outputs and net.outputs == ("nccl_env",)
    for engine in ("sglang", "vllm"):
        assert g.main.task(engine).inputs["nccl-env"] == str(refs.output("network", "nccl_env"))
    seq = g.sequences[0]
    assert "nccl-env" in seq.inputs
    assert seq.task("deploy").args[-2:] == ("--nccl-env", str(refs.input_param("nccl-env")))
    local = build_graph(load_profile("local-cpu"), "local")
    assert "--nccl-env" not in local.sequences[0].task("deploy").args


def test_rendered_template_wires_the_outputs():
    wt = render_documents(KIMI)["gauntlet-kimi-k3-h20.workflowtemplate.yaml"]
    by = {t["name"]: t for t in wt["spec"]["templates"]}
    outs = {p["name"]: p["valueFrom"] for p in by["nodes-0"]["outputs"]["parameters"]}
    assert outs["nccl_env"]["path"].endswith("/nodes-0/outputs/nccl_env") and outs["nccl_env"]["default"] == ""
    assert "h20-node-02={{inputs.parameters.nodes-1-nccl_env}}" in by["network"]["container"]["args"]
    main = {t["name"]: t for t in by["main"]["dag"]["tasks"]}
    assert {"name": "nccl-env", "value": "{{tasks.network.outputs.parameters.nccl_env}}"} in \
        main["vllm"]["arguments"]["parameters"]
    assert "{{inputs.parameters.nccl-env}}" in by["seq-deploy"]["container"]["args"]


def test_deploy_and_network_take_the_env_and_refuse_bad_input_in_one_line():
    opts = deploy.Options(profile=KIMI, engine="sglang", nccl_env=json.dumps(NODE_ENV))
    assert opts.node_envs() == NODE_ENV
    assert deploy.Options(profile=KIMI, engine="sglang", nccl_env="").node_envs() == {}     # Argo's default
    n = network.Options(profile=KIMI, nccl_env=(f"h20-node-01={_fabric.encode(NODE_ENV['h20-node-01'])}",
                                                "h20-node-02="))
    assert n.node_envs() == {"h20-node-01": NODE_ENV["h20-node-01"], "h20-node-02": {}}
    for bad, match in (("{not json", "not JSON"), ('{"elsewhere": {}}', "not a node of profile"),
                       ('{"h20-node-01": {"LD_PRELOAD": "x"}}', "expected an object of NCCL_SOCKET_IFNAME")):
        with pytest.raises(UsageError, match=match) as e:
            deploy.Options(profile=KIMI, engine="sglang", nccl_env=bad)
        assert str(e.value).startswith("--nccl-env") and "\n" not in str(e.value)
    with pytest.raises(UsageError, match="expected NODE=JSON"):
        network.Options(profile=KIMI, nccl_env=("h20-node-01",))


def test_nodes_writes_its_resolved_env_with_the_roce_v2_gid(tmp_path, monkeypatch):
    root = tmp_path / "root"
    T.nic(root, "eth0", pci="0000:01:00.0")
    for i in range(2):
        T.nic(root, f"ens{i}", mtu=4200, pci=f"0000:1{i}:00.0")
        T.rdma(root, f"mlx5_{i}", f"ens{i}", layer="Ethernet", pci=f"0000:1{i}:00.0")
        port = root / f"sys/class/infiniband/mlx5_{i}/ports/1"
        for g, (kind, gid) in enumerate([("IB/RoCE v1", "fe80:0000:0000:0000:0225:9dff:fe64:c79a"),
                                         ("RoCE v2", "fe80:0000:0000:0000:0225:9dff:fe64:c79a"),
                                         ("IB/RoCE v1", "0000:0000:0000:0000:0000:ffff:0a00:0001"),
                                         ("RoCE v2", "0000:0000:0000:0000:0000:ffff:0a00:0001")]):
            (port / "gid_attrs/types").mkdir(parents=True, exist_ok=True)
            (port / "gids").mkdir(exist_ok=True)
            (port / f"gid_attrs/types/{g}").write_text(kind + "\n")
            (port / f"gids/{g}").write_text(gid + "\n")
    T.nvme_mount(root, KIMI.model.mount_path)
    T.model_cache(root, KIMI.model.mount_path, shards=96, shard_bytes=10)
    monkeypatch.setenv("PATH", str(tmp_path))          # no nvidia-smi: the GPU checks fail, the env is still written
    out = tmp_path / "out"
    args = argparse.Namespace(profile="kimi-k3-h20", out=str(out), node="h20-node-01", run_id="uid-1",
                              root=str(root), cache_path=None, no_probe=True, no_api=True)
    run_step(nodes, args)
    env = json.loads((out / "outputs" / "nccl_env").read_text())
    assert env == {"NCCL_SOCKET_IFNAME": "ens0", "GLOO_SOCKET_IFNAME": "ens0",
                   "NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1", "NCCL_IB_GID_INDEX": "3"}
    assert _fabric.roce_v2_gid_index(root, "mlx5_0", 1) == 3


# ---- Gate 1 judges what NCCL did ----------------------------------------------------------------------------------

def test_real_h200_socket_fallback_fails_an_rdma_profile_naming_interface_and_reason():
    log = (FIX / "h200-1rank-init-net-graph.log").read_text()
    c = network.judge_transport("inter", log, KIMI.hardware.network)
    assert c.status == "fail"
    assert "Using network Socket" in c.detail and "[0]eth0:192.0.2.2<0>" in c.detail
    assert "'NET/IB : No device found.'" in c.detail
    assert c.observed == {"vm/0": {"network": "Socket", "socket_if": "[0]eth0:192.0.2.2<0>", "inter": {}, "intra": {}}}
    assert network.judge_transport("inter", log, ONE.hardware.network).status == "pass"   # RDMA not required
    assert network.judge_transport("intra", log, KIMI.hardware.network).status == "skip"  # one rank: no peers


def test_real_h200_forced_ib_without_a_device_fails_with_ncclls_own_words():
    c = network.judge_transport("inter", (FIX / "h200-1rank-nccl-net-ib.log").read_text(), KIMI.hardware.network)
    assert c.status == "fail" and "'NET/IB : No device found.'" in c.detail
    assert "'Failed to initialize any NET plugin'" in c.detail


def test_source_lines_ib_between_nodes_pass_and_name_the_ranks_without_gdrdma():
    c = network.judge_transport("inter", (FIX / "two-nodes-ib.from-source.log").read_text(), KIMI.hardware.network)
    assert c.status == "pass", c.detail
    assert "NET/IB/GDRDMA on 5 channel(s)" in c.detail and "without GPUDirect RDMA on ranks [9]" in c.detail
    assert c.observed["h20-node-01/0"]["inter"] == {"NET/IB/GDRDMA": 1}
    assert c.observed["h20-node-01/0"]["intra"] == {"P2P/CUMEM": 1, "SHM": 1}
    assert c.observed["h20-node-02/9"]["inter"] == {"NET/IB": 1}
    assert c.observed["h20-node-01/1"]["inter"] == {"NET/IB/GDRDMA": 1}      # the PXN form NET/IB/0(0)/GDRDMA


def test_source_lines_socket_between_nodes_fail_naming_each_interface():
    c = network.judge_transport("inter", (FIX / "two-nodes-socket.from-source.log").read_text(),
                                KIMI.hardware.network)
    assert c.status == "fail"
    assert "NET/Socket between nodes on 4 channel(s)" in c.detail
    assert "[0]eth0:10.0.0.1<0>, [0]eth0:10.0.0.2<0>" in c.detail and "'NET/IB : No device found.'" in c.detail


def test_within_a_node_p2p_passes_and_net_fails():
    ok = "\n".join(["h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
                    "h:2:2 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/CUMEM/read"])
    assert network.judge_transport("intra", ok, KIMI.hardware.network).status == "pass"
    bad = ok + "\nh:1:1 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] [send] via NET/Socket/0"
    c = network.judge_transport("intra", bad, KIMI.hardware.network)
    assert c.status == "fail" and "NET/Socket" in c.detail


def test_network_gives_each_probe_pod_its_nodes_env_and_passes_the_set_on(monkeypatch, tmp_path):
    """The step with the API double: the probe Jobs export Gate 1's per-node env, the real H200 log in the
    inter phase fails the transport check, and the env goes out as the nccl_env output."""
    from k8s_double import K8sDouble

    from gauntlet.steps.cluster import nccl_probe as _nccl_probe
    from gauntlet.steps.backends.kubernetes import network as _network_launch
    res = {"world_size": 16, "backend": "nccl", "nccl": "2.28.9", "results": [
        {"op": op, "bytes": 1 << 30, "time_us": 1.0, "algbw_gbps": 500.0, "busbw_gbps": 500.0, "correct": True,
         "error": None} for op in _nccl_probe.OPS]}
    real = (FIX / "h200-1rank-init-net-graph.log").read_text()
    with K8sDouble() as d:
        monkeypatch.setenv("GAUNTLET_KUBE_API", d.url)
        monkeypatch.setattr(_network_launch, "POLL_S", 0.02)
        d.pod_status = lambda pod: {"phase": "Succeeded", "containerStatuses": [
            {"name": "probe", "ready": False, "restartCount": 0, "state": {"terminated": {"exitCode": 0}}}]}
        d.pod_log = lambda pod, c: real.split("GAUNTLET_NCCL_RESULT")[0] + _nccl_probe.RESULT_PREFIX + json.dumps(res)
        for i, node in enumerate(NODE_ENV):
            (tmp_path / f"nodes-{i}").mkdir()
            (tmp_path / f"nodes-{i}" / "inventory.json").write_text(json.dumps({"node": node, "nccl_env": NODE_ENV[node]}))
        out = tmp_path / "network"
        out.mkdir()
        opts = network.Options(profile=KIMI, run_id=UID, backend="kubernetes",
                               nccl_env=tuple(f"{n}={_fabric.encode(e)}" for n, e in NODE_ENV.items()))
        checks, metrics = network.run(opts, out)
    c = {x.name: x for x in checks}
    assert c["inter_transport"].status == "fail" and "'NET/IB : No device found.'" in c["inter_transport"].detail
    assert c["intra_transport"].status == "skip"
    job = json.loads((out / "probe-inter-manifests.json").read_text())[-1]
    script = job["spec"]["template"]["spec"]["containers"][0]["command"][2]
    assert "h20-node-02) export NCCL_SOCKET_IFNAME=ibp1 GLOO_SOCKET_IFNAME=ibp1" in script
    assert json.loads(metrics["outputs"]["nccl_env"]) == NODE_ENV
    assert metrics["phases"]["inter"]["per_rank"]["vm/0"]["network"] == "Socket"


def test_every_task_that_deploys_an_engine_gets_gate1s_nccl_env():
    """deploy, the ladder's restarts and each variant's deploy start engines: all get the same --nccl-env."""
    from gauntlet.workflows import refs
    from gauntlet.workflows.graph import NCCL_ENV_INPUT, build_graph

    seq = build_graph(load_profile("kimi-k3-h20"), "argo").sequences[0]
    want = str(refs.input_param(NCCL_ENV_INPUT))
    deploying = [t for t in seq.tasks if t.step in ("deploy", "longctx", "experiment")]
    assert {t.step for t in deploying} == {"deploy", "longctx", "experiment"}
    for t in deploying:
        assert "--nccl-env" in t.args and t.args[t.args.index("--nccl-env") + 1] == want, t.name
