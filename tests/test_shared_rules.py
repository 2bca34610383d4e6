"""One owner for each rule the back ends and the gates share; each test fails if a second owner comes back.

- output defaults: :func:`gauntlet.workflows.graph.output_default`, read by the renderer and the local runner;
- the run directory's layout: :class:`gauntlet.contract.layout.RunLayout` (``<run>/<task>``,
  ``<run>/<engine>/<task>``, ``verdict.json``, ``outputs/<name>``), the same directories on both back ends;
- the run label: ``gauntlet.steps.backends.kubernetes.RUN_LABEL``;
- reading a verdict: :meth:`gauntlet.contract.Verdict.read` (and :class:`~gauntlet.contract.CorruptVerdict`).

The scans read the source's AST (docstrings excluded: prose may name a file).
"""

from __future__ import annotations

import ast
import io
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import pytest

from gauntlet.contract import CORRUPT_KINDS, CorruptVerdict, Verdict
from gauntlet.contract.layout import (CLEANUP_TASK, VERDICT_FILE, RunLayout, output_path, preflight_task,
                                      verdict_path)
from gauntlet.params import list_profiles, load_profile
from gauntlet.workflows.graph import ENGINE_SEQUENCE, Graph, build_graph, dag_engine, output_default
from gauntlet.workflows.local import Runner

REPO = Path(__file__).resolve().parent.parent
CODE = ("contract", "params", "steps", "workflows")
FAKES = Path(__file__).parent / "fakes"
ARGO_RUN = "/runs/{{workflow.uid}}"


def sources(*folders: str) -> list[Path]:
    return sorted(p for f in folders for p in (REPO / f).rglob("*.py"))


def rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _docstrings(tree: ast.Module) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def strings(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of every string constant of the module that is not a docstring (f-strings' parts included)."""
    tree = _tree(path)
    docs = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.lineno, node.value


def profiles() -> list[str]:
    return list_profiles()


# ------------------------------------------------------------------ output defaults

def test_output_default_rule_is_spelt_once():
    """Only the graph says what an unwritten ``unlock_*`` output reads as."""
    found = []
    for path in sources(*CODE):
        for node in ast.walk(_tree(path)):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "startswith"
                    and any(isinstance(a, ast.Constant) and a.value == "unlock" for a in node.args)):
                found.append(f"{rel(path)}:{node.lineno}")
    assert found and all(f.startswith("workflows/graph.py:") for f in found), found


@pytest.mark.parametrize("name", [p for p in profiles() if load_profile(p).hardware.kind == "kubernetes"])
def test_rendered_output_defaults_are_the_graphs(name):
    from gauntlet.workflows.render import render_documents
    docs = render_documents(load_profile(name))
    seen = 0
    for doc in docs.values():
        for d in doc if isinstance(doc, list) else [doc]:
            for tmpl in (d.get("spec", {}).get("templates") or d.get("spec", {}).get("workflowSpec", {}).get("templates")
                         or []):
                for p in (tmpl.get("outputs") or {}).get("parameters") or []:
                    assert p["valueFrom"].get("default", "") == output_default(p["name"]), (tmpl["name"], p)
                    seen += 1
    assert seen > 10


def test_output_default_values():
    assert (output_default("verdict"), output_default("unlock_all_lower"), output_default("endpoint")) == \
        ("error", "false", "")


# ------------------------------------------------------------------ the run label

def test_run_label_has_one_definition():
    from gauntlet.steps.backends import kubernetes
    from gauntlet.steps.backends.kubernetes import rbac
    from gauntlet.workflows import render
    owner = "steps/backends/kubernetes/__init__.py"
    spelt = [f"{rel(p)}:{line}" for p in sources(*CODE) for line, s in strings(p) if s == kubernetes.RUN_LABEL]
    assert [s.split(":")[0] for s in spelt] == [owner], spelt
    assert render.RUN_LABEL is kubernetes.RUN_LABEL and rbac.RUN_LABEL_KEY is kubernetes.RUN_LABEL


# ------------------------------------------------------------------ verdicts: one reader

VERDICT_PATH = re.compile(rf"(^|[/*]){re.escape(VERDICT_FILE)}")


def test_no_verdict_path_spelt_outside_the_contract():
    """No ``"verdict.json"`` joined onto a path, globbed or formatted into one outside gauntlet.contract."""
    bad = [f"{rel(p)}:{line}: {s!r}" for p in sources("params", "steps", "workflows") for line, s in strings(p)
           if VERDICT_PATH.search(s)]
    assert bad == []


def test_no_hand_read_verdict():
    """No json.load(s) of anything that names a verdict, outside the contract's reader."""
    bad = []
    for path in sources("params", "steps", "workflows"):
        text = path.read_text()
        for node in ast.walk(_tree(path)):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("load", "loads")
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "json"
                    and "verdict" in (ast.get_source_segment(text, node) or "").lower()):
                bad.append(f"{rel(path)}:{node.lineno}")
    assert bad == []


