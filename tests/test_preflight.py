"""Gate 0 preflight on real directories the tests write: a clean one passes, each corruption fails its check.

Every bad-input case runs the real `gauntlet step preflight` entry (in-process),
expects exit 1, a verdict.json, no traceback, and the named check failing with
a detail that names the cause.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from gauntlet.params import load_profile
from gauntlet.params.models import Profile
from gauntlet.contract import Verdict
from gauntlet.steps.model.synth import profile_of, synth_from_profile
from gauntlet.workflows.cli import main

KIMI = load_profile("kimi-k3-h20")
SHARD3 = "model-00003-of-00096.safetensors"
INDEX = "model.safetensors.index.json"


def _with(profile: Profile, **model: object) -> Profile:
    return profile.model_copy(update={"model": profile.model.model_copy(update=model)})


def _with_arch(profile: Profile, **arch: object) -> Profile:
    a = profile.model.architecture.model_copy(update=arch)
    return _with(profile, architecture=a)


def _total(d: Path) -> int:
    idx = json.loads((d / INDEX).read_text())
    return sum((d / n).stat().st_size for n in set(idx["weight_map"].values()))


@pytest.fixture(scope="module")
def clean_template(tmp_path_factory) -> Path:
    return synth_from_profile(KIMI, tmp_path_factory.mktemp("tmpl") / "kimi")


@pytest.fixture
def model(tmp_path, clean_template) -> Path:
    d = tmp_path / "model"
    shutil.copytree(clean_template, d)
    return d


@pytest.fixture
def profile(clean_template) -> Profile:
    """The Kimi profile with the synthetic directory's byte total and expert count (the small synth is not
    1.56 TB, nor 896 experts a layer)."""
    return profile_of(KIMI, clean_template)


def run_preflight(tmp_path: Path, model: Path, profile: Profile, *extra: str) -> tuple[int, Verdict]:
    pf = tmp_path / "profile.yaml"
    pf.write_text(yaml.safe_dump(profile.model_dump(mode="json")))
    out = tmp_path / "out"
    shutil.rmtree(out, ignore_errors=True)
    rc = main(["step", "preflight", "--profile", str(pf), "--model-path", str(model), "--out", str(out), *extra])
    assert not (out / "traceback.txt").exists(), (out / "traceback.txt").read_text()
    return rc, Verdict.read(out)


def failed(v: Verdict) -> dict[str, str]:
    return {c.name: c.detail for c in v.checks if c.status == "fail"}


def assert_fails(tmp_path, model, profile, check: str, *words: str, extra: tuple[str, ...] = ()) -> Verdict:
    rc, v = run_preflight(tmp_path, model, profile, *extra)
    assert rc == 1 and v.status == "fail"
    bad = failed(v)
    assert check in bad, f"{check} did not fail; failed: {bad}"
    for w in words:
        assert w in bad[check], f"{w!r} not in {bad[check]!r}"
    return v


def _edit_index(model: Path, fn) -> None:
    idx = json.loads((model / INDEX).read_text())
    fn(idx["weight_map"])
    (model / INDEX).write_text(json.dumps(idx))


def _first_tensor_of(model: Path, shard: str) -> str:
    wm = json.loads((model / INDEX).read_text())["weight_map"]
    return sorted(t for t, s in wm.items() if s == shard)[0]


# ---------------------------------------------------------------- clean

def test_clean_synthetic_kimi_passes_with_fingerprint(tmp_path, model, profile):
    rc, v = run_preflight(tmp_path, model, profile)
    assert rc == 0 and v.status == "pass", failed(v)
    assert v.metrics["shard_count"] == 96
    fp = v.metrics["fingerprint"]
    assert len(fp["sha256"]) == 64 and len(fp["shards"]) == 96
    assert (tmp_path / "out" / "outputs" / "fingerprint").read_text() == fp["sha256"]
    skipped = {c.name for c in v.checks if c.status == "skip"}
    assert skipped == {"object-checksums"}         # every expectation of the profile judged (none null)
    assert v.metrics["revision"] == KIMI.model.revision


# ---------------------------------------------------------------- expectations the profile leaves null

NULLED = {"config.num_hidden_layers": "model.architecture.num_hidden_layers",
          "config.moe.n_routed_experts": "model.architecture.moe.n_routed_experts",
          "config.quantization.quant_method": "model.architecture.quantization.quant_method",
          "quant-dtypes.scale": "model.architecture.quantization.scale_dtypes",
          "revision": "model.revision"}


def _nulled(profile: Profile) -> Profile:
    """``profile`` (filled, cluster) with five expectations null: an architecture number, an MoE count, the
    quantization method, the scale dtypes, the revision."""
    a = profile.model.architecture
    arch = a.model_copy(update={"num_hidden_layers": None,
                                "moe": a.moe.model_copy(update={"n_routed_experts": None}),
                                "quantization": a.quantization.model_copy(update={"quant_method": None,
                                                                                   "scale_dtypes": []})})
    return _with(profile, architecture=arch, revision=None)


def test_a_cluster_profile_with_a_null_expectation_fails_naming_each_field(tmp_path, model, profile):
    assert profile.purpose == "cluster"
    rc, v = run_preflight(tmp_path, model, _nulled(profile))
    assert rc == 1 and v.status == "fail"
    bad = failed(v)
    assert set(bad) == set(NULLED), bad          # the null ones, and nothing else
    for check, field in NULLED.items():
        assert f"{field} is null: a cluster profile leaves no Gate 0 expectation unknown" in bad[check]
        assert "--discover" in bad[check]
    assert "text_config.num_hidden_layers = 93" in bad["config.num_hidden_layers"]     # what the directory says
    assert not (tmp_path / "out" / "discovered.yaml").exists()


def test_a_test_profile_reports_a_null_expectation_as_unknown(tmp_path, model, profile):
    rc, v = run_preflight(tmp_path, model, _nulled(profile).model_copy(update={"purpose": "test"}))
    assert rc == 0, failed(v)
    by = {c.name: c for c in v.checks}
    assert all(by[n].status == "skip" and "unknown expectation: fill " + f in by[n].detail for n, f in NULLED.items())


def test_discover_passes_them_as_discovered_and_writes_the_snippet_that_fills_the_profile(tmp_path, model, profile,
                                                                                          capsys):
    nulled = _nulled(profile)
    capsys.readouterr()
    rc, v = run_preflight(tmp_path, model, nulled, "--discover")
    assert rc == 0 and v.status == "pass", failed(v)
    by = {c.name: c for c in v.checks}
    for check, field in NULLED.items():
        assert by[check].status == "pass" and by[check].detail.startswith(f"discovered: {field} = ")
    assert by["discovered"].observed == sorted(f.removeprefix("model.") for f in NULLED.values())
    # where the snippet is: its absolute path, in the verdict and in the summary the step prints
    written = (tmp_path / "out" / "discovered.yaml").resolve()
    assert f"written to {written};" in by["discovered"].detail
    printed = [line for line in capsys.readouterr().out.splitlines() if " discovered " in line]
    assert len(printed) == 1 and f"written to {written};" in printed[0], printed
    text = written.read_text()
    assert text.startswith("# Gate 0 preflight --discover read these from ") and str(model) in text
    snippet = yaml.safe_load(text)
    assert snippet == {"model": {
        "revision": KIMI.model.revision,
        "architecture": {"num_hidden_layers": 93, "moe": {"n_routed_experts": 8},    # the synth's 8 experts
                         "quantization": {"quant_method": "compressed-tensors", "scale_dtypes": ["U8"]}}}}
    assert v.metrics["discovered"]["architecture.num_hidden_layers"] == 93
    # pasted into the profile, the run needs no --discover: every expectation is judged, and passes
    data = nulled.model_dump(mode="json")

    def merge(into: dict, new: dict) -> None:
        for k, val in new.items():
            merge(into[k], val) if isinstance(val, dict) else into.__setitem__(k, val)
    merge(data["model"], snippet["model"])
    filled = Profile.model_validate(data)
    rc, v = run_preflight(tmp_path, model, filled)
    assert rc == 0 and all(c.status == "pass" for c in v.checks if c.name in NULLED), failed(v)


def test_a_cluster_profile_of_a_dense_model_leaves_its_moe_and_quantization_null(tmp_path):
    """Null is right for a field the checkpoint does not have: no experts, no quantization_config, no packed
    tensors. Those skip saying so; a field the checkpoint has still fails when null (its layer_types here)."""
    local = load_profile("local-cpu")
    d = synth_from_profile(local, tmp_path / "llama")
    prof = profile_of(local, d).model_copy(update={"purpose": "cluster"})
    rc, v = run_preflight(tmp_path, d, prof)
    assert rc == 1 and set(failed(v)) == {"config.layer_kinds"}      # the synth writes layer_types: stated
    a = prof.model.architecture
    prof = _with(prof, architecture=a.model_copy(update={"layer_kinds": {"full_attention": 30}}))
    rc, v = run_preflight(tmp_path, d, prof)
    assert rc == 0, failed(v)
    by = {c.name: c for c in v.checks}
    for n in ("config.moe.n_routed_experts", "config.moe.n_shared_experts", "config.moe.num_experts_per_tok",
              "config.quantization.quant_method", "config.quantization.fmt", "quant-dtypes.weight",
              "quant-dtypes.scale"):
        assert by[n].status == "skip" and "not a field of this checkpoint" in by[n].detail, by[n].detail


def test_discover_cannot_pass_what_the_directory_does_not_say(tmp_path, model, profile):
    from gauntlet.steps.model.marker import write_marker
    write_marker(model, revision=None)          # no revision recorded anywhere in the directory
    rc, v = run_preflight(tmp_path, model, _with(profile, revision=None), "--discover")
    assert rc == 1 and set(failed(v)) == {"revision"}
    assert "model.revision is null and --discover found no one value to record" in failed(v)["revision"]
    assert {c.name: c.status for c in v.checks}["discovered"] == "skip"


def test_sparse_full_size_layout_passes_fast(tmp_path):
    d = synth_from_profile(KIMI, tmp_path / "sparse", sparse=True)
    assert _total(d) == 1_560_936_091_448
    t0 = time.perf_counter()
    rc, v = run_preflight(tmp_path, d, KIMI)
    assert rc == 0, failed(v)
    assert time.perf_counter() - t0 < 5.0  # benchmarks/preflight.py holds it to 1 s; a loaded CI box is slower
    assert v.metrics["weight_bytes"] == 1_560_936_091_448


# ---------------------------------------------------------------- the bad inputs, one test each

def test_missing_shard(tmp_path, model, profile):
    (model / SHARD3).unlink()
    assert_fails(tmp_path, model, profile, "shards-exist", SHARD3, "missing")


def test_empty_shard(tmp_path, model, profile):
    (model / SHARD3).write_bytes(b"")
    assert_fails(tmp_path, model, profile, "shards-exist", SHARD3, "empty")


def test_shard_truncated_by_one_byte(tmp_path, model, profile):
    p = model / SHARD3
    os.truncate(p, p.stat().st_size - 1)
    assert_fails(tmp_path, model, profile, "shard-headers", f"shard {SHARD3} truncated",
                 "incomplete metadata, file not fully covered")


def test_corrupted_header_json(tmp_path, model, profile):
    p = model / SHARD3
    raw = bytearray(p.read_bytes())
    raw[8] = ord("[")  # the header's opening brace
    p.write_bytes(bytes(raw))
    assert_fails(tmp_path, model, profile, "shard-headers", SHARD3, "corrupt header", "JSON")


def test_absurd_header_length(tmp_path, model, profile):
    p = model / SHARD3
    raw = bytearray(p.read_bytes())
    raw[:8] = (1 << 62).to_bytes(8, "little")
    p.write_bytes(bytes(raw))
    assert_fails(tmp_path, model, profile, "shard-headers", SHARD3, "length prefix", str(1 << 62))


def test_tensor_in_index_missing_from_shard(tmp_path, model, profile):
    _edit_index(model, lambda wm: wm.__setitem__("language_model.model.layers.0.ghost.weight", SHARD3))
    assert_fails(tmp_path, model, profile, "index-tensors", SHARD3, "missing from its header", "ghost")


def test_tensor_in_shard_missing_from_index(tmp_path, model, profile):
    t = _first_tensor_of(model, SHARD3)
    _edit_index(model, lambda wm: wm.pop(t))
    assert_fails(tmp_path, model, profile, "index-tensors", SHARD3, "not in the index", t)


def test_path_traversal_in_index(tmp_path, model, profile):
    outside = tmp_path / "outside.safetensors"
    shutil.copy(model / SHARD3, outside)
    t = _first_tensor_of(model, SHARD3)
    _edit_index(model, lambda wm: wm.__setitem__(t, "../outside.safetensors"))
    assert_fails(tmp_path, model, profile, "index-paths", "../outside.safetensors", "'..'")


def test_absolute_path_in_index(tmp_path, model, profile):
    t = _first_tensor_of(model, SHARD3)
    _edit_index(model, lambda wm: wm.__setitem__(t, str(model / SHARD3)))
    assert_fails(tmp_path, model, profile, "index-paths", "absolute path")


def test_symlink_escaping_the_directory(tmp_path, model, profile):
    outside = tmp_path / "elsewhere" / SHARD3
    outside.parent.mkdir()
    shutil.move(model / SHARD3, outside)
    (model / SHARD3).symlink_to(outside)
    assert_fails(tmp_path, model, profile, "index-paths", SHARD3, "outside the model directory")


def test_symlink_inside_the_directory_is_fine(tmp_path, model, profile):
    (model / "blobs").mkdir()
    shutil.move(model / SHARD3, model / "blobs" / SHARD3)
    (model / SHARD3).symlink_to(Path("blobs") / SHARD3)
    _, v = run_preflight(tmp_path, model, profile)
    assert {c.name: c.status for c in v.checks}["index-paths"] == "pass"
    assert {c.name: c.status for c in v.checks}["shard-headers"] == "pass"


def test_missing_tokenizer(tmp_path, model, profile):
    (model / "tokenizer_config.json").unlink()
    assert_fails(tmp_path, model, profile, "tokenizer-files", "tokenizer_config.json is missing")


def test_missing_chat_template(tmp_path, model, profile):
    tc = json.loads((model / "tokenizer_config.json").read_text())
    del tc["chat_template"]
    (model / "tokenizer_config.json").write_text(json.dumps(tc))
    assert_fails(tmp_path, model, profile, "chat-template", "no chat template")


def test_chat_template_that_does_not_parse(tmp_path, model, profile):
    pytest.importorskip("jinja2")
    (model / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }")
    assert_fails(tmp_path, model, profile, "chat-template", "chat_template.jinja", "syntax")


def test_wrong_layer_count(tmp_path, model, profile):
    cfg = json.loads((model / "config.json").read_text())
    expected = cfg["text_config"]["num_hidden_layers"]
    cfg["text_config"]["num_hidden_layers"] = expected - 1
    (model / "config.json").write_text(json.dumps(cfg))
    assert_fails(tmp_path, model, _with_arch(profile, num_hidden_layers=expected), "config.num_hidden_layers",
                 "text_config.num_hidden_layers", str(expected - 1), str(expected))


def test_wrong_quantization_method(tmp_path, model, profile):
    cfg = json.loads((model / "config.json").read_text())
    cfg["quantization_config"]["quant_method"] = "fp8"
    (model / "config.json").write_text(json.dumps(cfg))
    q = profile.model.architecture.quantization.model_copy(update={"quant_method": "mxfp4"})
    assert_fails(tmp_path, model, _with_arch(profile, quantization=q), "config.quantization.quant_method",
                 "'fp8'", "'mxfp4'")


def test_wrong_quantization_format_with_the_real_profile(tmp_path, model, profile):
    cfg = json.loads((model / "config.json").read_text())
    cfg["quantization_config"]["format"] = "nvfp4"
    (model / "config.json").write_text(json.dumps(cfg))
    assert_fails(tmp_path, model, profile, "config.quantization.fmt", "nvfp4")


def test_missing_marker(tmp_path, model, profile):
    (model / ".aik8s-complete").unlink()
    assert_fails(tmp_path, model, profile, "marker", ".aik8s-complete is missing")


def test_marker_manifest_not_matching(tmp_path, model, profile):
    m = json.loads((model / ".aik8s-complete").read_text())
    m["files"]["config.json"] += 1
    (model / ".aik8s-complete").write_text(json.dumps(m))
    assert_fails(tmp_path, model, profile, "marker-manifest", "config.json is", "the manifest says")


def test_file_added_after_the_marker(tmp_path, model, profile):
    (model / "extra.bin").write_bytes(b"x")
    assert_fails(tmp_path, model, profile, "marker-manifest", "extra.bin is not in the manifest")


def test_total_bytes_off_by_one(tmp_path, model, profile):
    assert_fails(tmp_path, model, _with(profile, weight_bytes=profile.model.weight_bytes + 1), "weight-bytes",
                 "(-1)")


def test_shard_count_off_by_one(tmp_path, model, profile):
    assert_fails(tmp_path, model, _with(profile, shards=97), "shard-count", "96 shards", "97")


def test_unreadable_shard_permission_denied(tmp_path, model, profile):
    """As root, CAP_DAC_OVERRIDE reads anything: drop it with setpriv so the permission error is real."""
    (model / SHARD3).chmod(0)
    pf = tmp_path / "profile.yaml"
    pf.write_text(yaml.safe_dump(profile.model_dump(mode="json")))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "gauntlet.workflows.cli", "step", "preflight", "--profile", str(pf),
           "--model-path", str(model), "--out", str(out)]
    if os.geteuid() == 0:
        if not shutil.which("setpriv"):
            pytest.skip("root without setpriv cannot lose read permission")
        cmd = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", *cmd]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    bad = failed(Verdict.read(out))
    assert "shard-headers" in bad and "permission denied" in bad["shard-headers"] and SHARD3 in bad["shard-headers"]


# ---------------------------------------------------------------- more of the same kind

def test_broken_config_json(tmp_path, model, profile):
    (model / "config.json").write_text('{"architectures": [')
    assert_fails(tmp_path, model, profile, "config-json", "invalid JSON")


def test_broken_index_json(tmp_path, model, profile):
    (model / INDEX).write_text("{not json")
    assert_fails(tmp_path, model, profile, "index-json", INDEX, "invalid JSON")


def test_stray_shard_and_leftover_partial(tmp_path, model, profile):
    shutil.copy(model / SHARD3, model / "model-00097-of-00096.safetensors")
    (model / ".model-00001-of-00096.safetensors.gauntlet-partial").write_bytes(b"x")
    assert_fails(tmp_path, model, profile, "shard-set", "model-00097-of-00096.safetensors", "gauntlet-partial")


def test_shard_that_is_a_directory(tmp_path, model, profile):
    (model / SHARD3).unlink()
    (model / SHARD3).mkdir()
    assert_fails(tmp_path, model, profile, "shards-exist", SHARD3, "directory")


def test_wrong_expert_dtype(tmp_path, model, profile):
    q = profile.model.architecture.quantization.model_copy(update={"weight_dtypes": ["I8"]})
    assert_fails(tmp_path, model, _with_arch(profile, quantization=q), "quant-dtypes.weight", "blocks", "U8")


def test_model_dir_missing(tmp_path, profile):
    assert_fails(tmp_path, tmp_path / "nope", profile, "model-dir", "does not exist")


def test_pin_drift_names_the_component(tmp_path, model, profile):
    rc, v = run_preflight(tmp_path, model, profile)
    assert rc == 0
    pin = tmp_path / "pin.json"
    pin.write_text(json.dumps(v.metrics["fingerprint"]))
    rc, v = run_preflight(tmp_path, model, profile, "--pin", str(pin))
    assert rc == 0 and {c.name: c.status for c in v.checks}["fingerprint-pin"] == "pass"
    tc = json.loads((model / "tokenizer_config.json").read_text())
    tc["eos_token"] = "<|eot|>"
    (model / "tokenizer_config.json").write_text(json.dumps(tc))
    from gauntlet.steps.model.marker import write_marker
    write_marker(model, revision=KIMI.model.revision)
    v = assert_fails(tmp_path, model, profile, "fingerprint-pin", "tokenizer differs", "tokenizer_config.json",
                     extra=("--pin", str(pin)))
    assert "config differs" not in failed(v)["fingerprint-pin"]


def test_bad_pin_file_is_a_usage_error(tmp_path, model, profile, capsys):
    pin = tmp_path / "pin.json"
    pin.write_text("{")
    pf = tmp_path / "profile.yaml"
    pf.write_text(yaml.safe_dump(profile.model_dump(mode="json")))
    rc = main(["step", "preflight", "--profile", str(pf), "--model-path", str(model), "--out", str(tmp_path / "o"),
               "--pin", str(pin)])
    assert rc == 2 and "--pin" in capsys.readouterr().err


def test_object_checksums_are_attached_not_recomputed(tmp_path, model, profile):
    (model / ".aik8s-checksums.json").write_text(json.dumps({SHARD3: {"md5": "0" * 32}}))
    rc, v = run_preflight(tmp_path, model, profile)
    assert rc == 0
    c = {c.name: c for c in v.checks}["object-checksums"]
    assert c.status == "pass" and c.observed == [".aik8s-checksums.json"]
    assert (tmp_path / "out" / "checksums" / ".aik8s-checksums.json").is_file()


def test_model_path_defaults_to_the_mount_path(tmp_path, clean_template, monkeypatch):
    monkeypatch.chdir(tmp_path)
    local = load_profile("local-cpu")
    synth_from_profile(local, tmp_path / local.model.mount_path)
    pf = tmp_path / "profile.yaml"
    data = local.model_dump(mode="json")
    data["model"].update(weight_bytes=None, revision=None)  # the synthetic copy is not the prepared model
    pf.write_text(yaml.safe_dump(data))
    assert main(["step", "preflight", "--profile", str(pf), "--out", str(tmp_path / "out")]) == 0
    assert Verdict.read(tmp_path / "out").metrics["model_dir"] == str(tmp_path / local.model.mount_path)


def test_empty_tokenizer_file(tmp_path, model, profile):
    (model / "tokenizer_config.json").write_bytes(b"")
    assert_fails(tmp_path, model, profile, "tokenizer-files", "tokenizer_config.json", "empty")


def test_empty_weight_map(tmp_path, model, profile):
    _edit_index(model, lambda wm: wm.clear())
    assert_fails(tmp_path, model, profile, "index-json", "weight_map is empty")


def test_dot_slash_shard_names_are_the_same_files(tmp_path, model, profile):
    _edit_index(model, lambda wm: wm.update({t: f"./{s}" for t, s in wm.items()}))
    from gauntlet.steps.model.marker import write_marker
    write_marker(model, revision=KIMI.model.revision)
    rc, v = run_preflight(tmp_path, model, profile)
    assert rc == 0, failed(v)


def test_marker_that_is_a_fifo_does_not_hang(tmp_path, model, profile):
    (model / ".aik8s-complete").unlink()
    os.mkfifo(model / ".aik8s-complete")
    assert_fails(tmp_path, model, profile, "marker", "not a regular file")


def test_symlink_loop_shard(tmp_path, model, profile):
    (model / SHARD3).unlink()
    (model / SHARD3).symlink_to(SHARD3)
    assert_fails(tmp_path, model, profile, "shards-exist", SHARD3)


def test_marker_manifest_of_shards_only_as_a_list(tmp_path, model, profile):
    """A sync tool's manifest that lists only the shards, as [{name, size}], vouches for the shard set."""
    shards = sorted(p for p in model.glob("*.safetensors"))
    (model / ".aik8s-complete").write_text(json.dumps(
        {"revision": KIMI.model.revision, "shards": [{"name": p.name, "size": p.stat().st_size} for p in shards]}))
    rc, v = run_preflight(tmp_path, model, profile)
    assert rc == 0, failed(v)
    with open(shards[5], "ab") as fh:
        fh.write(b"x")
    assert_fails(tmp_path, model, profile, "marker-manifest", shards[5].name, "the manifest says")


def test_shard_with_one_trailing_byte(tmp_path, model, profile):
    with open(model / SHARD3, "ab") as fh:
        fh.write(b"\0")
    assert_fails(tmp_path, model, profile, "shard-headers", f"shard {SHARD3} has trailing bytes",
                 "1 bytes beyond what its header declares")


def test_tensor_shape_not_matching_its_offsets(tmp_path, model, profile):
    p = model / SHARD3
    raw = bytearray(p.read_bytes())
    i = raw.index(b'"shape":[') + len(b'"shape":[')   # first digit of the first shape: same length, new size
    raw[i] = ord("9") if raw[i] != ord("9") else ord("8")
    p.write_bytes(bytes(raw))
    assert_fails(tmp_path, model, profile, "shard-headers", SHARD3, "invalid shape")
