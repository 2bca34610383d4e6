"""docs/architecture.md's recipes, followed literally in a copy of the repository.

A recipe's steps are the doc's fenced blocks tagged ``recipe:<name>``: ``new <path>`` is a whole new file,
``edit <path>`` a diff whose context and ``-`` lines must occur once in the file (hunks split by ``@@``) and
become its context and ``+`` lines. The test writes them into a copy of the repository's files (``git
ls-files``: tracked, and new files git does not ignore; never .venv or build outputs), so the doc and this test
cannot drift. The copy runs with ``PYTHONPATH`` at a ``gauntlet/`` directory of links to its four folders (the
venv's install is never the one imported: each subprocess checks), renders and lints a profile with the CLI,
runs the tests the recipe names, and every file the copy ends up changing is one the doc said it would.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "architecture.md"
FOLDERS = ("contract", "params", "steps", "workflows")
FENCE = re.compile(r"^```\w+ recipe:(?P<recipe>[\w-]+) (?P<action>new|edit) (?P<path>\S+)\n(?P<body>.*?)^```$",
                   re.M | re.S)
STEP_TIMEOUT_S = 600     # a bound, not a target: `make test` runs this beside the box on 2 loaded cores


class RecipeError(AssertionError):
    """A step of the doc's recipe does not apply to the repository as it is."""


def recipe_blocks(doc: str, recipe: str) -> list[tuple[str, str, str]]:
    """(action, path, body) of each fenced block of ``recipe``, in the doc's order."""
    return [(m["action"], m["path"], m["body"]) for m in FENCE.finditer(doc) if m["recipe"] == recipe]


def apply_edit(text: str, diff: str, where: str) -> str:
    """``text`` with each hunk of ``diff`` applied; RecipeError unless each hunk's old lines occur exactly once."""
    hunks: list[list[str]] = [[]]
    for line in diff.splitlines():
        if line.startswith("@@"):
            hunks.append([])
        elif line[:1] in (" ", "-", "+"):
            hunks[-1].append(line)
        else:
            raise RecipeError(f"{where}: a diff line must start with ' ', '-', '+' or '@@': {line!r}")
    for hunk in hunks:
        old = "".join(x[1:] + "\n" for x in hunk if x[0] in " -")
        new = "".join(x[1:] + "\n" for x in hunk if x[0] in " +")
        padded = "\n" + text
        starts = [i for i in range(len(padded)) if padded.startswith("\n" + old, i)]   # overlapping ones too
        if len(starts) != 1:
            raise RecipeError(f"{where}: the doc's lines occur {len(starts)} times, not once:\n{old}")
        text = text[:starts[0]] + new + text[starts[0] + len(old):]
    return text


def follow(copy: Path, recipe: str) -> set[str]:
    """Apply every block of ``recipe`` to the copy; the repository paths it touched."""
    touched = set()
    blocks = recipe_blocks(DOC.read_text(), recipe)
    assert blocks, f"docs/architecture.md has no block tagged recipe:{recipe}"
    for action, path, body in blocks:
        target = copy / path
        if action == "new":
            assert not target.exists(), f"recipe:{recipe} creates {path}, which exists already"
            target.write_text(body)
        else:
            target.write_text(apply_edit(target.read_text(), body, f"recipe:{recipe} {path}"))
        touched.add(path)
    return touched


def stated(recipe_title: str, pattern: str) -> int:
    """The number the doc's section ``## Recipe: <title>`` states in ``pattern`` (one group)."""
    doc = DOC.read_text()
    start = doc.index(f"## Recipe: {recipe_title}")
    end = doc.find("\n## ", start + 1)
    m = re.search(pattern, doc[start:end if end > 0 else None])
    assert m, f"the section 'Recipe: {recipe_title}' states no count matching {pattern!r}"
    return int(m.group(1))


