"""The back ends' registry and protocols: each registered back end does every method of every protocol it
claims (and claims no protocol it does not do), none of those methods is a stand-in that does nothing, the
implementations are reached only through the registry, and they never import a gate."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gauntlet.contract import UsageError
from gauntlet.steps.backends import BACKENDS, MODULES, backend_for, capability, require
from gauntlet.steps.backends.protocol import PROTOCOLS, Access, ClusterInspector, EngineHost, ProbeLauncher, Releaser, \
    RunnerGuard
from gauntlet.steps.gates import cleanup, deploy, experiment, janitor, network, teardown

REPO = Path(__file__).resolve().parent.parent
EVERY = (EngineHost, Releaser, ProbeLauncher)


def members(proto: type) -> list[str]:
    """The methods and properties a Protocol names (not the ones every class has)."""
    return sorted(n for n, v in vars(proto).items()
                  if not n.startswith("_") and (inspect.isfunction(v) or isinstance(v, property)))


def stand_in(fn: ast.FunctionDef) -> str | None:
    """Why ``fn``'s body does nothing (only a docstring, ``pass``, ``...`` or a constant/empty return), or None."""
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                                       and isinstance(s.value.value, str))]
    if not body:
        return "only a docstring"
    if len(body) != 1:
        return None
    s = body[0]
    if isinstance(s, ast.Pass) or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)):
        return "pass / ..."
    if isinstance(s, ast.Return) and (s.value is None or isinstance(s.value, ast.Constant)
                                      or (isinstance(s.value, ast.List | ast.Dict | ast.Tuple | ast.Set)
                                          and not getattr(s.value, "elts", getattr(s.value, "keys", [1])))):
        return f"return {ast.unparse(s.value) if s.value is not None else 'None'}"
    return None


@pytest.mark.parametrize("name", sorted(MODULES))
def test_each_back_end_does_every_method_it_claims(name):
    backend = BACKENDS[name]
    assert backend.name == name
    assert set(EVERY) <= set(backend.claims), f"{name}: every back end is an EngineHost, Releaser, ProbeLauncher"
    assert set(backend.claims) <= set(PROTOCOLS)
    cls = type(backend)
    for proto in PROTOCOLS:
        own = [m for m in members(proto) if hasattr(cls, m)]
        if proto in backend.claims:
            assert own == members(proto), f"{name} claims {proto.__name__} but lacks {set(members(proto)) - set(own)}"
            for m in members(proto):
                want, got = getattr(proto, m), getattr(cls, m)
                if isinstance(want, property):
                    assert isinstance(got, property), (name, m)
                    continue
                assert list(inspect.signature(got).parameters) == list(inspect.signature(want).parameters), (name, m)
        else:
            # what it does not do, it does not pretend to: no method of that protocol at all
            assert own == [], f"{name} does not claim {proto.__name__} but has {own}"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_method_is_a_stand_in(name):
    cls = type(BACKENDS[name])
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    fns = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    assert fns
    bad = [f"{f.name}: {why}" for f in fns if (why := stand_in(f))]
    assert bad == [], f"{name}: methods that do nothing: {bad}"


def test_the_stand_in_check_catches_one():
    src = ("class B:\n    def a(self):\n        pass\n    def b(self):\n        return []\n"
           "    def c(self):\n        '''doc'''\n        return None\n    def d(self):\n        return f(self)\n")
    fns = {n.name: stand_in(n) for n in ast.walk(ast.parse(src)) if isinstance(n, ast.FunctionDef)}
    assert fns == {"a": "pass / ...", "b": "return []", "c": "return None", "d": None}


def test_capability_asks_the_claims():
    local, k8s = BACKENDS["local"], BACKENDS["kubernetes"]
    assert capability(local, RunnerGuard) is local and capability(k8s, RunnerGuard) is None
    assert capability(k8s, ClusterInspector) is k8s and capability(local, ClusterInspector) is None
    with pytest.raises(UsageError, match="nodes: the local back end does not do ClusterInspector.*kubernetes"):
        require(local, ClusterInspector, "nodes")
    assert require(k8s, Access, "render") is k8s
    with pytest.raises(UsageError, match="expected one of kubernetes, local"):
        backend_for(None, "slurm")


def test_choosing_a_back_end_imports_no_implementation():
    code = ("import sys\nfrom gauntlet.steps.backends import BACKENDS, backend_for\n"
            "from gauntlet.steps.gates import deploy, network, cleanup, janitor, nodes, teardown\n"
            "assert sorted(BACKENDS) == ['kubernetes', 'local']\n"
            "loaded = [m for m in sys.modules if m.startswith(('gauntlet.steps.backends.local',"
            " 'gauntlet.steps.backends.kubernetes'))]\n"
            "assert loaded == [], loaded\n"
            "backend_for(None, 'local')\n"
            "assert 'gauntlet.steps.backends.local.backend' in sys.modules\n"
            "assert 'gauntlet.steps.backends.kubernetes.backend' not in sys.modules\n"
            "assert 'gauntlet.steps.backends.local.deploy' not in sys.modules\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def imported(path: Path) -> list[str]:
    """Every ``gauntlet.*`` module ``path`` imports, function-level and TYPE_CHECKING ones included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return [m for m in out if m.startswith("gauntlet.")]


@pytest.mark.parametrize("path", sorted((REPO / "steps" / "gates").glob("*.py")), ids=lambda p: p.name)
def test_no_gate_reaches_an_implementation(path):
    direct = [m for m in imported(path) if m.startswith(("gauntlet.steps.backends.local",
                                                         "gauntlet.steps.backends.kubernetes"))]
    assert direct == [], f"{path.name} bypasses the registry: {direct}"


@pytest.mark.parametrize("path", sorted((REPO / "steps" / "backends").rglob("*.py")),
                         ids=lambda p: str(p.relative_to(REPO)))
def test_back_ends_never_import_a_gate(path):
    up = [m for m in imported(path) if m.startswith(("gauntlet.steps.gates", "gauntlet.workflows"))]
    assert up == [], f"{path.relative_to(REPO)} imports {up}: gates depend on back ends, never the reverse"
    if path.parent.name in ("local", "kubernetes"):
        # an implementation reaches its protocols, never the registry that imports it
        assert "gauntlet.steps.backends.BACKENDS" not in imported(path)
        assert not [m for m in imported(path) if m in ("gauntlet.steps.backends.backend_for",
                                                       "gauntlet.steps.backends.capability")]


@pytest.mark.parametrize("gate", [cleanup, deploy, experiment, janitor, network, teardown], ids=lambda m: m.NAME)
def test_one_backend_flag(gate):
    """Every gate that takes an override spells it ``--backend``, the registry's names, sorted."""
    import dataclasses
    f = {x.name: x for x in dataclasses.fields(gate.Options)}
    assert "backend" in f and not {"launcher", "local"} & set(f), gate.NAME
    assert f["backend"].metadata["gauntlet.option"]["choices"] == tuple(sorted(BACKENDS)) == ("kubernetes", "local")


def test_the_cli_janitor_takes_backend(tmp_path):
    from gauntlet.workflows.cli import build_parser
    args = build_parser(["janitor"]).parse_args(["janitor", "--backend", "local", "--runs-dir", str(tmp_path)])
    assert args.backend == "local" and args.runs_dir == str(tmp_path)
    with pytest.raises(SystemExit):
        build_parser(["janitor"]).parse_args(["janitor", "--local"])
