"""The distribution installs one namespace, ``gauntlet.*``, with its data, and runs outside the checkout.

Builds the real wheel (setuptools, no network: --no-build-isolation) and imports it from a directory
that is not the repository, so a module that only resolves because the checkout is on sys.path fails here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SETUPTOOLS = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def _folder(package: str) -> Path:
    """Where pyproject's package-dir puts a ``gauntlet.*`` package in the checkout."""
    for prefix, folder in SETUPTOOLS["package-dir"].items():
        if package == prefix or package.startswith(prefix + "."):
            return REPO / folder / Path(*package[len(prefix):].split(".")[1:])
    raise AssertionError(f"{package}: under no package-dir entry")


def _checkout_packages() -> set[str]:
    """Every directory with an __init__.py under the mapped folders, as its ``gauntlet.*`` name."""
    found = set()
    for prefix, folder in SETUPTOOLS["package-dir"].items():
        for init in (REPO / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / folder).parts
            found.add(".".join((prefix, *rel)))
    return found


def test_every_package_directory_is_listed():
    """A package directory missing from pyproject's ``packages`` is left out of the wheel and, in the strict
    editable install (Makefile), out of the link tree: its modules then import from no installed copy."""
    listed = set(SETUPTOOLS["packages"])
    missing = sorted(_checkout_packages() - listed)
    assert not missing, f"pyproject.toml [tool.setuptools] packages lacks {missing}"
    stale = sorted(p for p in listed if not _folder(p).is_dir())
    assert not stale, f"pyproject.toml [tool.setuptools] packages names no directory: {stale}"
    assert {"gauntlet.steps.gates", "gauntlet.steps.backends.kubernetes"} <= listed


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Built from a copy of the sources: setuptools never empties build/lib/, so a wheel built in the checkout
    also ships any module that was once built there and has since been moved or deleted."""
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    for folder in SETUPTOOLS["package-dir"].values():
        shutil.copytree(REPO / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                        str(out), str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return next(out.glob("gauntlet-*.whl"))


def test_one_namespace_with_its_data(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.startswith("gauntlet-")}
    assert tops == {"gauntlet"}, f"the wheel installs more than gauntlet/: {sorted(tops)}"
    assert "gauntlet/__init__.py" not in names            # a namespace package, like images/steps/Dockerfile's links
    for must in ("gauntlet/contract/__init__.py", "gauntlet/params/profiles/kimi-k3-h20.yaml",
                 "gauntlet/params/images.yaml", "gauntlet/steps/py.typed", "gauntlet/workflows/schemas/argo-v4.1.2.schema.json",
                 "gauntlet/steps/backends/kubernetes/rbac.py"):
        assert must in names
    modules = {f"gauntlet/{p.relative_to(REPO).as_posix()}" for folder in SETUPTOOLS["package-dir"].values()
               for p in (REPO / folder).rglob("*.py") if "__pycache__" not in p.parts}
    shipped = {n for n in names if n.endswith(".py")}
    assert not modules - shipped, f"the wheel lacks {sorted(modules - shipped)[:5]}"
    assert not shipped - modules, f"the wheel ships modules the checkout has not: {sorted(shipped - modules)[:5]}"


# Renders, then fails unless every gauntlet module it loaded (the image table's loader included) came from argv[1].
_RENDER_FROM = """
import sys
import gauntlet.workflows.cli as cli
import gauntlet.params.loader as loader
rc = cli.main(["render", "--profile", "kimi-k3-h20", "--out", sys.argv[2]])
stray = sorted(n for n, m in sys.modules.items()
               if n.startswith("gauntlet.") and not (getattr(m, "__file__", None) or sys.argv[1]).startswith(sys.argv[1]))
assert not stray, f"imported from outside the install: {stray}"
assert str(loader.IMAGES_FILE).startswith(sys.argv[1]), loader.IMAGES_FILE
sys.exit(rc)
"""


def _rendered(out: Path) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_installed_wheel_renders_outside_the_checkout(wheel, tmp_path):
    """The wheel alone (its own params/images.yaml; no $GAUNTLET_IMAGES, run from outside the repository)
    renders kimi-k3-h20 byte for byte as the checkout does."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    env = {k: v for k, v in os.environ.items() if k not in ("GAUNTLET_IMAGES", "PYTHONPATH")}
    work = tmp_path / "elsewhere"
    work.mkdir()
    r = subprocess.run([sys.executable, "-c", _RENDER_FROM, str(site), str(tmp_path / "wheel-out")], cwd=work,
                       capture_output=True, text=True, env={**env, "PYTHONPATH": str(site)}, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    r = subprocess.run([sys.executable, "-m", "gauntlet.workflows.cli", "render", "--profile", "kimi-k3-h20",
                        "--out", str(tmp_path / "checkout-out")], cwd=REPO, capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    got, want = _rendered(tmp_path / "wheel-out"), _rendered(tmp_path / "checkout-out")
    assert "gauntlet-kimi-k3-h20.workflowtemplate.yaml" in want
    assert got.keys() == want.keys()
    assert [n for n in want if got[n] != want[n]] == []
