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
    assert kimi.engines["sglang"].env["NCCL_CUMEM_ENABLE"] == "1" and kimi.purpose == "cluster"
    assert kimi.engine_order() == ["sglang", "vllm"]
    local = load_profile("local-cpu")
    assert local.hardware.kind == "local" and local.baseline_engine == "vllm"


def _null_expectations(profile, fields) -> list[str]:
    out = []
    for field in fields:
        node = profile.model
        for part in field.split("."):
            node = getattr(node, part)
        if node in (None, []):
            out.append(f"model.{field}")
    return out


def test_a_cluster_profile_states_every_gate0_expectation():
    """A profile for a real cluster leaves none of Gate 0's expectations null (Gate 0 would fail naming it):
    each shipped cluster profile states at least what every checkpoint has (a dense model's MoE and quantization
    may be null: Gate 0 skips them when the directory has none either), and Kimi K3 states all of them, the
    released config's (their sources are in the profile). A profile added without ``purpose`` is a cluster one."""
    from gauntlet.params import profile_path
    from gauntlet.steps.model.expectations import FIELDS
    every_checkpoint = ("revision", "shards", "weight_bytes", "architecture.architectures",
                        "architecture.model_type", "architecture.num_hidden_layers",
                        "architecture.max_position_embeddings")
    profiles = [load_profile(f.stem) for f in sorted(profile_path("kimi-k3-h20").parent.glob("*.yaml"))]
    cluster = {p.name: p for p in profiles if p.purpose == "cluster"}
    assert "kimi-k3-h20" in cluster and {"local-cpu", "h200-1gpu"}.isdisjoint(cluster)
    for name, p in cluster.items():
        assert not _null_expectations(p, every_checkpoint), f"{name} (purpose: cluster) leaves null: " \
            f"{', '.join(_null_expectations(p, every_checkpoint))}; fill them or mark it purpose: test"
    assert not _null_expectations(cluster["kimi-k3-h20"], FIELDS.values())
    arch = cluster["kimi-k3-h20"].model.architecture
    assert (arch.num_hidden_layers, arch.layer_kinds) == (93, {"kda": 69, "mla": 24})
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


# ---- issue 21: every input has a type, a range and a size (docs/reliability.md, "Hostile input")

