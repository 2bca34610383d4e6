"""engine-check against the installed vLLM CPU build: its own registry and parser judge the plan."""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest

from gauntlet.params import load_profile
from gauntlet.params.models import Profile
from gauntlet.contract import Verdict
from gauntlet.steps.gates import engine_check
from gauntlet.steps.engines.vllm import VllmAdapter
from gauntlet.steps.gates.engine_check import collect, judge, planned_argvs
from gauntlet.steps.model.synth import synth_from_profile
from gauntlet.workflows.cli import main

pytestmark = pytest.mark.slow
LOCAL = load_profile("local-cpu")
KIMI = load_profile("kimi-k3-h20")
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")


@pytest.fixture(scope="module")
def vllm_adapter():
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed")
    return VllmAdapter()   # imports vLLM and builds its server parser once (about 20 s on 2 cores)


def _engine(profile: Profile, engine: str = "vllm", **changes) -> Profile:
    spec = profile.engines[engine]
    args = changes.pop("args", None)
    if args:
        spec = spec.model_copy(update={"args": spec.args.model_copy(update=args)})
    spec = spec.model_copy(update=changes)
    return profile.model_copy(update={"engines": {**profile.engines, engine: spec}})


def _checks(adapter, profile: Profile, archs=None) -> dict:
    facts = collect(adapter, planned_argvs(profile, "vllm", "/models/m"))
    archs = archs if archs is not None else profile.model.architecture.architectures
    return {c.name: c for c in judge(facts, profile, "vllm", archs, "the profile")}


@needs_vllm
def test_local_cpu_profile_passes_through_the_cli(tmp_path):
    rc = main(["step", "engine-check", "--profile", "local-cpu", "--engine", "vllm", "--out", str(tmp_path)])
    v = Verdict.read(tmp_path)
    assert rc == 0, [(c.name, c.detail) for c in v.checks]
    s = {c.name: c.status for c in v.checks}
    assert s == {"engine-import": "pass", "engine-version": "pass", "engine-env": "pass", "architecture": "pass",
                 "cli-flags": "pass", "ranks": "skip",
                 "variant-prefix-cache": "pass", "reasoning-parser": "skip", "tool-call-parser": "pass"}
    assert "--tool-call-parser" in v.metrics["argv"]["rank0"]
    # what the report's A/B section reads: vLLM's own resolution of the command (no backend named: its choice)
    assert v.metrics["attention"] == {"prefill": "auto", "prefill (MLA layers)": "auto", "decode": "auto"}


def test_unknown_flag_fails_cli_flags(vllm_adapter):
    c = _checks(vllm_adapter, _engine(LOCAL, args={"extra": {"no-such-flag": True}}))
    assert c["cli-flags"].status == "fail" and "unrecognized arguments: --no-such-flag" in c["cli-flags"].detail
    assert c["architecture"].status == "pass" and c["tool-call-parser"].status == "pass"


def test_abbreviated_flag_is_not_accepted_as_a_prefix(vllm_adapter):
    c = _checks(vllm_adapter, _engine(LOCAL, args={"extra": {"max-num-batched": 256}}))
    assert c["cli-flags"].status == "fail" and "--max-num-batched" in c["cli-flags"].detail


def test_unknown_tool_parser_fails_its_check(vllm_adapter):
    c = _checks(vllm_adapter, _engine(LOCAL, tool_call_parser="no_such_parser"))
    assert c["tool-call-parser"].status == "fail"
    assert "'no_such_parser' is not registered" in c["tool-call-parser"].detail and "hermes" in c["tool-call-parser"].detail


def test_unknown_reasoning_parser_fails_its_check(vllm_adapter):
    c = _checks(vllm_adapter, _engine(LOCAL, reasoning_parser="no_such_reasoner"))
    assert c["reasoning-parser"].status == "fail" and "no_such_reasoner" in c["reasoning-parser"].detail


def test_unregistered_architecture_fails(vllm_adapter):
    c = _checks(vllm_adapter, LOCAL, archs=["NoSuchModelForCausalLM"])
    assert c["architecture"].status == "fail" and "NoSuchModelForCausalLM" in c["architecture"].detail