def copy_repo(dest: Path) -> Path:
    """The repository's files (tracked, and untracked ones git does not ignore) under ``dest/repo``."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, check=True).stdout.decode().split("\0")
    copy = dest / "repo"
    for name in filter(None, names):
        src = REPO / name
        if src.is_file() and not src.is_symlink():      # a file deleted in the working tree is not copied
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, copy / name)
    link = dest / "path" / "gauntlet"
    link.mkdir(parents=True)
    for folder in FOLDERS:
        (link / folder).symlink_to(copy / folder, target_is_directory=True)
    return copy


def contents(copy: Path) -> dict[str, str]:
    """Path -> sha256 of every file of the copy (bytecode caches aside)."""
    return {str(p.relative_to(copy)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in copy.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


def run(copy: Path, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python argv`` in the copy, importing ``gauntlet`` from it (never from the venv's install)."""
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GAUNTLET_IMAGES", "GAUNTLET_UPDATE_GOLDEN")}
    path = str(copy.parent / "path")
    r = subprocess.run([sys.executable, *argv], cwd=copy, capture_output=True, text=True, timeout=STEP_TIMEOUT_S,
                       env={**base, "PYTHONPATH": path, "PYTHONDONTWRITEBYTECODE": "1", **(env or {})})
    assert r.returncode == 0, f"python {' '.join(argv)} (exit {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def render_and_lint(copy: Path, profile: str, out: Path) -> dict[str, object]:
    """``gauntlet render`` then ``gauntlet lint`` from the copy; the qualification WorkflowTemplate rendered."""
    where = run(copy, "-c", "import gauntlet.steps, gauntlet.workflows.cli; print(gauntlet.steps.__file__)")
    assert where.stdout.strip() == str(copy.parent / "path" / "gauntlet" / "steps" / "__init__.py")
    run(copy, "-m", "gauntlet.workflows.cli", "render", "--profile", profile, "--out", str(out))
    assert "lint: ok" in run(copy, "-m", "gauntlet.workflows.cli", "lint", str(out)).stdout
    (wt,) = (p for p in out.glob("*.workflowtemplate.yaml") if not p.name.endswith("-nightly.workflowtemplate.yaml"))
    return yaml.safe_load(wt.read_text())


def templates(wt: dict) -> list[dict]:
    return wt["spec"]["templates"]


def dag(wt: dict, name: str) -> dict[str, dict]:
    """Task name -> task of the DAG template ``name``, in the rendered order."""
    return {t["name"]: t for t in next(t for t in templates(wt) if t["name"] == name)["dag"]["tasks"]}


# ------------------------------------------------------------------ the steps of a recipe, checked


def test_an_edit_applies_once_and_refuses_lines_it_cannot_find():
    text = "a = 1\nb = 2\nc = 3\n"
    assert apply_edit(text, " a = 1\n+x = 0\n b = 2\n@@\n-c = 3\n+c = 4", "t") == "a = 1\nx = 0\nb = 2\nc = 4\n"
    with pytest.raises(RecipeError, match="occur 0 times"):
        apply_edit(text, "-d = 4\n+d = 5", "t")
    with pytest.raises(RecipeError, match="occur 2 times"):
        apply_edit("a = 1\na = 1\n", "-a = 1\n+a = 2", "t")
    with pytest.raises(RecipeError, match="must start with"):
        apply_edit(text, "a = 1", "t")
    # a line matches whole lines only: "x = 1" is not found inside "xa = 1"
    with pytest.raises(RecipeError, match="occur 0 times"):
        apply_edit("xa = 1\n", "-a = 1\n+a = 2", "t")


def test_every_recipe_block_names_its_recipe_action_and_file():
    doc = DOC.read_text()
    tagged = re.findall(r"^```\w+ recipe:.*$", doc, re.M)
    assert len(tagged) == len(FENCE.findall(doc)), "a recipe block whose tag is not `recipe:<name> new|edit <path>`"
    assert {m["recipe"] for m in FENCE.finditer(doc)} == {"gate", "engine"}


# ------------------------------------------------------------------ the recipes, followed


