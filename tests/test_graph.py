"""The graph's conditions as data: Need and When, their Argo strings (render), and their local evaluation
held against Argo's semantics (workflows/conditions.py, table-tested in test_runner.py)."""

from __future__ import annotations

import itertools

import pytest

from gauntlet.contract import UsageError
from gauntlet.params import load_profile
from gauntlet.workflows import refs
from gauntlet.workflows.conditions import ExpressionError, check_when, depends_tasks, eval_depends, eval_when
from gauntlet.workflows.graph import (ANY_OUTCOME, PHASES, SUCCEEDED, SUCCEEDED_OR_FAILED, SUCCEEDED_OR_SKIPPED,
                                      ConditionError, Dag, Need, Task, When, build_graph)
from gauntlet.workflows.render import argo_depends, argo_when

# ------------------------------------------------------------------ depends

DEPENDS = [
    ((), None),
    ((Need("a"),), "a.Succeeded"),
    ((Need("a"), Need("b")), "a.Succeeded && b.Succeeded"),
    ((Need("a", SUCCEEDED_OR_SKIPPED),), "(a.Succeeded || a.Skipped)"),
    ((Need("a", SUCCEEDED_OR_SKIPPED), Need("b", SUCCEEDED_OR_SKIPPED)),
     "(a.Succeeded || a.Skipped) && (b.Succeeded || b.Skipped)"),
    ((Need("a"), Need("b", SUCCEEDED_OR_SKIPPED)), "a.Succeeded && (b.Succeeded || b.Skipped)"),
    ((Need("a", SUCCEEDED_OR_FAILED),), "a.Succeeded || a.Failed"),
    ((Need("a"), Need("b", SUCCEEDED_OR_FAILED)), "a.Succeeded && (b.Succeeded || b.Failed)"),
    ((Need("a", ("Failed",)),), "a.Failed"),
    ((Need("a", ("Omitted", "Skipped")),), "(a.Omitted || a.Skipped)"),
]


@pytest.mark.parametrize("needs, expected", DEPENDS)
def test_rendered_depends(needs, expected):
    assert argo_depends(needs) == expected


@pytest.mark.parametrize("needs, expected", [d for d in DEPENDS if d[0]])
def test_local_evaluation_agrees_with_argo_for_every_upstream_phase(needs, expected):
    """Every combination of Succeeded/Failed/Errored/Skipped/Omitted upstream: met() == Argo on the string."""
    names = sorted({n.task for n in needs})
    for combo in itertools.product(("Succeeded", "Failed", "Errored", "Skipped", "Omitted"), repeat=len(names)):
        phases = dict(zip(names, combo))
        assert all(n.met(phases) for n in needs) is eval_depends(expected, phases), phases
    assert depends_tasks(expected) == names


@pytest.mark.parametrize("upstream, runs", [("Succeeded", True), ("Skipped", True), ("Failed", False),
                                             ("Omitted", False), ("Errored", False)])
def test_an_optional_predecessor(upstream, runs):
    assert Need("x", SUCCEEDED_OR_SKIPPED).met({"x": upstream}) is runs
    assert Need("x").met({"x": upstream}) is (upstream == "Succeeded")
    assert Need("x", SUCCEEDED_OR_FAILED).met({"x": upstream}) is (upstream in ("Succeeded", "Failed"))


@pytest.mark.parametrize("phases", [(), ("Succeeded", "Succeeded"), ("Passed",), ("Error",)])
def test_a_need_names_known_phases_once(phases):
    with pytest.raises(ValueError, match="phases"):
        Need("x", phases)


def test_a_dag_names_only_earlier_tasks():
    with pytest.raises(ValueError, match="not earlier tasks"):
        Dag("d", (Task("a", step="s", depends=(Need("b"),)), Task("b", step="s")))
    with pytest.raises(ValueError, match="not earlier tasks"):
        Dag("d", (Task("a", step="s", when=When.equals(refs.output("b", "x"), True)), Task("b", step="s")))
    with pytest.raises(ValueError, match="twice"):
        Dag("d", (Task("a", step="s"), Task("a", step="s")))


# ------------------------------------------------------------------ when

ENGINES = When.one_of(refs.parameter("engines"), "sglang", "both")
UNLOCK = When.equals(refs.output("perf", "unlock_c32_1k_1k"), True)
SUSPECT = When.equals(refs.output("suspect", "suspect"), "true")
VARIANT = When.equals(refs.input_param("engine"), "sglang")
PREWARM = When.equals(refs.parameter("prewarm"), True)
NOT_PREWARM = When.equals(refs.parameter("prewarm"), False)