def test_scans_catch_a_second_owner(tmp_path):
    """The scans themselves: a hand-read verdict, a spelt label and a sibling path are found."""
    probe = tmp_path / "probe.py"
    probe.write_text('import json\n'
                     'def f(out):\n'
                     '    """verdict.json in prose is fine"""\n'
                     '    doc = json.loads((out / "verdict.json").read_text())\n'
                     '    label = "gauntlet.dev/run"\n'
                     '    return out.resolve().parent / "perf", "../perf", doc, label\n')
    texts = [s for _, s in strings(probe)]
    assert [s for s in texts if VERDICT_PATH.search(s)] == ["verdict.json"]
    assert "gauntlet.dev/run" in texts and "../perf" in texts
    assert len(_sibling_joins(probe)) == 1


def test_corrupt_verdict_says_what_kind():
    assert CORRUPT_KINDS == ("missing", "unreadable", "not-json", "not-a-verdict")
    with pytest.raises(ValueError, match="kind"):
        CorruptVerdict("x", "why", "other")


@pytest.mark.parametrize("text,kind", [(None, "missing"), ("{", "not-json"), ("", "not-json"),
                                       (b"\xff", "not-json"), ("[]", "not-a-verdict"),
                                       ('{"gate": "g"}', "not-a-verdict")])
def test_the_reader_names_the_kind(tmp_path, text, kind):
    if text is not None:
        f = tmp_path / VERDICT_FILE
        f.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(CorruptVerdict) as exc:
        Verdict.read(tmp_path)
    assert exc.value.kind == kind and exc.value.path == tmp_path / VERDICT_FILE


# ------------------------------------------------------------------ the run directory's layout

def _sibling_joins(path: Path) -> list[str]:
    """``<out>.parent / x``-like joins: a path spelt from a task's --out to another task's directory."""
    bad = []
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            left = node.left
            ups = [n for n in ast.walk(left) if isinstance(n, ast.Attribute) and n.attr in ("parent", "parents")]
            outs = [n for n in ast.walk(left) if isinstance(n, ast.Name) and n.id == "out"]
            if ups and outs:
                bad.append(f"{rel(path) if path.is_relative_to(REPO) else path.name}:{node.lineno}")
    return bad


def test_no_parent_relative_paths_in_gates_and_back_ends():
    dots = [f"{rel(p)}:{line}: {s!r}" for p in sources("steps", "workflows") for line, s in strings(p) if "../" in s]
    joins = [j for p in sources("steps", "workflows") for j in _sibling_joins(p)]
    assert dots == [] and joins == []


