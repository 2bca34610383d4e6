"""The nightly: one graph, two runs. What the nightly runs on each back end, and what its report says it left out."""

from __future__ import annotations

from pathlib import Path

from gauntlet.params import load_profile
from gauntlet.workflows.graph import build_graph


def _names(graph) -> tuple[list[str], list[str]]:
    return [t.name for t in graph.main.tasks], [t.name for t in graph.sequences[0].tasks]


def test_local_nightly_is_gate0_the_baseline_sequence_cut_to_its_cases_regress_report():
    p = load_profile("local-cpu")
    main, seq = _names(build_graph(p, "local", "nightly"))
    assert main == ["params", "prewarm", "preflight", "engine-check-vllm", "vllm", "regress", "report"]
    assert seq == ["deploy", "smoke", "perf", "suspect", "confirm", "teardown"]
    perf = build_graph(p, "local", "nightly").sequences[0].task("perf")
    assert perf.flag("--cases") == ",".join(c.name for c in p.nightly_cases()) == "c2-128-32"
    qual_main, qual_seq = _names(build_graph(p, "local"))
    assert "llamacpp" in qual_main and "longctx" in qual_seq and "exp-prefix-cache" in qual_seq
    assert set(seq) < set(qual_seq)
    # the report step is told which run it reports
    report = build_graph(p, "local", "nightly").main.task("report")
    assert report.flag("--run") == "nightly" and build_graph(p, "local").main.task("report").flag("--run") == "qualification"


def test_the_cluster_nightly_has_no_prewarm_and_only_the_nightly_engines():
    p = load_profile("kimi-k3-h20")
    g = build_graph(p, "argo", "nightly")
    main, seq = _names(g)
    assert not any(n.startswith("prewarm") for n in main) and "prewarm" not in g.parameters
    assert [n for n in main if n in ("sglang", "vllm")] == ["sglang"] and "engine-check-vllm" not in main
    assert g.parameters["engines"][:2] == ("sglang", ("sglang",))
    assert "longctx" not in seq and not any(n.startswith("exp-") for n in seq)
    assert build_graph(p, "argo").parameters["engines"][1] == ("both", "sglang", "vllm")


def test_a_nightly_report_says_what_it_left_out_and_why(tmp_path: Path):
    """The report of a nightly run names each part of the qualification it did not run (long context, Gate 6,
    the experimental engine, the cases that are not regression cases) with the reason; a qualification's does not."""
    from gauntlet.steps.evidence.report import build_report

    p = load_profile("kimi-k3-h20")
    run_dir = tmp_path / "runs" / "n1"
    run_dir.mkdir(parents=True)
    night = build_report(run_dir, [], profile=p, run="nightly").path.read_text()
    section = night[night.index("## What this nightly left out"):].split("\n## ", 1)[0]
    assert "4.5 h window, 64 GPU-h" in section and "Gate 4 on c16-1k-1k, c16-8k-1k" in section
    for what in ("**Gate 5 long context (32K, 64K, 128K, 256K, 1024K)**", "**Gate 6 experiments (prefix-cache, dspark, "
                 "hicache, symm-mem)**", "**Gate 7 engine vllm**", "**Gate 4 cases c1-1k-1k, c32-1k-1k**", "**prewarm**"):
        assert what in section, section
    assert "qualification only" in section
    qual = build_report(run_dir, [], profile=p, run="qualification").path.read_text()
    assert "What this nightly left out" not in qual
