"""A gate's declaration is complete, and the graph speaks each gate's command line.

Every task of every profile's graph (its own orchestrator) parses with its gate's parser, the one
``gauntlet step <gate>`` builds, and its options build (the gate's own validation) once the graph's references
are replaced by plausible values; the rendered containers agree with each gate's ``NEEDS`` (image, host network,
one pod per node). ``gate_args`` / ``to_argv`` write what ``add_options`` parses back.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from gauntlet.contract import UsageError
from gauntlet.params import load_images, load_profile
from gauntlet.params.models import Profile
from gauntlet.steps import load_step, needs_of
from gauntlet.steps.options import GateOptions, add_options, option, options_from, to_argv
from gauntlet.workflows import refs
from gauntlet.workflows.cli import build_parser
from gauntlet.workflows.graph import (BENCH_IMAGE, ENGINE_SEQUENCE, NCCL_ENV_INPUT, ORCHESTRATORS, STEP_IMAGE, Graph,
                                      Task, build_graph, gate_args)
from gauntlet.workflows.render import render_documents

REPO = Path(__file__).resolve().parent.parent
PROFILES = sorted(p.stem for p in (REPO / "params" / "profiles").glob("*.yaml"))
# Tasks whose flags parse but whose options the gate refuses, once they run, for a reason of the profile: h200-1gpu
# has no model.source_path, so its prewarm would stop at Gate 0 with this one-line error; it runs only with the
# workflow parameter prewarm=true, which that graph's enum no longer offers and its params step refuses
# (tests/test_params_step.py). Drop an entry once the graph no longer has the task.
REFUSED = {("h200-1gpu", "prewarm-0"): "prewarm: no --src and the profile has no model.source_path"}


def _orchestrator(profile: Profile) -> str:
    return "argo" if profile.hardware.kind == "kubernetes" else "local"


def _tasks(graph: Graph) -> list[tuple[str, Task]]:
    """(dag name, task) of every container task, the exit handler included."""
    return [(d.name, t) for d in graph.dags for t in d.tasks if t.step] + [("main", graph.exit_handler)]


def _plausible(profile: Profile, engine: str | None):
    """A value of the right type for each reference the graph writes into a task's flags, as the run gives it."""
    nodes = [n.name for n in profile.hardware.nodes]
    env = {"NCCL_SOCKET_IFNAME": "eth0"}
    per_node = json.dumps({n: env for n in nodes})
    case = next(c.name for c in profile.bench.cases if c.requires_stable is None)
    values = {
        refs.parameter("json"): json.dumps([{"name": "engines", "value": profile.engine_order()[0]}]),
        refs.parameter("run-dir"): "/runs/r1",
        refs.workflow("status"): "Failed",
        refs.workflow("failures"): "null",
        refs.output("deploy", "endpoint"): "http://10.0.0.7:8000",
        refs.output("suspect", "suspect_cases"): case,
        refs.output("regress", "verdict"): "fail",
        refs.output("network", "nccl_env"): per_node,
        refs.input_param(NCCL_ENV_INPUT): per_node,
        **{refs.output(f"nodes-{i}", "nccl_env"): json.dumps(env) for i in range(len(nodes))},
    }
    if engine is not None:
        values[refs.input_param("engine")] = engine

    def lookup(ref: refs.Ref) -> str:
        if ref.kind == "status":            # any earlier task's phase, as Argo and the local runner fill it
            return "Omitted"
        assert ref in values, f"{ref}: no plausible value here; add one for this new reference"
        return values[ref]
    return lookup