def test_layout_paths():
    run = RunLayout(Path("/r"))
    assert run.task_dir("params") == Path("/r/params") and run.task_dir("perf", "vllm") == Path("/r/vllm/perf")
    assert run.task_path("perf", "vllm") == "vllm/perf" and run.cleanup_dir() == Path("/r") / CLEANUP_TASK
    assert verdict_path(Path("/r/x")) == Path("/r/x/verdict.json")
    assert output_path(Path("/r/x"), "endpoint") == Path("/r/x/outputs/endpoint")
    argo = RunLayout(PurePosixPath(ARGO_RUN))
    assert str(argo.task_dir("deploy", "{{inputs.parameters.engine}}")) == \
        "/runs/{{workflow.uid}}/{{inputs.parameters.engine}}/deploy"
    for bad in ("", "..", "a/b", "../perf"):
        with pytest.raises(ValueError, match="not one path segment"):
            run.task_dir(bad)
        with pytest.raises(ValueError, match="not one path segment"):
            run.task_dir("perf", bad)


def test_layout_finds_a_tasks_run_from_its_directory(tmp_path):
    run = RunLayout(tmp_path)
    seq_task, main_task = Path(run.task_dir("perf", "vllm")), Path(run.task_dir("regress"))
    assert RunLayout.of_task(seq_task, in_sequence=True).root == tmp_path.resolve()
    assert RunLayout.of_task(main_task, in_sequence=False).root == tmp_path.resolve()
    assert RunLayout.sibling(seq_task, "baseline-phases") == (tmp_path / "vllm" / "baseline-phases").resolve()
    assert RunLayout.dag_dir(seq_task) == (tmp_path / "vllm").resolve()


def test_layout_reads_the_run(tmp_path):
    run = RunLayout(tmp_path)
    for task, engine in (("preflight-0", None), ("preflight-1", None), ("preflight-compare", None),
                         ("deploy", "vllm"), ("perf", "vllm"), ("perf-long", "vllm"), ("perfx", "vllm")):
        d = Path(run.task_dir(task, engine))
        d.mkdir(parents=True)
        Verdict.of(task, "t", []).write(d)
    (tmp_path / "vllm" / "exp-a" / "deploy").mkdir(parents=True)
    Verdict.of("deploy", "t", []).write(tmp_path / "vllm" / "exp-a" / "deploy")
    assert [d.name for d in run.preflight_dirs()] == ["preflight-0", "preflight-1"]
    assert [run.relative(f) for f in run.verdict_files("deploy")] == ["vllm/deploy", "vllm/exp-a/deploy"]
    assert len(run.verdict_files()) == 8
    assert [d.name for d in RunLayout.with_continuations(tmp_path / "vllm" / "perf")] == ["perf", "perf-long"]
    assert not run.released()
    Verdict.of("cleanup", "t", []).write(Path(run.cleanup_dir()))
    assert run.released()


def _step_tasks(graph: Graph) -> list[tuple[str, str | None]]:
    """(task, engine) of every step task of the graph, each engine sequence once per engine it is called with."""
    out = [(t.name, None) for t in graph.main.tasks if t.step] + [(graph.exit_handler.name, None)]
    for call in (t for t in graph.main.tasks if t.dag):
        sub = graph.dag(call.dag)
        out += [(t.name, dag_engine(sub.name, call.inputs)) for t in sub.tasks if t.step]
    return out


def _graph(name: str) -> Graph:
    p = load_profile(name)
    return build_graph(p, "argo" if p.hardware.kind == "kubernetes" else "local")


@pytest.mark.parametrize("name", profiles())
def test_graph_tasks_map_to_the_layouts_special_dirs(name, tmp_path):
    """The exit handler is the layout's cleanup task, every preflight task one of its preflight dirs (and no
    other task is), every gated perf/longctx task (its when reads the base task's unlock output) a
    continuation of its base task, and no other task is."""
    graph = _graph(name)
    run = RunLayout(tmp_path)
    assert graph.exit_handler.name == CLEANUP_TASK
    for task, engine in _step_tasks(graph):
        Path(run.task_dir(task, engine)).mkdir(parents=True, exist_ok=True)
    pre = [t.name for t in graph.main.tasks if t.step == "preflight"]
    assert [d.name for d in run.preflight_dirs()] == sorted(pre) and pre
    assert pre in ([preflight_task()], [preflight_task(i) for i in range(len(pre))])
    seq = graph.dag(ENGINE_SEQUENCE)
    engine = next(c.inputs["engine"] for c in graph.main.tasks if c.dag)
    for base in ("perf", "longctx"):
        gated = sorted(t.name for t in seq.tasks if t.when is not None and t.when.subject.kind == "output"
                       and t.when.subject.task == base)
        got = RunLayout.with_continuations(Path(run.task_dir(base, engine)))
        assert [d.name for d in got] == [base, *gated]


