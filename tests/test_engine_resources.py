"""The engine container requests the CPU and memory it holds, so under node memory pressure it is not the first pod
the kubelet evicts (gauntlet.steps.backends.kubernetes.manifests ``engine_resources``).

The kubelet ranks pods for eviction by whether their usage exceeds their requests, then priority, then how far
past (k8s.io/kubernetes pkg/kubelet/eviction/helpers.go ``rankMemoryPressure``). No kubelet evicts anything here
(the box's kubelet is a process stand-in without cgroups): these tests read the rendered objects, validated against
Kubernetes 1.37's schema, for the requests the ranking reads.
"""

from __future__ import annotations

import kubernetes_validate
import pytest

from gauntlet.params import load_profile
from gauntlet.params.loader import ProfileError, profile_path
from gauntlet.steps.backends.kubernetes import manifests as M
from gauntlet.steps.gates.deploy import Options

KIMI = load_profile("kimi-k3-h20")
UID = "0123456789ab-uid"


def _engine(profile, engine: str, variant: str | None = None) -> dict:
    spec = Options(profile=profile, engine=engine, variant=variant, run_id=UID).engine_spec()
    sts = M.engine_statefulset(profile, engine, UID, "img", spec, variant)
    kubernetes_validate.validate(sts, "1.37.0", strict=True)
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    return c


def _gib(q: str) -> int:
    assert q.endswith("Gi"), q
    return int(q[:-2])


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_the_engine_requests_shm_plus_its_resident_size_and_cpus(engine):
    spec = KIMI.engine(engine)
    req = _engine(KIMI, engine)["resources"]["requests"]
    experts = engine == "sglang"           # the Kimi profile records SGLang's expert distribution (stat mode)
    assert _gib(req["memory"]) == spec.shm_size_gib + spec.resident_gib + M.SAMPLER_MEMORY_GIB[experts]
    assert _gib(req["memory"]) >= spec.shm_size_gib + spec.resident_gib > spec.shm_size_gib
    assert req["cpu"] == str(spec.cpus) and req["nvidia.com/gpu"] == "8"
    # requested, not limited: a burst past the request must not OOM-kill a rank that holds 8 GPUs
    assert set(_engine(KIMI, engine)["resources"]["limits"]) == {"nvidia.com/gpu", "rdma/hca_shared_devices_a"}


def test_the_hicache_variant_also_requests_its_host_pool():
    spec = KIMI.engine("sglang")
    base = _gib(_engine(KIMI, "sglang")["resources"]["requests"]["memory"])
    hicache = _gib(_engine(KIMI, "sglang", "hicache")["resources"]["requests"]["memory"])
    assert spec.hicache_host_gib and hicache == base + spec.hicache_host_gib


def test_a_profile_that_turns_hicache_on_must_say_its_host_pool(tmp_path):
    text = profile_path("kimi-k3-h20").read_text().replace("    hicache_host_gib: 320\n", "")
    bad = tmp_path / "kimi.yaml"
    bad.write_text(text)
    with pytest.raises(ProfileError, match="engines.sglang.hicache_host_gib: required: experiments hicache turn on"):
        load_profile(str(bad))
