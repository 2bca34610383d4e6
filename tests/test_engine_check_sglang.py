"""engine-check against the installed SGLang (.ci/install-sglang.sh): its own parser and registries judge the plan.

The Kimi K3 profile passes as is; each injected mistake fails naming the flag or value.
"""

from __future__ import annotations

import logging

import pytest
from conftest import require_sglang

from gauntlet.params import ProfileError, load_profile
from gauntlet.params.models import Profile, Variant
from gauntlet.contract import Verdict
from gauntlet.steps.engines.sglang_models import entry_classes, registered_architectures
from gauntlet.steps.engines.sglang import SglangAdapter
from gauntlet.steps.gates.engine_check import collect, judge, planned_argvs
from gauntlet.steps.model.synth import synth_from_profile
from gauntlet.workflows.cli import main

pytestmark = pytest.mark.slow
KIMI = load_profile("kimi-k3-h20")
ARCH = ["KimiK3ForConditionalGeneration"]


@pytest.fixture(scope="module")
def sglang():
    require_sglang()
    return SglangAdapter()   # imports SGLang's parser registries and builds ServerArgs' parser once


def _spec(profile: Profile, **changes):
    spec = profile.engines["sglang"]
    args = changes.pop("args", None)
    if args:
        spec = spec.model_copy(update={"args": spec.args.model_copy(update=args)})
    return spec.model_copy(update=changes)


def _with(profile: Profile, experiments=None, **changes) -> Profile:
    update = {"engines": {**profile.engines, "sglang": _spec(profile, **changes)}}
    if experiments is not None:
        update["experiments"] = experiments
    return profile.model_copy(update=update)


def _checks(adapter, profile: Profile, archs=ARCH) -> dict:
    facts = collect(adapter, planned_argvs(profile, "sglang", "/models/m"))
    return {c.name: c for c in judge(facts, profile, "sglang", archs, "the test")}


def test_kimi_profile_passes_through_the_cli(sglang, tmp_path):
    """The real profile: both ranks, every SGLang variant, kimi_k3 parsers, the architecture from config.json."""
    model = synth_from_profile(KIMI, tmp_path / "kimi")
    rc = main(["step", "engine-check", "--profile", "kimi-k3-h20", "--engine", "sglang", "--out", str(tmp_path),
               "--model-path", str(model)])
    v = Verdict.read(tmp_path)
    s = {c.name: c.status for c in v.checks}
    assert rc == 0, [(c.name, c.detail) for c in v.checks if c.status == "fail"]
    passed = ("engine-import", "engine-version", "engine-env", "architecture", "cli-flags", "ranks",
              "variant-prefix-cache", "variant-dspark", "variant-hicache", "variant-symm-mem", "reasoning-parser",
              "tool-call-parser")
    assert {k: s[k] for k in passed} == dict.fromkeys(passed, "pass")
    assert s["engine-rules"] in ("pass", "skip")
    assert set(v.metrics["argv"]) == {"rank0", "rank1", "prefix-cache/rank0", "prefix-cache/rank1",
                                      "dspark/rank0", "dspark/rank1", "hicache/rank0", "hicache/rank1",
                                      "symm-mem/rank0", "symm-mem/rank1"}
    # the profile records each case's expert load: stat mode on every rank, accepted by SGLang's parser above
    for argv in v.metrics["argv"].values():
        assert argv[argv.index("--expert-distribution-recorder-mode") + 1] == "stat"


def test_each_pods_argv_carries_the_collective_timeout_and_sglang_takes_it(sglang):
    """Rank start-up skew past torch's 600 s NCCL default (a rank waits in its first collective for one still
    pulling or loading): each rank's exact pod argv (manifests.rank_argvs, the launch script's exec) carries the
    profile's engines.sglang.dist_timeout_s as --dist-timeout; ServerArgs' own parser accepts it (typed int), and
    the ServerArgs sglang.launch_server builds (sglang.srt.server_args.prepare_server_args, run here on each
    rank's argv) holds it as dist_timeout, the timeout sglang.srt.distributed.bootstrap._init_parallel_groups
    gives init_distributed_environment (the world and every model-parallel group)."""
    from sglang.srt.server_args import prepare_server_args
    from gauntlet.steps.backends.kubernetes import manifests as M

    spec = KIMI.engines["sglang"]
    assert spec.dist_timeout_s == 1800
    pods = M.rank_argvs(KIMI, "sglang", spec, "10.0.0.1")
    assert len(pods) == 2
    for argv in pods:
        assert argv[:3] == ["python3", "-m", "sglang.launch_server"]
        assert argv[argv.index("--dist-timeout") + 1] == "1800"
        err, opts = sglang.parse(argv[3:])
        assert err is None and opts is not None and opts["--dist-timeout"] == 1800, err
        handlers, level = logging.root.handlers[:], logging.root.level
        try:                # it calls logging.basicConfig(force=True): the test's log capture is put back
            assert prepare_server_args(argv[3:]).dist_timeout == 1800
        finally:
            logging.root.handlers[:], logging.root.level = handlers, level
    # every rank and every variant Gate 0 judges carries it, and SGLang's parser takes each
    argvs = planned_argvs(KIMI, "sglang", "/models/m")
    assert all(a[a.index("--dist-timeout") + 1] == "1800" for a in argvs.values())
    facts = collect(sglang, argvs)
    assert all(err is None for err in facts["parse"].values()), facts["parse"]