WHEN = [
    (None, None),
    (ENGINES, "'{{workflow.parameters.engines}}' =~ '(^|,)(sglang|both)(,|$)'"),
    (UNLOCK, "{{tasks.perf.outputs.parameters.unlock_c32_1k_1k}} == true"),
    (SUSPECT, "'{{tasks.suspect.outputs.parameters.suspect}}' == 'true'"),
    (VARIANT, "'{{inputs.parameters.engine}}' == 'sglang'"),
    (PREWARM, "{{workflow.parameters.prewarm}} == true"),
    (NOT_PREWARM, "{{workflow.parameters.prewarm}} == false"),
]


@pytest.mark.parametrize("when, expected", WHEN)
def test_rendered_when(when, expected):
    assert argo_when(when) == expected
    check_when(expected)


VALUES = ["true", "false", "", "sglang", "vllm", "both", "sglang2", "x", "1", "True", "a b", "it's", "c2-128-32"]


@pytest.mark.parametrize("when", [w for w, _ in WHEN if w is not None], ids=str)
def test_local_when_agrees_with_argo_for_any_value(when):
    """holds(value) is what Argo's evaluation of the rendered string gives once the value is substituted;
    where Argo cannot evaluate it, neither can the local runner (the task fails on both)."""
    for value in VALUES:
        rendered = refs.substitute(argo_when(when), {when.subject: value})
        try:
            want: bool | None = eval_when(rendered)
        except ExpressionError:
            want = None
        try:
            got: bool | None = when.holds(value)
        except ConditionError:
            got = None
        assert got is want, (value, rendered)


def test_engine_selection():
    assert [ENGINES.holds(v) for v in ("sglang", "both", "vllm")] == [True, True, False]
    assert [SUSPECT.holds(v) for v in ("true", "false", "")] == [True, False, False]
    assert [UNLOCK.holds(v) for v in ("true", "false")] == [True, False]
    with pytest.raises(ConditionError):
        UNLOCK.holds("")


@pytest.mark.parametrize("make", [
    lambda: When.equals(refs.workflow("status"), "Failed"),     # known only once the run ended
    lambda: When.one_of(refs.parameter("engines")),             # one of nothing
    lambda: When.one_of(refs.parameter("engines"), "a.*"),      # a regex, not a word
    lambda: When.equals(refs.parameter("engines"), "it's"),      # cannot be quoted
    lambda: When(refs.parameter("engines"), "one-of", "sglang"),
])
def test_conditions_the_graph_cannot_state(make):
    with pytest.raises(ValueError):
        make()


# ------------------------------------------------------------------ refs


def test_refs_round_trip():
    for ref in (refs.parameter("run-dir"), refs.workflow("uid"), refs.input_param("engine"),
                refs.output("deploy", "endpoint")):
        assert refs.parse(ref.path) == ref and refs.find(f"x/{ref}/y") == [ref.path]
    assert str(refs.output("perf", "unlock_c4")) == "{{tasks.perf.outputs.parameters.unlock_c4}}"
    assert refs.parse("item") is None and refs.parse("tasks.a.outputs.result") is None
    assert refs.replace("a {{workflow.uid}} {{inputs.parameters.engine}}",
                        lambda r: "E" if r.kind == "input" else None) == "a {{workflow.uid}} E"
    with pytest.raises(ValueError):
        refs.Ref("output", "x")                                   # an output names its task


# ------------------------------------------------------------------ graphs per back end


def _names(graph) -> list[str]:
    return [t.name for t in graph.main.tasks]


def test_the_argo_graph_has_the_cluster_gates():
    argo = build_graph(load_profile("kimi-k3-h20"), "argo")
    names = _names(argo)
    assert names[:5] == ["params", "prewarm-0", "preflight-0", "prewarm-1", "preflight-1"]
    assert argo.main.task("prewarm-0").depends == (Need("params", SUCCEEDED),)
    assert {"nodes-0", "nodes-1", "network"} <= set(names)
    assert argo.main.task("prewarm-0").when == PREWARM
    assert argo.main.task("preflight-0").depends == (Need("prewarm-0", SUCCEEDED_OR_SKIPPED),)
    # no engine starts before Gate 1 passed, its own engine check passed and its image is on every pool node (a pull
    # Skipped: not this engine's run); the second engine after the first's sequence, whatever happened there
    assert argo.main.task("sglang").depends == (Need("network", SUCCEEDED), Need("engine-check-sglang", SUCCEEDED_OR_SKIPPED),
                                                Need("pull-sglang-0", SUCCEEDED_OR_SKIPPED),
                                                Need("pull-sglang-1", SUCCEEDED_OR_SKIPPED))
    assert argo.main.task("vllm").depends == (Need("network", SUCCEEDED), Need("engine-check-vllm", SUCCEEDED_OR_SKIPPED),
                                              Need("pull-vllm-0", SUCCEEDED_OR_SKIPPED),
                                              Need("pull-vllm-1", SUCCEEDED_OR_SKIPPED), Need("sglang", ANY_OUTCOME))
    assert argo.main.task("report").depends == (Need("params", SUCCEEDED), Need("regress", ANY_OUTCOME))