def _parse(step: str, argv: list[str]) -> argparse.Namespace:
    """``gauntlet step`` argv through the CLI's own parser; argparse's complaint becomes the assertion."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return build_parser(argv).parse_args(argv)
    except SystemExit:
        raise AssertionError(f"gauntlet step {step}: {err.getvalue().strip().splitlines()[-1]}") from None


@dataclass(frozen=True)
class Parsed:
    dag: str
    task: Task
    engine: str | None        # the sequence's engine, or None in the main DAG
    ns: argparse.Namespace    # the parsed command line
    opts: GateOptions | None  # the gate's options built from it (None: refused, REFUSED says why)


def _parsed(profile_name: str) -> list[Parsed]:
    """Every task of the profile's graph, once per engine in an engine sequence, as its gate's options."""
    profile = load_profile(profile_name)
    graph = build_graph(profile, _orchestrator(profile))
    out = []
    for dag, task in _tasks(graph):
        for engine in (profile.engine_order() if dag == ENGINE_SEQUENCE else [None]):
            lookup = _plausible(profile, engine)
            argv = ["step", task.step, "--profile", profile_name, "--out", "/runs/r1/x",
                    *(refs.substitute(a, lookup) for a in task.args)]
            ns = _parse(task.step, argv)
            needs = needs_of(task.step)
            refused = REFUSED.get((profile_name, task.name))
            try:
                opts = options_from(load_step(task.step).Options, ns, profile if needs.profile else None)
            except UsageError as exc:
                if str(exc) != refused:
                    raise AssertionError(f"{profile_name} {dag}/{task.name} ({engine}): {exc}") from None
                opts = None
            else:
                assert refused is None, f"{profile_name} {task.name} builds now: drop its REFUSED entry"
            out.append(Parsed(dag, task, engine, ns, opts))
    return out


@pytest.mark.parametrize("profile_name", PROFILES)
def test_every_task_parses_with_its_gates_options(profile_name):
    parsed = _parsed(profile_name)
    steps = {p.task.step for p in parsed}
    assert {"params", "preflight", "deploy", "smoke", "perf", "regress", "report", "cleanup"} <= steps
    by = {(p.dag, p.task.name, p.engine): p.opts for p in parsed}
    profile = load_profile(profile_name)
    for engine in profile.engine_order():
        # the flags arrived as values, not merely as words the parser tolerated
        assert by[(ENGINE_SEQUENCE, "perf", engine)].engine == engine
        assert by[(ENGINE_SEQUENCE, "confirm", engine)].phase == "confirm"
        assert by[(ENGINE_SEQUENCE, "suspect", engine)].stage == "suspect"
        assert by[("main", f"engine-check-{engine}", None)].engine == engine
    assert by[("main", "report", None)].regress_verdict == "fail"
    assert by[("main", "cleanup", None)].workflow_status == "Failed"


@pytest.mark.parametrize("profile_name", PROFILES)
def test_a_profile_builds_for_its_own_orchestrator_only(profile_name):
    profile = load_profile(profile_name)
    other = next(o for o in ORCHESTRATORS if o != _orchestrator(profile))
    with pytest.raises(UsageError, match="hardware.kind"):
        build_graph(profile, other)


def test_the_check_fails_on_a_flag_the_gate_does_not_know_and_on_a_missing_required_one():
    with pytest.raises(AssertionError, match="unrecognized arguments: --rounds"):
        _parse("smoke", ["step", "smoke", "--profile", "kimi-k3-h20", "--endpoint", "http://h:1", "--rounds", "3"])
    with pytest.raises(AssertionError, match="required: --endpoint"):
        _parse("smoke", ["step", "smoke", "--profile", "kimi-k3-h20"])


@pytest.mark.parametrize("profile_name", PROFILES)
def test_per_node_gates_run_once_on_each_pool_node(profile_name):
    profile = load_profile(profile_name)
    graph = build_graph(profile, _orchestrator(profile))
    nodes = [n.name for n in profile.hardware.nodes]
    per_node = {t.step for _, t in _tasks(graph) if needs_of(t.step).per_node}
    if _orchestrator(profile) == "argo":
        assert per_node == {"prewarm", "preflight", "nodes", "pull"}
    for step in per_node:
        pinned = [t.node for _, t in _tasks(graph) if t.step == step]
        # Gate 1's pull: once per node for each engine's image
        times = len(profile.engines) if step == "pull" else 1
        assert pinned == (nodes * times if _orchestrator(profile) == "argo" else [None]), step


def _pinned(container: dict) -> list[str] | None:
    aff = container.get("affinity")
    if aff is None:
        return None
    terms = aff["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return [v for t in terms for e in t["matchExpressions"] for v in e["values"]]


@pytest.mark.parametrize("profile_name", [p for p in PROFILES if load_profile(p).hardware.kind == "kubernetes"])
def test_rendered_containers_agree_with_each_gates_needs(profile_name):
    profile = load_profile(profile_name)
    images = load_images()
    wt = next(v for k, v in render_documents(profile).items() if k.endswith(".workflowtemplate.yaml"))
    templates = {t["name"]: t for t in wt["spec"]["templates"]}
    nodes = [n.name for n in profile.hardware.nodes]
    seen = set()
    for p in _parsed(profile_name):
        name = f"seq-{p.task.name}" if p.dag == ENGINE_SEQUENCE else p.task.name
        t, needs = templates[name], needs_of(p.task.step)
        want = {"steps": STEP_IMAGE, "bench": BENCH_IMAGE}.get(needs.image) or profile.engines[p.ns.engine].image
        assert t["container"]["image"] == images[want].ref, name
        assert ("initContainers" in t) == (needs.image == "engine"), name
        assert ("hostNetwork" in t.get("podSpecPatch", "")) == needs.host_network, name
        pinned = _pinned(t)
        if needs.per_node:
            assert pinned == [p.task.node] and p.task.node in nodes, name
        elif needs.model_cache or needs.node_gpus or p.task.node:
            assert pinned == ([p.task.node] if p.task.node else nodes), name
        else:
            assert pinned is None, name
        seen.add(needs.image)
    assert seen == {"steps", "engine", "bench"}


# ------------------------------------------------------------------ to_argv / gate_args: the way back


@dataclass(frozen=True, kw_only=True)
class Demo(GateOptions):
    endpoint: str = option(help="engine base URL")
    cases: tuple[str, ...] = option((), csv=True)
    inputs: tuple[str, ...] | None = option(None, nargs="*")
    rounds: int | None = option(None, ge=1)
    share: float = option(0.5)
    no_store: bool = option(False)
    verify: bool = option(True)
    launcher: str | None = option(None, choices=("local", "kubernetes"))
    src: Path | None = option(None)


def _round_trip(argv: tuple[str, ...]) -> Demo:
    p = argparse.ArgumentParser(exit_on_error=False)
    add_options(Demo, p)
    return options_from(Demo, p.parse_args(list(argv)), None)


def test_to_argv_writes_what_the_parser_reads_back():
    values = {"endpoint": "http://h:1", "cases": ("a", "b"), "inputs": ("x", "y"), "rounds": 3, "share": 1,
              "no_store": True, "verify": False, "launcher": "local", "src": Path("/m")}
    argv = to_argv(Demo, values)
    assert argv == ("--endpoint", "http://h:1", "--cases", "a,b", "--inputs", "x", "y", "--rounds", "3", "--share", "1",
                    "--no-store", "--no-verify", "--launcher", "local", "--src", "/m")
    o = _round_trip(argv)
    assert (o.endpoint, o.cases, o.inputs, o.rounds, o.share, o.no_store, o.verify, o.launcher, o.src) == \
        ("http://h:1", ("a", "b"), ("x", "y"), 3, 1.0, True, False, "local", Path("/m"))
    # defaults write nothing, and parse back to the defaults
    assert to_argv(Demo, {"endpoint": "e", "no_store": False, "verify": True, "rounds": None}) == \
        ("--endpoint", "e", "--verify")
    assert _round_trip(to_argv(Demo, {"endpoint": "e"})) == Demo(endpoint="e")


def test_to_argv_refuses_what_the_gate_would_not_parse():
    with pytest.raises(TypeError, match="no command-line option bogus"):
        to_argv(Demo, {"endpoint": "e", "bogus": 1})
    with pytest.raises(TypeError, match="required --endpoint not given"):
        to_argv(Demo, {"rounds": 2})
    with pytest.raises(TypeError, match="--rounds '3' is not a int"):
        to_argv(Demo, {"endpoint": "e", "rounds": "3"})
    with pytest.raises(TypeError, match="--rounds True is not a int"):
        to_argv(Demo, {"endpoint": "e", "rounds": True})
    with pytest.raises(TypeError, match="--launcher 'ssh' is not one of local, kubernetes"):
        to_argv(Demo, {"endpoint": "e", "launcher": "ssh"})
    with pytest.raises(TypeError, match="--cases 'a,b' is not a tuple"):
        to_argv(Demo, {"endpoint": "e", "cases": "a,b"})
    with pytest.raises(TypeError, match="--share cannot be None"):
        to_argv(Demo, {"endpoint": "e", "share": None})


def test_gate_args_takes_references_for_any_value():
    eng, cases = refs.input_param("engine"), refs.output("suspect", "suspect_cases")
    argv = gate_args("perf", engine=eng, endpoint=refs.output("deploy", "endpoint"), cases=cases, rounds=2)
    assert argv == ("--engine", str(eng), "--endpoint", "{{tasks.deploy.outputs.parameters.endpoint}}",
                    "--cases", str(cases), "--rounds", "2")
    with pytest.raises(TypeError, match="perf.*required --endpoint not given"):
        gate_args("perf", engine="vllm", cases=("a",))
    with pytest.raises(TypeError, match="no command-line option stage"):
        gate_args("perf", engine="vllm", endpoint="http://h:1", cases=("a",), stage="suspect")