def test_ranks_differ_only_in_node_rank(sglang):
    c = _checks(sglang, KIMI)["ranks"]
    assert c.status == "pass" and c.observed == {"rank1": {"--node-rank": (0, 1)}}


def test_a_rank_that_differs_beyond_placement_fails(sglang):
    facts = collect(sglang, {"rank0": planned_argvs(KIMI, "sglang", "/m")["rank0"],
                             "rank1": planned_argvs(KIMI, "sglang", "/m")["rank1"] + ["--tp-size", "8"]})
    c = {c.name: c for c in judge(facts, KIMI, "sglang", ARCH, "the test")}["ranks"]
    assert c.status == "fail" and "--tp-size 16->8" in c.detail


def test_dspark_variant_is_seven_proposed_tokens(sglang):
    """7 draft tokens is DSPARK's gamma (--speculative-dspark-block-size); SGLang verifies gamma+1."""
    c = _checks(sglang, KIMI)["variant-dspark"]
    assert c.status == "pass"
    assert c.observed == {"--speculative-algorithm": (None, "DSPARK"), "--speculative-dspark-block-size": (None, 7)}


def test_hicache_variant_keeps_the_radix_cache(sglang):
    """SGLang refuses --enable-hierarchical-cache with --disable-radix-cache (kv_cache_hook): HiCache is its tier."""
    c = _checks(sglang, KIMI)["variant-hicache"]
    assert c.status == "pass" and c.observed["--disable-radix-cache"] == (True, False)


def test_misspelled_flag_fails_naming_it(sglang):
    c = _checks(sglang, _with(KIMI, args={"extra": {"enable-symm-memory": True}}))
    assert c["cli-flags"].status == "fail" and "unrecognized arguments: --enable-symm-memory" in c["cli-flags"].detail


def test_a_mistake_shared_by_every_command_is_said_once(sglang):
    """Both ranks' rejection is one sentence; variants built on the bad baseline point at it, not repeat it."""
    c = _checks(sglang, _with(KIMI, args={"extra": {"enable-symm-memory": True}}))
    assert c["cli-flags"].detail.count("unrecognized arguments") == 1
    assert "rank0 and rank1 commands" in c["cli-flags"].detail
    for v in ("prefix-cache", "dspark", "hicache", "symm-mem"):
        d = c[f"variant-{v}"]
        assert d.status == "fail" and "inherits the baseline command's rejection (rank0, rank1" in d.detail
        assert set(d.observed) == {"rank0", "rank1"}


def test_a_mistake_only_in_a_variant_names_the_variant_s_own_error(sglang):
    bad = [Variant(name="typo", engine="sglang", change={"extra": {"enable-hierarchical-cach": True}})]
    c = _checks(sglang, _with(KIMI, experiments=bad))
    assert c["cli-flags"].status == "pass"
    d = c["variant-typo"]
    assert d.status == "fail" and "rejects variant 'typo' (rank0, rank1)" in d.detail
    assert d.detail.count("--enable-hierarchical-cach") == 1


def test_an_abbreviation_is_not_accepted_for_the_flag(sglang):
    """sglang serve itself would take --enable-symm as --enable-symm-mem (argparse prefix matching); the plan may not."""
    c = _checks(sglang, _with(KIMI, args={"extra": {"enable-symm": True}}))
    assert c["cli-flags"].status == "fail" and "--enable-symm" in c["cli-flags"].detail


def test_unknown_tool_parser_fails_in_the_registry_and_the_parser(sglang):
    c = _checks(sglang, _with(KIMI, tool_call_parser="kimi_k4"))
    assert c["tool-call-parser"].status == "fail" and "'kimi_k4' is not registered" in c["tool-call-parser"].detail
    assert c["cli-flags"].status == "fail" and "--tool-call-parser: invalid choice: 'kimi_k4'" in c["cli-flags"].detail


def test_unknown_reasoning_parser_fails(sglang):
    c = _checks(sglang, _with(KIMI, reasoning_parser="kimi-k3"))
    assert c["reasoning-parser"].status == "fail" and "'kimi-k3'" in c["reasoning-parser"].detail
    assert "kimi_k3" in c["reasoning-parser"].detail   # the registered spelling is listed