def test_unknown_attention_backend_is_refused_by_vllms_config(vllm_adapter):
    c = _checks(vllm_adapter, _engine(LOCAL, args={"attention_backend": "bogus"}))
    assert c["cli-flags"].status == "fail" and "Unknown attention backend" in c["cli-flags"].detail


def test_auto_tool_choice_without_a_parser_fails_vllms_own_validation(vllm_adapter):
    c = _checks(vllm_adapter, _engine(LOCAL, tool_call_parser=None))
    assert c["cli-flags"].status == "fail" and "--enable-auto-tool-choice requires --tool-call-parser" in c["cli-flags"].detail


def test_kimi_plan_both_ranks_and_parsers_accepted_by_vllm_032(vllm_adapter, tmp_path):
    """The Kimi vLLM plan (two nodes, --headless on rank 1, FLASHMLA, kimi_k3 parsers) parses as is."""
    model = synth_from_profile(KIMI, tmp_path / "kimi")
    facts = collect(vllm_adapter, planned_argvs(KIMI, "vllm", str(model)))
    assert set(facts["parse"]) == {"rank0", "rank1", "prefix-cache/rank0", "prefix-cache/rank1"}
    assert "--headless" in facts["argv"]["rank1"] and "--headless" not in facts["argv"]["rank0"]
    assert facts["argv"]["rank0"][:2] == facts["argv"]["rank1"][:2] == ["serve", str(model)]
    c = {c.name: c for c in judge(facts, KIMI, "vllm", ["KimiK3ForConditionalGeneration"], f"{model}/config.json")}
    assert all(c[n].status == "pass" for n in ("cli-flags", "reasoning-parser", "tool-call-parser", "architecture",
                                               "ranks", "variant-prefix-cache")), [(x.name, x.detail) for x in c.values()]
    assert set(c["ranks"].observed["rank1"]) == {"--node-rank", "--headless"}
    assert c["variant-prefix-cache"].observed == {"--enable-prefix-caching": (False, True)}


def test_sglang_outside_its_image_is_an_error_not_a_crash(tmp_path, monkeypatch):
    def missing():
        raise ImportError("No module named 'sglang'")
    from gauntlet.steps.engines import sglang
    monkeypatch.setattr(sglang, "ENGINE", dataclasses.replace(sglang.ENGINE, checker=missing))
    rc = main(["step", "engine-check", "--profile", "kimi-k3-h20", "--engine", "sglang", "--out", str(tmp_path)])
    v = Verdict.read(tmp_path)
    assert rc == 1 and v.status == "error"
    assert "must run inside the engine image" in v.checks[0].detail and not (tmp_path / "traceback.txt").exists()


def test_vllm_moe_backend_flag_is_checked_against_vllms_choices(vllm_adapter):
    """engine_cmd maps moe_runner_backend to vLLM 0.32's --moe-backend (marlin passes, a typo fails)."""
    assert "--moe-backend" in planned_argvs(KIMI, "vllm", "/m")["rank0"]
    c = _checks(vllm_adapter, _engine(LOCAL, args={"moe_runner_backend": "marlin"}))
    assert c["cli-flags"].status == "pass"
    c = _checks(vllm_adapter, _engine(LOCAL, args={"moe_runner_backend": "marlinn"}))
    assert c["cli-flags"].status == "fail" and "--moe-backend" in c["cli-flags"].detail


def test_engine_check_parses_exactly_the_argv_each_pod_runs():
    """The argv engine-check judges is each rank's pod argv (steps/backends/kubernetes/manifests.py rank_argvs, the launch
    script's exec) without its program: `vllm` then `serve <model>`, and `--headless` on rank 1 only."""
    from gauntlet.steps.backends.kubernetes import manifests as M
    pods = M.rank_argvs(KIMI, "vllm", KIMI.engines["vllm"], engine_check.LEADER.rpartition(":")[0])
    planned = planned_argvs(KIMI, "vllm", KIMI.model.mount_path)
    assert [p[0] for p in pods] == ["vllm", "vllm"]
    assert [p[1:] for p in pods] == [planned["rank0"], planned["rank1"]]
    assert planned["rank0"][:2] == ["serve", KIMI.model.mount_path] and "--model" not in planned["rank0"]
    assert "--headless" not in pods[0] and "--headless" in pods[1]


