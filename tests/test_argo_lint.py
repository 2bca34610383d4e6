"""Argo's own validator on every rendered document (marker ``argo``).

The box builds Argo's real CLI from the same module as its controller (tests/box/argo); ``argo lint
--offline`` is the code path users get from ``argo lint``: it resolves the CronWorkflow's
templateRef from the files given and runs the controller's validation. Beside it runs the
project's own lint; anything Argo finds that ours misses is a lint rule to add.
"""

from __future__ import annotations

import subprocess

import pytest

from box.build import BuildError, ensure_built
from gauntlet.params import list_profiles, load_profile
from gauntlet.workflows.render import dump_yaml, render_documents

pytestmark = pytest.mark.argo


@pytest.fixture(scope="module")
def argo_bin():
    try:
        return ensure_built(verbose=True).path("argo")
    except BuildError as exc:
        pytest.fail(f"the box could not be built: {exc}", pytrace=False)


def _cluster_profiles() -> list[str]:
    return [p for p in list_profiles() if load_profile(p).hardware.kind == "kubernetes"]


def _lint(argo_bin, files) -> subprocess.CompletedProcess:
    return subprocess.run([str(argo_bin), "lint", "--offline", "--output", "simple", *map(str, files)],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("name", _cluster_profiles())
def test_argo_lint_offline_accepts_every_rendered_document(argo_bin, name, tmp_path):
    files = []
    for fname, doc in render_documents(load_profile(name)).items():
        kinds = {d.get("kind") for d in (doc if isinstance(doc, list) else [doc])}
        if kinds & {"WorkflowTemplate", "CronWorkflow", "Workflow"}:
            (tmp_path / fname).write_text(dump_yaml(doc))
            files.append(tmp_path / fname)
    assert len(files) >= 2
    r = _lint(argo_bin, files)
    assert r.returncode == 0, f"argo lint --offline on {name}:\n{r.stdout}{r.stderr}"


def test_argo_lint_offline_catches_a_broken_reference(argo_bin, tmp_path):
    """The validator is really run: a depends on a task that does not exist must fail."""
    doc = render_documents(load_profile("kimi-k3-h20"))
    tmpl = next(d for d in doc.values() if isinstance(d, dict) and d.get("kind") == "WorkflowTemplate")
    main = next(t for t in tmpl["spec"]["templates"] if t["name"] == "main")
    main["dag"]["tasks"][-1]["depends"] = "no-such-task.Succeeded"
    f = tmp_path / "broken.yaml"
    f.write_text(dump_yaml(tmpl))
    r = _lint(argo_bin, [f])
    assert r.returncode != 0 and "no-such-task" in (r.stdout + r.stderr), r.stdout + r.stderr