@pytest.mark.parametrize(("field", "value", "flag"), [
    ("moe_runner_backend", "marlinn", "--moe-runner-backend"),
    ("attention_backend", "flash_mla", "--decode-attention-backend"),
])
def test_backend_value_sglang_does_not_know_fails_naming_flag_and_value(sglang, field, value, flag):
    c = _checks(sglang, _with(KIMI, args={field: value}))["cli-flags"]
    assert c.status == "fail" and f"argument {flag}: invalid choice: '{value}'" in c.detail


def test_unknown_speculative_algorithm_fails_the_variant(sglang):
    """--speculative-algorithm is a free string in the parser; SGLang's SpeculativeAlgorithm decides."""
    bad = [Variant(name="dsparkk", engine="sglang", change={"speculative": {"method": "dsparkk",
                                                                           "num_speculative_tokens": 7}})]
    c = _checks(sglang, _with(KIMI, experiments=bad))["variant-dsparkk"]
    assert c.status == "fail" and "--speculative-algorithm DSPARKK" in c.detail
    assert "Unknown speculative algorithm name" in c.detail


def test_two_variants_changes_at_once_fail_naming_both(sglang):
    """One variable smuggling DSpark and HiCache in together: SGLang's parse shows two groups changed."""
    both = [Variant(name="dspark-and-hicache", engine="sglang", change={"extra": {
        "speculative-algorithm": "DSPARK", "speculative-dspark-block-size": 7, "enable-hierarchical-cache": True}})]
    # on a radix-cache baseline, so HiCache itself is legal and only the doubling is wrong
    c = _checks(sglang, _with(KIMI, experiments=both, args={"prefix_cache": True}))["variant-dspark-and-hicache"]
    assert c.status == "fail" and "changes 2 groups" in c.detail
    assert "--enable-hierarchical-cache" in c.detail and "--speculative-algorithm" in c.detail


def test_two_changes_in_one_variant_are_refused_by_the_profile(tmp_path):
    text = open("params/profiles/kimi-k3-h20.yaml").read().replace(
        "change: {hicache: true}", "change: {hicache: true, prefix_cache: true}")
    bad = tmp_path / "two.yaml"
    bad.write_text(text)
    with pytest.raises(ProfileError, match="exactly one variable.*hicache.*prefix_cache"):
        load_profile(str(bad))


def test_unregistered_architecture_fails(sglang):
    c = _checks(sglang, KIMI, archs=["KimiK4ForConditionalGeneration"])["architecture"]
    assert c.status == "fail" and "KimiK4ForConditionalGeneration" in c.detail


def test_vllm_only_variants_do_not_reach_sglang():
    argvs = planned_argvs(KIMI, "vllm", "/m")
    assert not any(k.startswith(("dspark/", "hicache/")) for k in argvs) and "prefix-cache/rank0" in argvs


def test_entry_classes_resolve_names_as_import_would():
    src = ("from m.common import Base as Alias\nclass A: pass\nB = A\nEntryClass = A\n"
           "EntryClass = [A, B, Alias]\n")
    assert entry_classes(src) == ["A", "A", "Base"]      # last assignment wins; __name__ through aliases
    assert entry_classes("class A: pass\n") is None


def test_model_registry_read_from_the_installed_source(sglang):
    archs = registered_architectures()
    assert archs["KimiK3ForConditionalGeneration"] == "kimi_k3.py" and archs["LlamaForCausalLM"] == "llama.py"
    assert "KimiK3ForConditionalGeneration" not in registered_architectures(disabled={"kimi_k3"})


@pytest.mark.parametrize("mode", ["stat", "per_pass"])
def test_expert_recorder_mode_is_accepted_by_sglangs_parser(sglang, mode):
    """args.expert_distribution_recorder_mode becomes --expert-distribution-recorder-mode, which SGLang's own
    parser accepts on both ranks (Gate 4 reads each case's expert load through its recorder)."""
    p = _with(KIMI, args={"expert_distribution_recorder_mode": mode})
    argv = planned_argvs(p, "sglang", "/m")["rank0"]
    assert argv[argv.index("--expert-distribution-recorder-mode") + 1] == mode
    c = _checks(sglang, p)
    assert c["cli-flags"].status == "pass", c["cli-flags"].detail


def test_a_recorder_mode_sglang_does_not_know_fails_naming_it(sglang):
    """The profile's type refuses an unknown mode; passed through extra instead, SGLang's parser names it."""
    c = _checks(sglang, _with(KIMI, args={"extra": {"expert-distribution-recorder-mode": "sometimes"}}))
    assert c["cli-flags"].status == "fail" and "sometimes" in c["cli-flags"].detail
