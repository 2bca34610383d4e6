"""The pinned images (params/images.yaml): each records the version it holds and whether its digest was verified;
a cluster profile pulling a stand-in digest is refused by render/lint/submit unless the override is given, and
Gate 0's engine-check fails when the engine inside the image is another version than the pin.

No registry is reachable here, so no digest can be verified: the refusal is shown on the real images.yaml (every
digest a stand-in) and its absence on a copy whose entries say ``verified: true``."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gauntlet.contract import Verdict
from gauntlet.params import ProfileError, load_images, load_profile
from gauntlet.params.loader import IMAGES_FILE
from gauntlet.steps.engines.sglang import REPLIES as SGLANG_REPLIES
from gauntlet.steps.engines.vllm import REPLIES as VLLM_REPLIES
from gauntlet.steps.gates.engine_check import collect, judge, planned_argvs
from gauntlet.workflows.render import (ALLOW_UNVERIFIED_ENV, UNVERIFIED_ANNOTATION, render_documents,
                                       unverified_images)

from conftest import require_sglang

REPO = Path(__file__).resolve().parent.parent


def _cli(*argv: str, env: dict[str, str] | None = None, allow: bool = False) -> subprocess.CompletedProcess[str]:
    import os
    base = {k: v for k, v in os.environ.items() if k != ALLOW_UNVERIFIED_ENV}
    return subprocess.run([sys.executable, "-m", "gauntlet.workflows.cli", *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env={**base, **(env or {}), **({ALLOW_UNVERIFIED_ENV: "1"} if allow else {})})


def _images_copy(tmp_path: Path, **changes: dict) -> Path:
    data = yaml.safe_load(IMAGES_FILE.read_text())
    for key, fields in changes.items():
        data["images"][key].update(fields)
    path = tmp_path / "images.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# ---- the pins themselves

def test_the_sglang_pin_is_the_release_the_adapter_was_checked_against():
    """The adapter, its reply rules and .ci/install-sglang.sh are SGLang 0.5.23's; the pin was v0.6.1-cu130.
    SGLang's release workflow names the CUDA 13.0 build of release X ``vX-cu130``."""
    sglang = load_images()["sglang"]
    assert sglang.version == SGLANG_REPLIES.version == "0.5.23"
    assert sglang.tag == f"v{sglang.version}-cu130" and sglang.internal.endswith(f":v{sglang.version}-cu130")
    assert load_images()["vllm"].version == VLLM_REPLIES.version
    if importlib.util.find_spec("sglang") is not None:     # the installed one Gate 0's tests use
        import sglang as installed
        assert installed.__version__ == sglang.version


def test_every_entry_records_its_version_and_says_whether_it_is_verified():
    raw = yaml.safe_load(IMAGES_FILE.read_text())["images"]
    assert all("version" in e and "verified" in e for e in raw.values()), [k for k, e in raw.items()
                                                                          if "version" not in e]
    # nothing here was read from a registry: every entry says so
    assert not any(img.verified for img in load_images().values())


