"""A stand-in for `python -m gauntlet.workflows.cli` in runner tests: fake gates plus the real cleanup step.

Every gate runs under the real evidence contract (gauntlet.steps.runner.run_step). The fake engine
is tests/fakes/fake_engine.py, started detached and labelled exactly like the local deploy.
"""

import argparse
import json
import os
import sys
import time
import types
from dataclasses import dataclass
from pathlib import Path

from gauntlet.contract import Check
from gauntlet.steps import Needs
from gauntlet.steps.backends.local import deploy as _deploy_local
from gauntlet.steps.gates import cleanup
from gauntlet.steps.engines.local_vllm import LocalEngine, free_port
from gauntlet.steps.options import GateOptions, add_options, option
from gauntlet.steps.runner import run_step

FAKE_ENGINE = Path(__file__).with_name("fake_engine.py")


@dataclass(frozen=True, kw_only=True)
class FakeOptions(GateOptions):
    profile_ref: str | None = option(None, flag="--profile")
    engine: str | None = option(None)
    endpoint: str | None = option(None)


class Fake:
    NEEDS = Needs(profile=False)
    HELP = "fake"
    Options = FakeOptions

    def __init__(self, name, body):
        self.NAME, self.body = name, body

    def run(self, args, out):
        (out / "argv.json").write_text(json.dumps(sys.argv))
        if os.environ.get("FAKE_SLOW") == out.name:
            time.sleep(120)
        result = self.body(args, out)
        if os.environ.get("FAKE_SLOW_AFTER") == out.name:      # e.g. deploy: the engine is up, the step still runs
            time.sleep(120)
        return result


def _pass(args, out):
    return [Check("ok", "pass", 1, 1, "fine")], {"outputs": {"unlock_more": True}}


def _fail(args, out):
    return [Check("answer", "fail", 5, 32, "wrong answer: 32 for 2+3")], {"outputs": {"unlock_more": True}}


def _engine(args, out):
    run_dir = _deploy_local.run_dir_of(out)
    port = free_port()
    eng = LocalEngine([sys.executable, str(FAKE_ENGINE), "ready", str(port), "m"], port=port, served_name="m",
                      log_path=out / "engine.log", startup_timeout_s=20, poll_s=0.1,
                      env={_deploy_local.LABEL_DIR: str(run_dir), _deploy_local.LABEL_PORT: str(port)})
    eng.launch()
    _deploy_local._write_state(_deploy_local.state_path(run_dir, args.engine), eng, args.engine, None,
                               started="now")
    return [Check("engine-ready", "pass", None, eng.startup_s, "up")], {"outputs": {"endpoint": eng.base_url}}


def _teardown(args, out):
    # the real local teardown; its options need only the engine (the fake graph's engines are not all the profile's)
    return _deploy_local.teardown(types.SimpleNamespace(engine=args.engine, variant=None), out)


def _engine_check(args, out):
    # a Gate 0 check that needs its engine's program: $FAKE_PROGRAM_<ENGINE> names it (absent: nothing to check)
    prog = os.environ.get(f"FAKE_PROGRAM_{(args.engine or '').upper()}")
    if prog and not Path(prog).exists():
        return [Check("program", "fail", "present", "absent", f"{prog} not found")], {}
    return [Check("program", "pass", "present", "present", prog or "-")], {}


MODULES = {"fake-pass": Fake("fake-pass", _pass), "engine-check": Fake("engine-check", _engine_check), "perf": Fake("perf", _pass), "fake-fail": Fake("fake-fail", _fail),
           "fake-engine": Fake("fake-engine", _engine), "fake-teardown": Fake("fake-teardown", _teardown),
           "cleanup": cleanup}


def main(argv):
    assert argv[0] == "step"
    mod = MODULES[argv[1]]
    if argv[1] == "cleanup" and os.environ.get("FAKE_SLOW") == "cleanup":
        (Path(argv[argv.index("--out") + 1])).mkdir(parents=True, exist_ok=True)
        time.sleep(120)                                          # the exit handler has started, nothing released yet
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    add_options(mod.Options, p)             # the gate's own flags (cleanup and the fakes: their own --profile)
    return run_step(mod, p.parse_args(argv[2:]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
