"""An engine's env read from a Secret: a secretKeyRef on the cluster, the runner's own variable locally, and
its value nowhere gauntlet writes (verdicts, the profile ConfigMap, the report, the probe's env)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import yaml

from gauntlet.params import load_images, load_profile, profile_path
from gauntlet.params.models import Profile, SecretRef
from gauntlet.steps.backends.kubernetes import manifests as M
from gauntlet.steps.engines.commands import args_hash, engine_env
from gauntlet.steps.gates.network import probe_env

from conftest import REPO

REF = {"secret": "hf-read", "key": "token"}
VALUE = "t0k-never-written-anywhere"


def _with_secret(name: str = "kimi-k3-h20", engine: str = "vllm") -> dict:
    doc = yaml.safe_load(profile_path(name).read_text())
    doc["engines"][engine]["env"]["HF_TOKEN"] = dict(REF)
    return doc


def test_statefulset_references_the_secret_and_validates():
    p = Profile.model_validate(_with_secret())
    sts = M.engine_statefulset(p, "vllm", "u" * 36, load_images()["vllm"].ref)
    kubernetes_validate.validate(sts, "1.37.0", strict=True)
    env = sts["spec"]["template"]["spec"]["containers"][0]["env"]
    (hf,) = [e for e in env if e["name"] == "HF_TOKEN"]
    assert hf == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-read", "key": "token"}}}


def test_secret_stays_out_of_plans_hashes_and_the_probe():
    plain = Profile.model_validate(_with_secret()).engines["vllm"]
    assert "HF_TOKEN" not in engine_env("vllm", plain)
    assert "HF_TOKEN" not in probe_env(Profile.model_validate(_with_secret()), "vllm")
    assert args_hash("vllm", plain) == args_hash("vllm", load_profile("kimi-k3-h20").engines["vllm"])


def test_the_profile_configmap_carries_the_reference_and_round_trips(tmp_path):
    from gauntlet.workflows.render import render_profile
    p = Profile.model_validate(_with_secret())
    paths = render_profile(p, tmp_path)
    (cm_path,) = [x for x in paths if x.name.endswith(".profile.yaml")]
    cm = yaml.safe_load(cm_path.read_text())
    back = Profile.model_validate(yaml.safe_load(cm["data"][f"{p.name}.yaml"]))    # what every step pod loads
    assert back.engines["vllm"].secret_env == {"HF_TOKEN": SecretRef(**REF)}


def test_the_report_shows_the_reference_and_quoted_flags():
    from gauntlet.steps.evidence.report import render_markdown
    doc = _with_secret()
    doc["engines"]["vllm"]["args"]["speculative"] = {"method": "eagle", "num_speculative_tokens": 2}
    text = render_markdown({"run_id": "r", "verdicts": {}, "corrupt": {}}, profile=Profile.model_validate(doc))
    (env_line,) = [x for x in text.splitlines() if x.startswith("  env:") and "HF_TOKEN" in x]
    assert "HF_TOKEN=<secret hf-read/token>" in env_line and "NCCL_CUMEM_ENABLE=1" in env_line
    (vllm_flags,) = [x for x in text.splitlines() if x.startswith("- **vllm** flags:")]
    assert """--speculative-config '{"method":"eagle","num_speculative_tokens":2}'""" in vllm_flags


def _deploy(tmp_path: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess, dict, str]:
    doc = _with_secret("local-cpu")
    doc["model"]["mount_path"] = str(tmp_path / "no-model")        # stops the gate before an engine starts
    prof = tmp_path / "profile.yaml"
    prof.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = tmp_path / "run" / "vllm" / "deploy"
    base = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
    r = subprocess.run([sys.executable, "-m", "gauntlet.workflows.cli", "step", "deploy", "--profile", str(prof),
                        "--out", str(out), "--engine", "vllm"], cwd=REPO, capture_output=True, text=True,
                       timeout=120, env={**base, **env})
    everything = "".join(f.read_text(errors="replace") for f in out.rglob("*") if f.is_file()) + r.stdout + r.stderr
    return r, json.loads((out / "verdict.json").read_text()), everything


def test_local_deploy_without_the_variable_fails_naming_it(tmp_path):
    r, v, _ = _deploy(tmp_path, {})
    assert r.returncode == 1
    (check,) = v["checks"]
    assert check["name"] == "secret-env" and check["status"] == "fail"
    assert "engines.vllm.env.HF_TOKEN reads <secret hf-read/token> on a cluster; locally export HF_TOKEN" in \
        check["detail"]


def test_local_deploy_never_records_the_value(tmp_path):
    r, v, everything = _deploy(tmp_path, {"HF_TOKEN": VALUE})
    assert r.returncode == 1 and v["checks"][0]["name"] == "model-dir"       # got past the secret check
    assert v["metrics"]["env"]["HF_TOKEN"] == "<secret hf-read/token> (the runner's $HF_TOKEN)"
    assert VALUE not in everything