def test_an_entry_without_a_version_is_refused(tmp_path):
    data = yaml.safe_load(IMAGES_FILE.read_text())
    del data["images"]["steps"]["version"]
    (tmp_path / "i.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError, match=r"images.steps.version: required"):
        load_images(tmp_path / "i.yaml")


def test_an_all_zero_digest_cannot_be_verified(tmp_path):
    path = _images_copy(tmp_path, **{"local-vllm-cpu": {"verified": True}})
    with pytest.raises(ProfileError, match=r"images.local-vllm-cpu.*all-zero digest is a stand-in"):
        load_images(path)


# ---- render / lint / submit

def test_rendered_template_names_its_unverified_images():
    docs = render_documents(load_profile("kimi-k3-h20"))
    wt = docs["gauntlet-kimi-k3-h20.workflowtemplate.yaml"]
    assert wt["metadata"]["annotations"][UNVERIFIED_ANNOTATION] == "sglang,steps,steps-vllm,vllm"
    assert unverified_images(docs) == ["sglang", "steps", "steps-vllm", "vllm"]


def test_cluster_profile_with_stand_in_digests_is_refused_in_one_line(tmp_path):
    for argv in (["lint", "--profile", "kimi-k3-h20"],
                 ["render", "--profile", "kimi-k3-h20", "--out", str(tmp_path / "out")],
                 ["submit", "--profile", "kimi-k3-h20", "--dry-run", "--out", str(tmp_path / "sub")]):
        r = _cli(*argv)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 2 and len(lines) == 1, (argv, r.stderr)
        assert "kimi-k3-h20 (purpose: cluster)" in lines[0] and "sglang, steps, steps-vllm, vllm" in lines[0]
        assert "--allow-unverified-images" in lines[0] and "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "sub").exists()     # nothing written


def test_the_override_renders_them_and_the_template_records_it(tmp_path):
    r = _cli("render", "--profile", "kimi-k3-h20", "--out", str(tmp_path / "a"), "--allow-unverified-images")
    assert r.returncode == 0 and "lint: ok" in r.stdout, r.stderr
    wt = yaml.safe_load((tmp_path / "a" / "gauntlet-kimi-k3-h20.workflowtemplate.yaml").read_text())
    assert wt["metadata"]["annotations"][UNVERIFIED_ANNOTATION] == "sglang,steps,steps-vllm,vllm"
    r = _cli("lint", "--profile", "kimi-k3-h20", allow=True)        # the environment's override, as tests use
    assert r.returncode == 0 and "lint: ok" in r.stdout, r.stderr


def test_a_test_profile_renders_stand_ins_without_the_override(tmp_path):
    assert load_profile("h200-1gpu").purpose == "test" and load_profile("kimi-k3-h20").purpose == "cluster"
    r = _cli("lint", "--profile", "h200-1gpu")
    assert r.returncode == 0 and "lint: ok" in r.stdout, r.stderr


def test_verified_digests_render_without_the_override_or_an_annotation(tmp_path):
    path = _images_copy(tmp_path, **{k: {"verified": True} for k in ("steps", "steps-vllm", "sglang", "vllm")})
    r = _cli("render", "--profile", "kimi-k3-h20", "--out", str(tmp_path / "o"), env={"GAUNTLET_IMAGES": str(path)})
    assert r.returncode == 0, r.stderr
    wt = yaml.safe_load((tmp_path / "o" / "gauntlet-kimi-k3-h20.workflowtemplate.yaml").read_text())
    assert UNVERIFIED_ANNOTATION not in wt["metadata"].get("annotations", {})
    # one stand-in left is enough to refuse, and it is named
    path = _images_copy(tmp_path, **{k: {"verified": True} for k in ("steps", "steps-vllm", "vllm")})
    r = _cli("lint", "--profile", "kimi-k3-h20", env={"GAUNTLET_IMAGES": str(path)})
    assert r.returncode == 2 and "not verified: sglang (" in r.stderr, r.stderr


# ---- Gate 0: the engine inside the image is the pinned version

@pytest.mark.slow
def test_engine_check_fails_when_the_installed_vllm_is_not_the_pinned_version(tmp_path):
    """The real vLLM CPU build (its own __version__ 0.32.0) against a pin that says 0.6.1: failed, naming both."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed")
    path = _images_copy(tmp_path, **{"local-vllm-cpu": {"version": "0.6.1"}})
    r = _cli("step", "engine-check", "--profile", "local-cpu", "--engine", "vllm", "--out", str(tmp_path / "e"),
             env={"GAUNTLET_IMAGES": str(path)})
    assert r.returncode == 1, r.stderr[-2000:]
    c = {c.name: c for c in Verdict.read(tmp_path / "e").checks}["engine-version"]
    assert c.status == "fail" and "'0.32.0'" in c.detail and "'0.6.1'" in c.detail and "local-vllm-cpu" in c.detail


@pytest.mark.slow
def test_engine_check_fails_when_the_installed_sglang_is_not_the_pinned_version(tmp_path):
    """The real SGLang (its own __version__ 0.5.23) against the old pin's 0.6.1: failed, naming both; the
    pinned 0.5.23 passes."""
    require_sglang()
    from gauntlet.steps.engines.sglang import SglangAdapter
    adapter = SglangAdapter()
    kimi = load_profile("kimi-k3-h20")
    argvs = {"rank0": planned_argvs(kimi, "sglang", "/m")["rank0"]}
    for pinned, status in (("0.6.1", "fail"), (load_images()["sglang"].version, "pass")):
        facts = collect(adapter, argvs, pinned={"image": "sglang", "version": pinned})
        (c,) = [c for c in judge(facts, kimi, "sglang", None, "") if c.name == "engine-version"]
        assert c.status == status and c.observed == "0.5.23" and c.expected == pinned, c.detail
        assert status == "pass" or ("'0.5.23'" in c.detail and "'0.6.1'" in c.detail)