def test_the_local_graph_prepares_the_model_first():
    local = build_graph(load_profile("local-cpu"), "local")
    assert _names(local)[:3] == ["params", "prewarm", "preflight"]
    assert local.main.task("prewarm").when is None
    assert not {"network", "nodes-0", "preflight-compare"} & set(_names(local))


@pytest.mark.parametrize("profile, backend, msg", [
    ("local-cpu", "argo", "no Argo graph"),
    ("kimi-k3-h20", "local", "runs on the cluster"),        # its engines never start without Gate 1
])
def test_a_profile_runs_on_its_own_back_end(profile, backend, msg):
    with pytest.raises(UsageError, match=msg):
        build_graph(load_profile(profile), backend)
    with pytest.raises(ValueError, match="backend"):
        build_graph(load_profile(profile), "k8s")


@pytest.mark.parametrize("profile, backend", [("kimi-k3-h20", "argo"), ("h200-1gpu", "argo"),
                                              ("local-cpu", "local")])
def test_every_condition_of_every_graph_renders_to_valid_argo(profile, backend):
    g = build_graph(load_profile(profile), backend)
    for dag in g.dags:
        for t in dag.tasks:
            assert depends_tasks(argo_depends(t.depends)) == list(t.upstream)
            check_when(argo_when(t.when))
    assert set(PHASES) >= {p for dag in g.dags for t in dag.tasks for n in t.depends for p in n.phases}


# ------------------------------------------------------------------ Gate 6's order: never two engines' GPUs

def _walk(dag, engine: str) -> list[str]:
    """The tasks of one engine sequence that run, in order, when every step passes and unlocks nothing (each
    task's `when` and `depends` evaluated as both back ends do)."""
    phases: dict[str, str] = {}
    ran = []
    for t in dag.tasks:
        if not all(n.met(phases) for n in t.depends):
            phases[t.name] = "Omitted"
            continue
        value = engine if t.when and t.when.subject.kind == "input" else "false"
        if t.when is not None and not t.when.holds(value):
            phases[t.name] = "Skipped"
            continue
        phases[t.name] = "Succeeded"
        ran.append(t.name)
    return ran


@pytest.mark.parametrize("profile, backend, engine, variants", [
    ("kimi-k3-h20", "argo", "sglang", ["exp-prefix-cache", "exp-dspark", "exp-hicache", "exp-symm-mem"]),
    ("kimi-k3-h20", "argo", "vllm", ["exp-prefix-cache"]),
    ("local-cpu", "local", "vllm", ["exp-prefix-cache"]),
])
def test_the_baseline_is_released_before_any_variant_and_measured_before(profile, backend, engine, variants):
    seq = build_graph(load_profile(profile), backend).sequences[0]
    ran = _walk(seq, engine)
    assert [t for t in ran if t.startswith("exp-")] == variants
    first_variant = ran.index(variants[0])
    # the baseline runs its part of Gate 6 while up, before Gate 5 restarts it; it is released before a variant
    assert ran.index("perf") < ran.index("baseline-phases") < ran.index("longctx") < ran.index("release-baseline")
    # after the regression cases' confirm stage, the climb to the highest load meeting the SLO, then Gate 6's part
    assert ran.index("perf") < ran.index("climb") < ran.index("baseline-phases")
    assert seq.task("climb").depends == (Need("confirm", SUCCEEDED_OR_SKIPPED),)
    assert seq.task("climb").flag("--phase") == "climb"
    assert seq.task("baseline-phases").depends == (Need("climb", SUCCEEDED),)
    assert ran.index("release-baseline") == first_variant - 1 and ran[-1] == "teardown"
    release, final = seq.task("release-baseline"), seq.task("teardown")
    assert (release.step, release.args) == ("teardown", final.args[:len(release.args)]) and "--variant" not in release.args
    for v in variants:
        args = seq.task(v).args
        assert args[args.index("--variant") + 1] == v.removeprefix("exp-") and "--baseline-endpoint" not in args
    assert seq.task("baseline-phases").step == "experiment-baseline"