def _walk_locally(graph: Graph, run_dir: Path) -> dict[str, str | None]:
    """The local runner's task path -> its --out (None: skipped by its when), walking every task of ``graph``
    with a fake step."""
    params = {k: v[0] for k, v in graph.parameters.items()}
    params.update({"run-dir": str(run_dir), "prewarm": "true"})
    if "both" in (graph.parameters["engines"][1] or ()):
        params["engines"] = "both"
    outputs = sorted({o for d in graph.dags for t in d.tasks for o in t.outputs})
    runner = Runner(graph, REPO / "params" / "profiles" / f"{graph.profile}.yaml", run_dir, params,
                    python=sys.executable, cli="layout_cli",
                    steps={t.step: "gauntlet.steps.gates.cleanup" for d in graph.dags for t in d.tasks if t.step}
                    | {"cleanup": "gauntlet.steps.gates.cleanup"},
                    stream=io.StringIO(), cwd=REPO,
                    env={"PYTHONPATH": os.pathsep.join([str(FAKES), str(REPO)]), "FAKE_OUTPUTS": ",".join(outputs)})
    runner.run()
    assert all(r.phase in ("Succeeded", "Skipped") for r in runner.results), [(r.path, r.reason) for r in runner.results]
    return {r.path: r.out for r in runner.results if r.step}


@pytest.mark.parametrize("name", profiles())
def test_every_task_writes_where_the_layout_says_on_both_back_ends(name, tmp_path):
    graph = _graph(name)
    run_dir = tmp_path / "r1"
    run_dir.mkdir()
    local = _walk_locally(graph, run_dir)
    want = {RunLayout(run_dir).task_path(t, e): str(RunLayout(run_dir).task_dir(t, e)) for t, e in _step_tasks(graph)}
    assert set(local) == set(want)
    assert {p: out for p, out in local.items() if out is not None} == {p: want[p] for p, o in local.items() if o}
    assert sum(o is not None for o in local.values()) > len(want) * 3 // 4
    for f in RunLayout(run_dir).verdict_files():
        assert RunLayout(run_dir).relative(f) in want
    if load_profile(name).hardware.kind != "kubernetes":
        return
    from gauntlet.workflows.render import render_documents, template_name
    prof = load_profile(name)
    spec = render_documents(prof)[f"{template_name(prof)}.workflowtemplate.yaml"]["spec"]
    rendered: dict[str, str] = {}
    for tmpl in spec["templates"]:
        args = (tmpl.get("container") or {}).get("args") or []
        if "--out" in args:
            rendered[tmpl["name"]] = args[args.index("--out") + 1]
    argo = RunLayout(PurePosixPath(ARGO_RUN))
    engines = [c.inputs["engine"] for c in graph.main.tasks if c.dag]
    for path in want:
        engine, _, task = path.rpartition("/")
        tmpl = f"seq-{task}" if engine else task
        text = rendered[tmpl]
        if engine:
            assert engine in engines
            text = text.replace("{{inputs.parameters.engine}}", engine)
        assert text == str(argo.root / path), (path, rendered[tmpl])
    pre = next(t for t in graph.main.tasks if t.name == "preflight-compare")
    assert list(pre.args[1:]) == [str(RunLayout(PurePosixPath("{{workflow.parameters.run-dir}}")).task_dir(p))
                                  for p in (t.name for t in graph.main.tasks if t.step == "preflight")]