@pytest.mark.parametrize("path,value,needle", [
    (["engines", "sglang", "args", "tp_size"], 0, "engines.sglang.args.tp_size: input should be greater than or equal to 1"),
    (["engines", "sglang", "args", "tp_size"], 32, "engines.sglang.args.tp_size: 32 ranks, more than the profile's 16 GPUs"),
    (["engines", "sglang", "args", "context_length"], 0, "engines.sglang.args.context_length: input should be greater"),
    (["bench", "cases", 0, "concurrency"], 0, "bench.cases.0.concurrency: input should be greater than or equal to 1"),
    (["bench", "cases", 0, "input_len"], -5, "bench.cases.0.input_len: input should be greater"),
    (["engines", "sglang", "port"], 70000, "engines.sglang.port: input should be less than or equal to 65535"),
    (["hardware", "gpus_per_node"], -8, "hardware.gpus_per_node: input should be greater than or equal to 0"),
    (["hardware", "gpus_per_node"], 0, "hardware.gpus_per_node: a kubernetes profile's engines run on GPUs"),
    (["active_deadline_s"], -1, "active_deadline_s: input should be greater than or equal to 1"),
    (["engines", "sglang", "args", "mem_fraction"], float("nan"), "mem_fraction: expected a finite number, got nan"),
    (["smoke", "request_timeout_s"], float("inf"), "smoke.request_timeout_s: expected a finite number, got inf"),
    (["bench", "rounds"], 10**30, "bench.rounds: input should be less than or equal to 100"),
    (["longctx", "needle_depths"], [2.0], "longctx.needle_depths.0: input should be less than or equal to 1"),
    (["longctx", "reasoning_tokens"], 40000, "longctx.ladder: the 32768-token rung leaves no room for a prompt "
     "beside its reply budget of 40064 tokens"),
    (["longctx", "memory_growth_max_gib"], -1, "longctx.memory_growth_max_gib: input should be greater than or equal to 0"),
    (["nightly", "schedule"], "every night please", "nightly.schedule: expected a five-field cron schedule"),
    (["nightly", "schedule"], "0 2 31 2 *", "nightly.schedule: not a valid cron schedule"),
    (["nightly", "schedule"], "0 2 L * *", "L, W and # are not in Argo's cron syntax"),
    (["nightly", "window_h"], 0, "nightly.window_h: input should be greater than 0"),
    (["nightly", "cases"], ["c16-1k-1k", "nope"], "nightly.cases: no bench case named 'nope'"),
    (["nightly", "cases"], ["c32-1k-1k"], "nightly.cases: c32-1k-1k is gated on c16-1k-1k (requires_stable)"),
    (["nightly", "cases"], ["c16-1k-1k", "c16-1k-1k"], "nightly.cases: c16-1k-1k appear more than once"),
    (["nightly", "engines"], ["llamacpp"], "nightly.engines: 'llamacpp' is not an engine of this profile"),
    (["timezone"], "Mars/Olympus_Mons", "timezone: 'Mars/Olympus_Mons' is not a time zone of the IANA database"),
    (["name"], "", "name: expected a DNS-1123 label of at most 35 characters"),
    (["name"], "x" * 36, "name: expected a DNS-1123 label of at most 35 characters"),
    (["name"], "../../outside", "name: expected a DNS-1123 label"),
    (["namespace"], "a;touch /tmp/x", "namespace: expected a DNS-1123 label of at most 63 characters"),
    (["experiments", 0, "change"], {"tp_size": "sixteen"}, "experiments.0.change.tp_size: expected int, got 'sixteen'"),
    (["experiments", 1, "change"], {"speculative.num_speculative_tokens": 0},
     "experiments.1.change.speculative.num_speculative_tokens: input should be greater than or equal to 1"),
    (["experiments", 1, "change"], {"tp_size.x": 1}, "experiments.1.change: 'tp_size.x': tp_size is not a mapping"),
    (["experiments", 2, "name"], "prefix-cache", "experiments: prefix-cache appear more than once"),
])
def test_out_of_range_and_bad_formats_are_refused(tmp_path, path, value, needle):
    p = _write(tmp_path, _mutate(path, value))
    with pytest.raises(ProfileError) as exc:
        load_profile(p)
    assert needle in str(exc.value) and str(exc.value).startswith(f"{p}: ")
    assert "\n" not in str(exc.value)


def test_the_shipped_schedule_forms_pass(tmp_path):
    for cron in ("@daily", "*/30 1-5 * * MON-FRI", "0 2 * * *"):
        assert load_profile(_write(tmp_path, _mutate(["nightly", "schedule"], cron))).nightly.schedule == cron


@pytest.mark.parametrize("content,needle", [
    (b"a: &a [x, x]\nb: &b [*a, *a]\n", "line 1: YAML anchors and aliases are refused"),
    (KIMI.read_bytes() + b"\nengines: {}\n", "duplicate key 'engines'"),
    (KIMI.read_bytes().replace(b"tp_size: 16\n      ep_size", b"tp_size: 16\n      tp_size: 8\n      ep_size", 1),
     "duplicate key 'tp_size'"),
    ("name: caf\xe9\n".encode("latin-1"), "not UTF-8 text (byte 9: b'\\xe9')"),
    (bytes(range(256)), "binary content (a NUL byte)"),
    (b"a: " + b"[" * 20000, "line 1: nested more than 32 levels deep"),
    (b"x: " + b"y" * (300 * 1024), "larger than 256 KiB: refused before parsing"),
    (b"a: \x01\n", "invalid YAML: unacceptable character"),
])
def test_hostile_yaml_is_one_line(tmp_path, content, needle):
    p = tmp_path / "hostile.yaml"
    p.write_bytes(content)
    with pytest.raises(ProfileError) as exc:
        load_profile(p)
    assert needle in str(exc.value) and str(exc.value).startswith(f"{p}: ") and "\n" not in str(exc.value)