def test_an_engine_without_variants_keeps_its_baseline_until_teardown():
    seq = build_graph(load_profile("local-cpu"), "local").sequences[0]      # prefix-cache is for vllm only
    ran = _walk(seq, "llamacpp")
    assert not {"baseline-phases", "release-baseline"} & set(ran) and not [t for t in ran if t.startswith("exp-")]
    assert ran[0] == "deploy" and ran[-1] == "teardown"


def test_a_profile_without_experiments_has_no_gate6_tasks():
    import yaml

    from gauntlet.params.models import Profile
    from gauntlet.params import profile_path

    doc = yaml.safe_load(profile_path("local-cpu").read_text())
    doc["experiments"] = []
    seq = build_graph(Profile.model_validate(doc), "local").sequences[0]
    names = [t.name for t in seq.tasks]
    assert not {"baseline-phases", "release-baseline"} & set(names)
    assert seq.task("teardown").depends[0].task.startswith("longctx")


# ------------------------------------------------------------------ a failure stops only what depends on it

def _value(ref: refs.Ref, inputs: dict[str, str], engines: str) -> str:
    """What a `when` reads in a run where nothing unlocks, nothing is suspected and nothing is prewarmed."""
    if ref.kind == "input":
        return inputs[ref.name]
    return engines if ref == refs.parameter("engines") else "false"


def simulate(profile: str, forced: dict[str, str], engines: str = "both") -> tuple[dict[str, str], str]:
    """(task path -> phase, the workflow's phase) when each task of ``forced`` ends so and every other that
    runs passes, ``depends`` and ``when`` evaluated as both back ends do, a DAG judged as Argo judges it
    (workflows/phase.py). A step given ``--upstream`` judges it as the real step does (shared_options)."""
    from gauntlet.steps.gates.shared_options import upstream_check, upstream_phases
    from gauntlet.workflows.phase import dag_phase

    p = load_profile(profile)
    g = build_graph(p, "argo" if p.hardware.kind == "kubernetes" else "local")
    phases: dict[str, str] = {}

    def walk(dag, prefix: str, inputs: dict[str, str]) -> str:
        mine: dict[str, str] = {}
        for t in dag.tasks:
            if not all(n.met(mine) for n in t.depends):
                ph = "Omitted"
            elif t.when is not None and not t.when.holds(_value(t.when.subject, inputs, engines)):
                ph = "Skipped"
            elif t.dag:
                ph = walk(g.dag(t.dag), f"{t.name}/", dict(t.inputs))
            elif prefix + t.name in forced:
                ph = forced[prefix + t.name]
            else:
                up = list(t.args[t.args.index("--upstream") + 1:]) if "--upstream" in t.args else []
                filled = tuple(refs.substitute(a, lambda r: mine.get(r.task)) for a in up)
                ph = "Failed" if upstream_check(upstream_phases(filled), "simulated") else "Succeeded"
            mine[t.name] = phases[prefix + t.name] = ph
        return dag_phase({t.name: t.upstream for t in dag.tasks}, mine)

    return phases, walk(g.main, "", {})


def test_all_pass_passes_and_reports():
    phases, wf = simulate("kimi-k3-h20", {})
    assert wf == "Succeeded" and phases["report"] == phases["sglang/teardown"] == phases["vllm/teardown"] == "Succeeded"
    assert [t for t, ph in phases.items() if ph in ("Failed", "Omitted")] == []


@pytest.mark.parametrize("failed, stopped, ran", [
    ("engine-check-vllm", "vllm", "sglang"),       # Gate 0 of one engine stops that engine only
    ("engine-check-sglang", "sglang", "vllm"),
])
def test_an_engine_check_failure_stops_only_that_engines_sequence(failed, stopped, ran):
    """Before: Gate 1 and both sequences needed every engine check to pass, so one engine's image that did not
    know a flag omitted the other engine, regress and report: no report.md at all."""
    phases, wf = simulate("kimi-k3-h20", {failed: "Failed"})
    assert (phases["nodes-0"], phases["network"]) == ("Succeeded", "Succeeded")     # Gate 1 runs once, for both
    assert phases[stopped] == "Omitted" and phases[ran] == "Succeeded" and phases[f"{ran}/teardown"] == "Succeeded"
    assert (phases["regress"], phases["report"], wf) == ("Failed", "Failed", "Failed")