def test_argv_only_the_deprecated_api_server_accepted_fails_vllm_serve(vllm_adapter):
    """`--model` beside the positional model: the deprecated api_server's parser (make_arg_parser on a bare
    FlexibleArgumentParser, as its main() builds it) took it, `vllm serve` refuses it on both ranks."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    profile = _engine(KIMI, args={"extra": {"model": "/models/other", "enable-auto-tool-choice": True}})
    argvs = planned_argvs(profile, "vllm", "/models/m")
    make_arg_parser(FlexibleArgumentParser()).parse_args(argvs["rank1"][1:])   # the old entry point: accepted
    c = {c.name: c for c in judge(collect(vllm_adapter, argvs), profile, "vllm", None, "")}
    assert c["cli-flags"].status == "fail" and set(c["cli-flags"].observed) >= {"rank0", "rank1"}
    assert "unrecognized arguments: /models/m" in c["cli-flags"].detail


def test_misspelt_flag_fails_gate0_naming_it_on_every_rank(vllm_adapter):
    profile = _engine(KIMI, args={"extra": {"tensor-paralel-size": 16, "enable-auto-tool-choice": True}})
    c = {c.name: c for c in judge(collect(vllm_adapter, planned_argvs(profile, "vllm", "/models/m")), profile,
                                  "vllm", None, "")}
    assert c["cli-flags"].status == "fail" and set(c["cli-flags"].observed) >= {"rank0", "rank1"}
    assert "unrecognized arguments: --tensor-paralel-size 16" in c["cli-flags"].detail


def test_a_program_other_than_vllm_serve_is_refused(vllm_adapter):
    err, opts = vllm_adapter.parse(["--model", "/models/m"])
    assert opts is None and "not a `vllm serve` command" in err


def test_each_pods_argv_carries_the_collective_timeout_and_vllm_takes_it(vllm_adapter):
    """Rank start-up skew past torch's 600 s NCCL default (a rank waits in its first collective for one still
    pulling or loading): each rank's exact pod argv (manifests.rank_argvs, the launch script's exec) carries the
    profile's engines.vllm.dist_timeout_s as --distributed-timeout-seconds; `vllm serve`'s own parser accepts it
    on both ranks (typed int), and the EngineArgs vLLM builds from the parsed command line
    (EngineArgs.from_cli_args, as vllm/entrypoints/cli/serve.py does) hold it, which create_engine_config puts
    into ParallelConfig.distributed_timeout_seconds, the timeout
    vllm/v1/worker/gpu_worker.py init_worker_distributed_environment gives torch.distributed."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.cli import serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from gauntlet.steps.backends.kubernetes import manifests as M

    spec = KIMI.engines["vllm"]
    assert spec.dist_timeout_s == 1800
    pods = M.rank_argvs(KIMI, "vllm", spec, engine_check.LEADER.rpartition(":")[0])
    # the parser vllm/entrypoints/cli/main.py main() builds: `vllm` with its `serve` subcommand
    cli = FlexibleArgumentParser(prog="vllm")
    (cmd,) = [c for c in serve.cmd_init() if c.name == "serve"]
    cmd.subparser_init(cli.add_subparsers(required=False, dest="subparser"))
    assert len(pods) == 2
    for argv in pods:
        assert argv[argv.index("--distributed-timeout-seconds") + 1] == "1800"
        err, opts = vllm_adapter.parse(argv[1:])
        assert err is None and opts is not None and opts["--distributed-timeout-seconds"] == 1800, err
        assert EngineArgs.from_cli_args(cli.parse_args(argv[1:])).distributed_timeout_seconds == 1800
    # every rank and every variant Gate 0 judges carries it, and engine-check passes them
    argvs = planned_argvs(KIMI, "vllm", "/models/m")
    assert all(a[a.index("--distributed-timeout-seconds") + 1] == "1800" for a in argvs.values())
    facts = collect(vllm_adapter, argvs)
    assert all(err is None for err in facts["parse"].values()), facts["parse"]