def test_duplicate_key_names_its_line(tmp_path):
    p = tmp_path / "dup.yaml"
    p.write_text("name: a\nhardware: {}\nname: b\n")
    with pytest.raises(ProfileError, match=r"dup.yaml: line 3: duplicate key 'name'"):
        load_profile(p)


def test_a_huge_bad_value_costs_milliseconds(tmp_path):
    """Issue 21: a 6.5 KB bomb in `description` took 72 s and 3.1 GB: an error message repr()d it whole."""
    import time
    d = _kimi()
    d["description"] = ["x" * 4000] * 10_000          # 40 MB if repr()d whole
    t = time.monotonic()
    with pytest.raises(ProfileError) as exc:
        load_profile(_write(tmp_path, {k: v for k, v in d.items() if k != "description"} | {"description": {"a": 1}}))
    assert "description: expected str" in str(exc.value) and time.monotonic() - t < 2
    from pydantic import ValidationError

    from gauntlet.params.loader import format_validation_error
    from gauntlet.params.models import Profile
    with pytest.raises(ValidationError) as verr:
        Profile.model_validate(d)
    t = time.monotonic()
    msg = format_validation_error("p.yaml", verr.value)
    assert time.monotonic() - t < 0.5 and len(msg) < 2000 and "description: expected str" in msg


@pytest.mark.parametrize("argv,needle", [
    (["render", "--profile", "x" * 300], "not a readable profile path (File name too long)"),
    (["lint", "--profile", "a/b"], "no such profile file, and not a profile name"),
    (["render", "--profile", "/nonexistent/p.yaml"], "no such profile file"),
    (["render"], "UsageError: gauntlet render: the following arguments are required: --profile"),
    (["render", "--profile", "kimi-k3-h20", "--out", str(KIMI)], "UsageError: "),
])
def test_cli_bad_arguments_one_line_exit_2(argv, needle, capsys):
    from gauntlet.workflows.cli import main
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = exc.code
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and needle in lines[0] and "Traceback" not in err, err


def test_render_writes_nothing_outside_out(tmp_path):
    """The name is validated; and render_profile refuses any file name that would leave --out."""
    from gauntlet.contract import GauntletError
    from gauntlet.workflows.render import render_profile
    evil = load_profile("kimi-k3-h20").model_copy(update={"name": "../../evil"})   # model_copy skips validation
    out = tmp_path / "a" / "out"
    with pytest.raises(GauntletError):
        render_profile(evil, out)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.yaml")) == []
    r = _cli("render", "--profile", str(_write(tmp_path, _mutate(["name"], "../../evil"))), "--out", str(out))
    assert r.returncode == 2 and "name: expected a DNS-1123 label" in r.stderr
    assert list(tmp_path.rglob("*.workflowtemplate.yaml")) == []


def test_render_refuses_a_configmap_over_1_mib(tmp_path, monkeypatch, capsys):
    from gauntlet.workflows import render
    from gauntlet.workflows.cli import main
    monkeypatch.setattr(render, "CONFIGMAP_MAX_BYTES", 5_000)       # the Kimi profile's data is ~10 KB
    rc = main(["render", "--profile", "kimi-k3-h20", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("RenderError: gauntlet-kimi-k3-h20.profile.yaml: ConfigMap "
                                      "gauntlet-kimi-k3-h20-profile holds ") and "over the 1 MiB" in err
    assert err.rstrip().endswith(f"(profile {KIMI})")
    assert not (tmp_path / "out").exists()
