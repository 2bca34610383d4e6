"""Profiles: both shipped profiles validate; bad ones exit 2 with one line naming file and field."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gauntlet.params import ProfileError, load_images, load_profile
from gauntlet.params.loader import IMAGES_FILE, PROFILES_DIR

KIMI = PROFILES_DIR / "kimi-k3-h20.yaml"


def _write(tmp_path: Path, data: dict, name: str = "bad.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def _kimi() -> dict:
    return yaml.safe_load(KIMI.read_text())


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    import os
    e = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "gauntlet.workflows.cli", *args], capture_output=True, text=True, env=e)


def test_shipped_profiles_validate():
    kimi = load_profile("kimi-k3-h20")
    assert kimi.hardware.total_gpus == 16
    assert kimi.model.shards == 96 and kimi.model.weight_bytes == 1_560_936_091_448
    assert kimi.engines["sglang"].role == "baseline" and kimi.engines["vllm"].role == "experimental"
    assert kimi.engines["sglang"].env["NCCL_MNNVL_ENABLE"] == "1"
    assert kimi.engine_order() == ["sglang", "vllm"]
    local = load_profile("local-cpu")
    assert local.hardware.kind == "local" and local.baseline_engine == "vllm"


def test_unknown_expectations_stay_null():
    """Numbers that are not public are left for a person to fill, never invented."""
    arch = load_profile("kimi-k3-h20").model.architecture
    assert arch.num_hidden_layers is None and arch.layer_kinds is None
    assert arch.max_position_embeddings == 1_048_576


def _mutate(path: list, value) -> dict:
    d = _kimi()
    node = d
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return d


@pytest.mark.parametrize("path,value,needle", [
    (["engines", "sglang", "args", "tp_size"], "sixteen", "engines.sglang.args.tp_size: expected int, got 'sixteen'"),
    (["engines", "sglang", "args", "tp_sizee"], 16, "engines.sglang.args.tp_sizee: unknown key"),
    (["hardware", "gpus_per_node"], "8", "hardware.gpus_per_node: expected int, got '8'"),
    (["engines", "sglang", "args", "kv_cache_dtype"], "fp8_e4m3", "FP8 KV cache is refused on Hopper"),
    (["bench", "rounds"], 1, "bench.rounds: the plan measures at least 3 rounds"),
    (["engines", "vllm", "role"], "baseline", "exactly one engine must have role 'baseline'"),
])
def test_bad_profile_one_line_exit_2(tmp_path, path, value, needle):
    p = _write(tmp_path, _mutate(path, value))
    with pytest.raises(ProfileError) as exc:
        load_profile(p)
    assert needle in str(exc.value) and str(p) in str(exc.value)
    r = _cli("lint", "--profile", str(p))
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("ProfileError: ") and needle in lines[0]
    assert "Traceback" not in r.stderr


def test_two_changes_in_one_variant_is_rejected(tmp_path):
    d = _kimi()
    d["experiments"][0]["change"] = {"prefix_cache": True, "hicache": True}
    r = _cli("render", "--profile", str(_write(tmp_path, d)), "--out", str(tmp_path / "out"))
    assert r.returncode == 2
    assert "experiments.0.change: a variant changes exactly one variable, got 2" in r.stderr
    assert not (tmp_path / "out").exists()


def test_image_without_digest_is_rejected(tmp_path):
    images = yaml.safe_load(IMAGES_FILE.read_text())
    images["images"]["sglang"]["digest"] = "latest"
    ipath = _write(tmp_path, images, "engines.yaml")
    with pytest.raises(ProfileError, match=r"images.sglang.digest: expected a sha256:<64 hex> manifest digest"):
        load_images(ipath)
    r = _cli("render", "--profile", "kimi-k3-h20", "--out", str(tmp_path / "o"), env={"GAUNTLET_IMAGES": str(ipath)})
    assert r.returncode == 2 and "images.sglang.digest" in r.stderr and "Traceback" not in r.stderr


def test_engine_image_must_be_pinned(tmp_path):
    d = _kimi()
    d["engines"]["sglang"]["image"] = "sglang-nightly"
    with pytest.raises(ProfileError, match="engines.sglang.image: image 'sglang-nightly' is not pinned"):
        load_profile(_write(tmp_path, d))


def test_yaml_syntax_error_names_the_line(tmp_path):
    p = tmp_path / "broken.yaml"
    p.write_text("name: x\nhardware: [\n")
    r = _cli("lint", "--profile", str(p))
    assert r.returncode == 2 and "broken.yaml" in r.stderr and "invalid YAML" in r.stderr


def test_unknown_profile_name_lists_known():
    r = _cli("render", "--profile", "no-such-profile")
    assert r.returncode == 2 and "kimi-k3-h20" in r.stderr