def test_add_a_gate_as_the_doc_says(tmp_path):
    copy = copy_repo(tmp_path)
    before = contents(copy)
    touched = follow(copy, "gate")
    assert len(touched) == stated("add a gate", r"touches (\d+) files by hand"), sorted(touched)

    wt = render_and_lint(copy, "kimi-k3-h20", tmp_path / "rendered")
    # the gate's own template sits between its predecessor's and its successor's, and so does its task
    names = [t["name"] for t in templates(wt)]
    assert names.index("seq-smoke") < names.index("seq-gauges") < names.index("seq-perf"), names
    seq = dag(wt, "engine-sequence")
    order = list(seq)
    assert order.index("smoke") < order.index("gauges") < order.index("perf"), order
    # Argo's order is the depends: after smoke, and perf waits for it (not beside perf, both after smoke)
    assert seq["gauges"]["depends"] == "smoke.Succeeded" and seq["perf"]["depends"] == "gauges.Succeeded"
    gate = next(t for t in templates(wt) if t["name"] == "seq-gauges")
    args = gate["container"]["args"]
    assert args[:2] == ["step", "gauges"] and "--endpoint" in args and "--engine" in args
    assert gate["serviceAccountName"] == "gauntlet-manager"          # NEEDS.api manage: it may redeploy

    # its tests, with the golden files regenerated as the recipe says, then the suites that pin the sequence
    run(copy, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_render.py", "-k", "golden",
        env={"GAUNTLET_UPDATE_GOLDEN": "1"})
    out = run(copy, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not engine and not argo",
              "tests/test_gauges.py", "tests/test_rank_watch.py::test_the_gates_that_judge_the_engine_are_watched",
              "tests/test_render.py::test_gate_order_of_the_plan", "tests/test_render.py::test_golden",
              "tests/test_rbac.py::test_every_request_of_every_step_is_granted_to_its_account",
              "tests/test_plan.py", "tests/test_gate_declarations.py", "tests/test_boundaries.py").stdout
    assert re.search(r"^\d+ passed(, \d+ deselected)? in ", out.strip().splitlines()[-1]), out[-2000:]
    assert "5 passed" in run(copy, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_gauges.py").stdout

    after = contents(copy)
    changed = {p for p in after if before.get(p) != after[p]}
    goldens = {p for p in changed if p.startswith("tests/golden/")}
    assert len(goldens) == stated("add a gate", r"then regenerates (\d+) golden files"), sorted(goldens)
    assert changed == touched | goldens, sorted(changed ^ (touched | goldens))


def test_add_an_engine_as_the_doc_says(tmp_path):
    copy = copy_repo(tmp_path)
    before = contents(copy)
    touched = follow(copy, "engine")
    assert len(touched) == stated("add an engine", r"touches (\d+) files"), sorted(touched)

    # the recipe's profile runs the new engine: render and lint it like any other
    wt = render_and_lint(copy, "h200-lmdeploy", tmp_path / "rendered")
    assert dag(wt, "main")["lmdeploy"]["template"] == "engine-sequence"
    check = next(t for t in templates(wt) if t["name"] == "engine-check-lmdeploy")
    pinned = yaml.safe_load((copy / "params" / "images.yaml").read_text())["images"]["lmdeploy"]
    # Gate 0 runs in the engine's own image: the internal copy, by the digest the recipe pinned
    assert check["container"]["image"] == f"{pinned['internal'].rsplit(':', 1)[0]}@{pinned['digest']}"

    # the engine's command line, as the cluster back end's StatefulSet runs it
    script = ("import json\nfrom gauntlet.params import load_profile\n"
              "from gauntlet.steps.backends.kubernetes.manifests import engine_statefulset, rank_argvs\n"
              "p = load_profile('h200-lmdeploy')\n"
              "sts = engine_statefulset(p, 'lmdeploy', 'r1', 'img')\n"
              "print(json.dumps({'argvs': rank_argvs(p, 'lmdeploy', p.engine('lmdeploy'), 'leader'),\n"
              "                  'pod': sts['spec']['template']['spec']}))\n")
    shown = json.loads(run(copy, "-c", script).stdout)
    profile = yaml.safe_load((copy / "params" / "profiles" / "h200-lmdeploy.yaml").read_text())
    m, spec = profile["model"], profile["engines"]["lmdeploy"]
    assert shown["argvs"] == [["lmdeploy", "serve", "api_server", m["mount_path"], "--model-name", m["served_name"],
                               "--server-name", "0.0.0.0", "--server-port", str(spec["port"]), "--tp", "1",
                               "--session-len", str(spec["args"]["context_length"]),
                               "--cache-max-entry-count", str(spec["args"]["mem_fraction"]),
                               "--reasoning-parser", spec["reasoning_parser"],
                               "--tool-call-parser", spec["tool_call_parser"], "--enable-metrics"]]
    assert "lmdeploy serve api_server" in json.dumps(shown["pod"])

    # the tests that keep the lists of engines in step, and those every profile and gate goes through
    out = run(copy, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not engine and not argo",
              "tests/test_engine_registry.py", "tests/test_gate_options.py", "tests/test_gate_declarations.py",
              "tests/test_profiles.py", "tests/test_boundaries.py").stdout
    assert re.search(r"^\d+ passed(, \d+ deselected)? in ", out.strip().splitlines()[-1]), out[-2000:]

    after = contents(copy)
    assert {p for p in after if before.get(p) != after[p]} == touched