@pytest.mark.parametrize("failed", ["vllm/deploy", "vllm/smoke", "sglang/deploy", "sglang/longctx"])
def test_a_failed_sequence_releases_its_engine_and_still_reports(failed):
    """Before: regress needed the last sequence Succeeded or Skipped and report needed regress: the likeliest
    first run (vLLM blocked at start-up) wrote no report. Now the failed sequence's teardown runs (the engine's
    GPUs back), the other engine's sequence runs after it, regress and report run, and the report (the leaf)
    fails, so the workflow does."""
    phases, wf = simulate("kimi-k3-h20", {failed: "Failed"})
    engine = failed.split("/")[0]
    other = {"sglang": "vllm", "vllm": "sglang"}[engine]
    assert phases[f"{engine}/teardown"] == "Failed" and phases[engine] == "Failed"
    assert phases[other] == "Succeeded"
    assert (phases["regress"], phases["report"], wf) == ("Failed", "Failed", "Failed")


def test_a_failed_variant_stops_neither_the_next_variant_nor_the_report():
    phases, wf = simulate("kimi-k3-h20", {"sglang/exp-dspark": "Failed"})
    assert phases["sglang/exp-prefix-cache"] == phases["sglang/exp-hicache"] == phases["sglang/exp-symm-mem"] \
        == "Succeeded"
    assert (phases["sglang/teardown"], phases["sglang"], phases["vllm"]) == ("Failed", "Failed", "Succeeded")
    assert (phases["report"], wf) == ("Failed", "Failed")


def test_a_failure_before_the_variants_still_stops_them():
    """A variant needs the baseline released (release-baseline Succeeded): after a failed Gate 5 none deploys."""
    phases, _ = simulate("kimi-k3-h20", {"sglang/longctx": "Failed"})
    assert {phases[f"sglang/{t}"] for t in ("release-baseline", "exp-prefix-cache", "exp-dspark", "exp-hicache",
                                            "exp-symm-mem")} == {
        "Omitted"}


def test_invalid_parameters_run_nothing_not_even_the_report():
    phases, wf = simulate("kimi-k3-h20", {"params": "Failed"})
    assert wf == "Failed" and {ph for t, ph in phases.items() if t != "params"} == {"Omitted"}


def test_the_local_graph_follows_the_same_rules():
    phases, wf = simulate("local-cpu", {"engine-check-llamacpp": "Failed", "vllm/exp-prefix-cache": "Failed"})
    assert (phases["llamacpp"], phases["vllm/teardown"], phases["vllm"]) == ("Omitted", "Failed", "Failed")
    assert (phases["regress"], phases["report"], wf) == ("Failed", "Failed", "Failed")


@pytest.mark.parametrize("profile", ["kimi-k3-h20", "h200-1gpu", "local-cpu"])
def test_what_runs_after_a_failure_reads_the_phase_of_every_task_before_it(profile):
    """teardown, regress and report get ``--upstream TASK={{tasks.TASK.status}}`` for every earlier task of their
    DAG, each an ancestor (Argo resolves tasks.X.status only for those: dag.go buildLocalScopeFromTask)."""
    p = load_profile(profile)
    g = build_graph(p, "argo" if p.hardware.kind == "kubernetes" else "local")
    for dag, name in [(g.sequences[0], "teardown"), (g.main, "regress"), (g.main, "report")]:
        t = dag.task(name)
        before = [x.name for x in dag.tasks[:dag.tasks.index(t)]]
        up = list(t.args[t.args.index("--upstream") + 1:])
        assert up == [f"{n}={refs.status(n)}" for n in before]
        deps = {x.name: set(x.upstream) for x in dag.tasks}
        ancestors, todo = set(), list(deps[name])
        while todo:
            a = todo.pop()
            if a not in ancestors:
                ancestors.add(a)
                todo += deps[a]
        assert set(before) == ancestors, set(before) ^ ancestors


def test_a_status_read_names_an_earlier_task():
    with pytest.raises(ValueError, match="not earlier tasks"):
        Dag("d", (Task("a", step="s", args=("--upstream", f"b={refs.status('b')}")), Task("b", step="s")))
    assert refs.parse("tasks.perf.status") == refs.status("perf") and str(refs.status("perf")) == "{{tasks.perf.status}}"
