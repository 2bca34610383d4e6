"""The engine registry: one list of engines everywhere, every engine whole, and a new engine needs no edits elsewhere.

The params layer sits below steps and keeps its own names (``ENGINE_NAMES``/``EngineName``, ``TYPED_FLAGS``, the
pinned images' ``engine``); these tests fail when any of them and ``gauntlet.steps.engines.ENGINES`` disagree.
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing

import pytest

from gauntlet.contract import UsageError
from gauntlet.params import list_profiles, load_profile
from gauntlet.params.engine_inputs import TYPED_FLAGS
from gauntlet.params.loader import IMAGES_FILE, load_images
from gauntlet.params.models import ENGINE_NAMES, EngineName
from gauntlet.steps.engines import ENGINES, REQUIRED, engine, rules_for
from gauntlet.steps.engines.adapter import Engine
from gauntlet.steps.engines.argv import Placement
from gauntlet.steps.engines.commands import context_of, engine_command, engine_env, engine_flags, engine_program
from gauntlet.steps.engines.replies import OPENAI, ReplyRules

KIMI = load_profile("kimi-k3-h20")
LOCAL = load_profile("local-cpu")
PROFILES = [load_profile(n) for n in list_profiles()]        # every shipped profile: each engine's spec comes from one
CHECKER = ("architectures", "default_of", "group_of", "parse", "reasoning_parsers", "tool_parsers")


def disagreements(lists: dict[str, set[str]]) -> list[str]:
    """Each source that names other engines than the registry (the first entry), in one line apiece."""
    (ref_name, ref), *rest = lists.items()
    return [f"{name}: {sorted(names - ref)} not in {ref_name}, {sorted(ref - names)} missing"
            for name, names in rest if names != ref]


def test_every_list_of_engines_names_the_same_engines():
    lists = {
        "steps.engines.ENGINES": set(ENGINES),
        "params.models.ENGINE_NAMES": set(ENGINE_NAMES),
        "params.models.EngineName": set(typing.get_args(EngineName)),
        "params.engine_inputs.TYPED_FLAGS": set(TYPED_FLAGS),
        f"{IMAGES_FILE.name} engines": {i.engine for i in load_images(IMAGES_FILE).values() if i.engine},
    }
    assert disagreements(lists) == []


def test_the_comparison_names_a_missing_and_an_extra_engine():
    assert disagreements({"reg": {"a", "b"}, "params": {"a", "c"}, "same": {"a", "b"}}) == \
        ["params: ['c'] not in reg, ['b'] missing"]


@pytest.mark.parametrize("name", list(ENGINES))
def test_every_engine_provides_every_required_piece(name):
    eng = engine(name)
    assert isinstance(eng, Engine) and eng.name == name
    assert [f for f in REQUIRED if getattr(eng, f) in (None, "", ())] == []
    for f in ("program", "serve", "flags"):
        assert callable(getattr(eng, f)), f
    assert all(c.startswith("-") for c in eng.context_flags)
    assert isinstance(eng.replies, ReplyRules) and eng.replies.engine == name
    assert {"tool_finish", "reasoning_field"} <= set(eng.replies.sources)
    assert all(isinstance(v, tuple) and v for v in eng.metrics.values())
    missing = [m for m in CHECKER if not callable(getattr(eng.checker, m, None))]
    assert missing == [] and eng.checker.engine == name and isinstance(eng.checker.rank_flags, frozenset)
    assert (eng.diagnostic_client is None) == (eng.diagnostic_bench is None)
    # the profile's own spec of it gives a command whose context flag context_of reads back
    spec = next(p.engines[name] for p in PROFILES if name in p.engines)
    argv = engine_command(name, spec, model_path="/m", served_name="s")
    assert argv[:len(engine_program(name))] == engine_program(name)
    assert context_of(name, argv) == spec.args.context_length


def test_an_unknown_engine_is_one_line_naming_the_known_ones():
    with pytest.raises(UsageError) as e:
        engine("tgi")
    assert str(e.value) == f"unknown engine 'tgi': gauntlet knows {', '.join(ENGINES)}"
    with pytest.raises(UsageError, match="unknown engine 'tgi'"):
        engine_program("tgi")
    assert rules_for("tgi") is OPENAI and context_of("tgi", ["--max-model-len", "5"]) is None


def test_a_module_registered_at_run_time_is_the_engine_everywhere(monkeypatch):
    """A new engine is one module plus one registry line: the command, env, context and reply rules follow."""
    rules = ReplyRules("fake", "1.0", named_tool_finish="tool_calls", auto_tool_finish="tool_calls",
                       reasoning_field="thinking", sources={"tool_finish": "fake", "reasoning_field": "fake"})

    def serve(spec, *, model_path, served_name, host, placement):
        return ["--weights", model_path, "--name", served_name, "--listen", f"{host}:{spec.port}"]

    module = types.ModuleType("fake_engine")
    module.ENGINE = Engine(
        name="fake", title="Fake", program=lambda python: [python, "-m", "fake.serve"], serve=serve,
        flags=lambda spec: ["--window", str(spec.args.context_length)], context_flags=("--window",),
        checker=type("FakeAdapter", (), {}), replies=rules, metrics={"running": ("fake:busy",)},
        env=lambda spec: {"FAKE_THREADS": "2"})
    monkeypatch.setitem(sys.modules, "fake_engine", module)
    monkeypatch.setitem(ENGINES, "fake", "fake_engine")
    spec = LOCAL.engines["vllm"].model_copy(update={"args": LOCAL.engines["vllm"].args.model_copy(
        update={"context_length": 4096, "extra": {"seed": 7}})})
    argv = engine_command("fake", spec, model_path="/m", served_name="s", python="py", host="h",
                          placement=Placement())
    assert argv == ["py", "-m", "fake.serve", "--weights", "/m", "--name", "s", "--listen", f"h:{spec.port}",
                    "--window", "4096", "--seed", "7"]
    assert engine_flags("fake", spec) == ["--window", "4096", "--seed", "7"]
    assert engine_env("fake", spec)["FAKE_THREADS"] == "2"
    assert context_of("fake", argv) == 4096
    assert rules_for("fake") is rules and rules_for("fake").tool_finish("named") == "tool_calls"
    from gauntlet.steps.client.sampler import engine_gauges
    assert engine_gauges({"fake:busy": 3.0})["running"] == 3.0


def test_a_module_whose_engine_has_another_name_is_refused(monkeypatch):
    module = types.ModuleType("misnamed_engine")
    module.ENGINE = dataclasses.replace(engine("vllm"), name="other")
    monkeypatch.setitem(sys.modules, "misnamed_engine", module)
    monkeypatch.setitem(ENGINES, "fake", "misnamed_engine")
    with pytest.raises(UsageError, match="misnamed_engine defines engine 'other', registered as 'fake'"):
        engine("fake")
