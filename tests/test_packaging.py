"""The distribution installs one namespace, ``gauntlet.*``, with its data, and runs outside the checkout.

Builds the real wheel (setuptools, no network: --no-build-isolation) and imports it from a directory
that is not the repository, so a module that only resolves because the checkout is on sys.path fails here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                        str(out), str(REPO)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return next(out.glob("gauntlet-*.whl"))


def test_one_namespace_with_its_data(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.startswith("gauntlet-")}
    assert tops == {"gauntlet"}, f"the wheel installs more than gauntlet/: {sorted(tops)}"
    assert "gauntlet/__init__.py" not in names            # a namespace package, like images/steps/Dockerfile's links
    for must in ("gauntlet/contract/__init__.py", "gauntlet/params/profiles/kimi-k3-h20.yaml",
                 "gauntlet/workflows/schemas/argo-v4.1.2.schema.json", "gauntlet/steps/_k8s/rbac.py"):
        assert must in names


def test_installed_wheel_renders_outside_the_checkout(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    env = {**os.environ, "PYTHONPATH": str(site), "GAUNTLET_IMAGES": str(REPO / "images" / "engines.yaml")}
    code = ("import gauntlet.workflows.cli as c, sys; assert c.__file__.startswith(sys.argv[1]), c.__file__; "
            "sys.exit(c.main(['render', '--profile', 'kimi-k3-h20', '--out', sys.argv[2]]))")
    r = subprocess.run([sys.executable, "-c", code, str(site), str(tmp_path / "out")], cwd=tmp_path,
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "out" / "gauntlet-kimi-k3-h20.workflowtemplate.yaml").is_file()
