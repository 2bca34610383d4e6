"""GPU parsers on the real H200 outputs, and the judgement of what they parse."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gauntlet.params import load_profile
from gauntlet.steps.cluster import gpu as _gpu

FIX = Path(__file__).resolve().parent / "fixtures" / "gpu" / "nvidia-h200-1gpu"


@pytest.fixture(scope="module")
def inv() -> _gpu.GpuInventory:
    return _gpu.inventory_from_smi((FIX / "nvidia-smi-query.csv").read_text(), (FIX / "nvidia-smi-q.txt").read_text())


def by_name(checks):
    return {c.name: c for c in checks}


def test_csv_rows_keyed_by_header_without_units():
    rows = _gpu.parse_query_csv((FIX / "nvidia-smi-query.csv").read_text())
    assert len(rows) == 1
    assert rows[0]["memory.total"] == "143771 MiB"
    assert rows[0]["driver_version"] == "580.159.04"
    assert rows[0]["ecc.errors.uncorrected.volatile.total"] == "0"


def test_q_parser_nests_sections():
    q = _gpu.parse_smi_q((FIX / "nvidia-smi-q.txt").read_text())
    assert q["CUDA Version"] == "13.0"
    gpu = q["GPU 00000000:00:06.0"]
    assert gpu["Product Name"] == "NVIDIA H200"
    assert gpu["FB Memory Usage"]["Total"] == "143771 MiB"
    assert gpu["ECC Errors"]["Volatile"]["DRAM Uncorrectable"] == "0"
    assert gpu["Clocks Event Reasons"]["HW Slowdown"] == "Not Active"
    assert q["Timestamp"] == "Wed Dec  2 12:34:59 2026"  # values keep their own colons


def test_inventory_merges_csv_and_q(inv):
    assert inv.driver == "580.159.04" and inv.cuda == "13.0"
    (g,) = inv.gpus
    assert (g.name, g.memory_total_mib, g.memory_used_mib) == ("NVIDIA H200", 143771, 0)
    assert g.persistence is True          # only -q states it: the csv fixture has no persistence column
    assert g.ecc_uncorrected == 0 and g.slowdown == () and g.retired_pending is False
    assert g.compute_cap == "9.0" and g.sm_clock_max_mhz == 1980


def test_h200_fails_kimi_profile_on_model_and_count(inv):
    checks = by_name(_gpu.judge_inventory(inv, load_profile("kimi-k3-h20").hardware))
    assert checks["gpu_count"].status == "fail" and checks["gpu_count"].observed == 1
    assert checks["gpu_model"].status == "fail"          # H200 is not H20, though "H20" is a substring
    failed = {n for n, c in checks.items() if c.status == "fail"}
    assert failed == {"gpu_count", "gpu_model"}, failed  # memory, driver, CUDA, ECC, persistence all fine


def test_h200_passes_one_h200_profile(inv):
    checks = _gpu.judge_inventory(inv, load_profile("h200-1gpu").hardware)
    assert [c for c in checks if c.status != "pass"] == []


@pytest.mark.parametrize("name,model,ok", [("NVIDIA H20", "H20", True), ("NVIDIA H20-3e", "H20", True),
                                           ("NVIDIA H200", "H20", False), ("NVIDIA H200", "H200", True),
                                           ("NVIDIA H100 80GB HBM3", "H200", False)])
def test_model_is_a_token(name, model, ok):
    assert _gpu.model_matches(name, model) is ok


@pytest.mark.parametrize("have,want,ok", [("580.159.04", "580", True), ("575.57.08", "580", False),
                                          ("13.0", "13.0", True), ("12.9", "13.0", False), (None, "580", False),
                                          ("580", "580.100", False), ("590.1", "580.100", True)])
def test_version_at_least(have, want, ok):
    assert _gpu.version_at_least(have, want) is ok


def test_degraded_card_fails_the_right_checks(inv):
    hw = load_profile("h200-1gpu").hardware
    g = inv.gpus[0]
    bad = replace(inv, gpus=(replace(g, ecc_uncorrected=3, persistence=False, memory_used_mib=40000,
                                     slowdown=("HW Thermal Slowdown",)),))
    checks = by_name(_gpu.judge_inventory(bad, hw))
    assert {n for n, c in checks.items() if c.status == "fail"} == {"ecc", "persistence", "gpu_idle", "throttle"}


def test_probe_judgement_against_minimums():
    spec = load_profile("h200-1gpu").hardware.gpu_probe
    good = _gpu.ProbeResult(0, "NVIDIA H200", copy_tbps=4.29, bf16_tflops=779.0, allreduce_ok=True,
                            allreduce_algbw_gbps=3e4)
    slow = _gpu.ProbeResult(1, "NVIDIA H200", copy_tbps=2.1, bf16_tflops=780.0)
    checks = by_name(_gpu.judge_probe([good, slow], spec))
    assert checks["gpu_copy_bandwidth"].status == "fail" and "[1]" in checks["gpu_copy_bandwidth"].detail
    assert checks["gpu_bf16_matmul"].status == "pass"
    assert checks["nccl_one_rank"].status == "pass"
    broken = _gpu.ProbeResult(0, "", error="torch sees no CUDA device")
    assert by_name(_gpu.judge_probe([broken], spec))["gpu_probe_runs"].status == "fail"
    wrong = replace(good, allreduce_ok=False)
    assert by_name(_gpu.judge_probe([wrong], spec))["nccl_one_rank"].status == "fail"


def test_recorded_probe_passes_one_h200_profile():
    import json
    rec = json.loads((FIX / "probe.json").read_text())
    r = _gpu.ProbeResult(0, rec["device"], copy_tbps=rec["copy_GBps"] / 1e3, bf16_tflops=rec["bf16_TFLOPs"])
    checks = by_name(_gpu.judge_probe([r], load_profile("h200-1gpu").hardware.gpu_probe))
    assert checks["gpu_copy_bandwidth"].status == "pass" and checks["gpu_bf16_matmul"].status == "pass"
    h20 = by_name(_gpu.judge_probe([r], load_profile("kimi-k3-h20").hardware.gpu_probe))
    assert h20["gpu_copy_bandwidth"].status == "pass"   # minimums are floors: an H200 beats the H20's


DEVICE_RUN = Path(__file__).resolve().parents[1] / "docs" / "gpu-probe" / "2026-12-02-nvidia-h200"


def test_device_run_outputs_parse_and_pass():
    """The outputs `gauntlet step nodes` recorded on the lent H200 (docs/gpu-probe.md) with QUERY_FIELDS."""
    inv = _gpu.inventory_from_smi((DEVICE_RUN / "nvidia-smi-query.csv").read_text(),
                                  (DEVICE_RUN / "nvidia-smi-q.txt").read_text())
    rows = _gpu.parse_query_csv((DEVICE_RUN / "nvidia-smi-query.csv").read_text())
    assert list(rows[0]) == list(_gpu.QUERY_FIELDS)
    assert rows[0]["persistence_mode"] == "Enabled" and inv.gpus[0].persistence is True
    assert [c.name for c in _gpu.judge_inventory(inv, load_profile("h200-1gpu").hardware) if c.status != "pass"] == []
