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
                            "def f():\n    from gauntlet.steps._deploy_local import stop_all\n")
    params = layer_violations(REPO / "params" / "probe.py", "import importlib\nimportlib.import_module('gauntlet.steps.x')\n")
    assert "may not import the workflows layer" in " ".join(gate)
    assert "public modules only" in " ".join(back)
    assert "may not import the steps layer" in " ".join(params)
