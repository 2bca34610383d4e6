"""The import boundaries of the one `gauntlet.*` namespace (docs/architecture.md), read from the source's AST.

Layers, lowest first: ``gauntlet.contract`` (checks, verdicts, exit codes, errors) ← ``gauntlet.params``
(profiles) ← ``gauntlet.steps`` (the gates) ← ``gauntlet.workflows`` (the graph, the two back ends, the CLI).
A module imports only from layers below its own, a back end reaches a gate only through the gates' public
modules (no ``_private`` one), and nothing imports the repository's folders by their bare names.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LAYERS = {"contract": 0, "params": 1, "steps": 2, "workflows": 3}
BARE = ("contract", "params", "steps", "workflows")


def imports(path: Path, text: str | None = None) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``path``, including function-level and importlib ones."""
    tree = ast.parse(path.read_text() if text is None else text, filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(node.lineno, node.module)] + [(node.lineno, f"{node.module}.{a.name}") for a in node.names
                                                     if node.module.startswith("gauntlet.")]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("gauntlet.") \
                and " " not in node.value:
            found.append((node.lineno, node.value))        # importlib.import_module("gauntlet.steps.x"), -m
    return found


def sources(*folders: str) -> list[Path]:
    return sorted(p for f in folders for p in (REPO / f).rglob("*.py"))


def layer_violations(path: Path, text: str | None = None) -> list[str]:
    own = path.relative_to(REPO).parts[0]
    bad = []
    for line, mod in imports(path, text):
        parts = mod.split(".")
        if parts[0] != "gauntlet" or len(parts) < 2 or parts[1] not in LAYERS:
            continue
        where = f"{path.relative_to(REPO)}:{line} imports {mod}"
        if LAYERS[parts[1]] > LAYERS[own]:
            bad.append(f"{where} (a {own} module may not import the {parts[1]} layer above it)")
        elif parts[1] == "steps" and own == "workflows" and any(p.startswith("_") for p in parts[2:]):
            bad.append(f"{where} (a back end uses the gates' public modules only)")
    return bad


@pytest.mark.parametrize("path", sources(*LAYERS), ids=lambda p: str(p.relative_to(REPO)))
def test_no_import_against_the_layers(path):
    assert layer_violations(path) == []


@pytest.mark.parametrize("path", sources(*LAYERS, "tests", "benchmarks"), ids=lambda p: str(p.relative_to(REPO)))
def test_no_bare_top_level_import(path):
    bare = [f"{line}: {mod}" for line, mod in imports(path) if mod.split(".")[0] in BARE]
    assert bare == [], f"{path.relative_to(REPO)} imports the repository's folders by bare name: use gauntlet.*"


def test_the_check_catches_a_gate_importing_the_graph():
    """The rule itself: a gate that imports the graph, and a back end that reaches a private gate module, fail."""
    gate = layer_violations(REPO / "steps" / "probe.py", "from gauntlet.workflows.graph import param_name\n")
    back = layer_violations(REPO / "workflows" / "probe.py",
                            "def f():\n    from gauntlet.steps.gates._sequence import run_variants\n")
    params = layer_violations(REPO / "params" / "probe.py", "import importlib\nimportlib.import_module('gauntlet.steps.x')\n")
    assert "may not import the workflows layer" in " ".join(gate)
    assert "public modules only" in " ".join(back)
    assert "may not import the steps layer" in " ".join(params)


# ------------------------------------------------------------------ module graph: no loops, `_` is private

PACKAGES = {"contract": "gauntlet.contract", "params": "gauntlet.params", "steps": "gauntlet.steps",
            "workflows": "gauntlet.workflows"}


def module_name(path: Path) -> str:
    rel = path.relative_to(REPO)
    parts = [PACKAGES[rel.parts[0]].split(".")[1], *rel.parts[1:]]
    parts[-1] = parts[-1].removesuffix(".py")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["gauntlet", *parts])


def module_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (function-level and importlib ones included)."""
    files = {module_name(p): p for p in sources(*LAYERS)}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                # `from a.b import c`: an edge to the module a.b.c when c is one, else to a.b
                names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files else node.module
                         for a in node.names]
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in \
                    ("import_module", "find_spec"):
                names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            elif isinstance(node, ast.Dict):        # a registry: name -> module, imported on demand
                names = [v.value for v in node.values if isinstance(v, ast.Constant) and v.value in files]
            for name in names:
                while name and name not in files:
                    name = name.rpartition(".")[0]
                if name and name != mod:
                    deps.add(name)
        graph[mod] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_loop_between_modules():
    found = cycles(module_graph())
    assert found == [], "import loops (each a set of modules that import each other):\n" + \
        "\n".join(" <-> ".join(c) for c in found)


def test_the_loop_check_catches_a_loop():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def private_violations(path: Path, text: str | None = None) -> list[str]:
    """Imports of a `_private` module or name from outside the package that holds it.

    ``gauntlet.a.b._m`` is private to ``gauntlet.a.b``; a name ``_f`` of ``gauntlet.a.b.m`` is private to
    ``gauntlet.a.b`` too. Tests and benchmarks are outside every package."""
    try:
        own = module_name(path)
        own_pkg = own if path.name == "__init__.py" else own.rpartition(".")[0]
    except (KeyError, ValueError):
        own_pkg = ""
    bad = []
    tree = ast.parse(path.read_text() if text is None else text, filename=str(path))
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("gauntlet.") \
                and " " not in node.value and "/" not in node.value:
            names = [node.value]
        for name in names:
            parts = name.split(".")
            if parts[0] != "gauntlet":
                continue
            for i, part in enumerate(parts):
                if part.startswith("_") and not part.startswith("__"):
                    holder = ".".join(parts[:i])
                    if not (own_pkg == holder or own_pkg.startswith(holder + ".")):
                        bad.append(f"{path.relative_to(REPO)}:{node.lineno} imports {name} "
                                   f"(private to {holder})")
                    break
    return bad


@pytest.mark.parametrize("path", sources(*LAYERS, "tests", "benchmarks"), ids=lambda p: str(p.relative_to(REPO)))
def test_private_modules_and_names_stay_in_their_package(path):
    assert private_violations(path) == []


def test_the_private_check_catches_an_outside_import():
    outside = private_violations(REPO / "workflows" / "probe.py",
                                 "from gauntlet.steps.gates._sequence import x\n")
    inside = private_violations(REPO / "steps" / "gates" / "probe.py",
                                "from gauntlet.steps.gates._sequence import x\n")
    name = private_violations(REPO / "tests" / "probe.py", "from gauntlet.steps.runner import _helper\n")
    assert outside and not inside and name
