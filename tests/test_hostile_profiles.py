"""Hostile input, property-based: mutations of the shipped Kimi profile and hostile CLI arguments, run through
`gauntlet lint --profile` and `gauntlet render` in-process.

Whatever is generated: exit 0, or exit 2 with one line naming the file (and the field or line); never a
traceback, never a file written outside --out, at most MEMORY_LIMIT of Python allocations and
hypothesis' deadline per example. The categories are docs/reliability.md's "Hostile input" table, by name.
"""

from __future__ import annotations

import contextlib
import copy
import io
import math
import os
import re
import resource
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gauntlet.params.loader import PROFILES_DIR
from gauntlet.workflows.cli import main

KIMI_TEXT = (PROFILES_DIR / "kimi-k3-h20.yaml").read_text()
KIMI = yaml.safe_load(KIMI_TEXT)
MEMORY_LIMIT = 256 << 20         # growth of the process's peak RSS in one example (the bombs of issue 21: 3-4 GB)
MARK = "__HOSTILE__"

# the categories, as docs/reliability.md names them
CATEGORIES = ["wrong-type", "out-of-range", "huge-string", "deep-nesting", "alias", "duplicate-key",
              "non-utf8", "hostile-name", "unknown-key", "oversized-file", "cli-arguments"]
# whatever is drawn in these, the profile is refused (the others may draw a valid value: 17 is a fine port)
REFUSED = {"huge-string", "deep-nesting", "alias", "duplicate-key", "non-utf8", "oversized-file"}


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path to a leaf (a scalar) of the profile."""
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _paths(v, prefix + (k,))]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in _paths(v, prefix + (i,))]
    return [prefix]


def _at(path: tuple) -> Any:
    node: Any = KIMI
    for k in path:
        node = node[k]
    return node


LEAVES = _paths(KIMI)
NUMBERS = [p for p in LEAVES if type(_at(p)) in (int, float)]
STRINGS = [p for p in LEAVES if isinstance(_at(p), str)]
MAPPINGS = [()] + sorted({p[:i] for p in LEAVES for i in range(1, len(p)) if isinstance(_at(p[:i]), dict)}, key=str)


def _set(path: tuple, value: Any, doc: dict | None = None) -> dict:
    d = copy.deepcopy(KIMI if doc is None else doc)
    node = d
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return d


def _text(doc: dict) -> str:
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=10**9)


def _marked(path: tuple, replacement: str) -> str:
    """The profile's YAML with the value at ``path`` replaced by raw YAML text (nesting, aliases)."""
    return _text(_set(path, MARK)).replace(MARK, replacement, 1)


scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20),
                    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(), max_size=2))
edge_numbers = st.sampled_from([0, -1, -8, 2**63, 10**30, 65536, 70000, 17, 2.0, -0.5, 1e308, 0.0,
                                math.nan, math.inf, -math.inf])
hostile_names = st.one_of(st.sampled_from(["../../outside", "a/b", "x" * 300, "", "UPPER", "a_b", "-a", "a-", "..",
                                           "a.b", "kimi\nname", "kimi k3", "é", "a" * 36]), st.text(max_size=80))


@st.composite
def profiles(draw: Any, category: str) -> bytes:
    """One hostile profile file of ``category`` (bytes: some are not UTF-8)."""
    if category == "wrong-type":
        return _text(_set(draw(st.sampled_from(LEAVES)), draw(scalars))).encode()
    if category == "out-of-range":
        return _text(_set(draw(st.sampled_from(NUMBERS)), draw(edge_numbers))).encode()
    if category == "huge-string":
        s = draw(st.sampled_from(["x", "é", "\u2028", '"', "\n", "中"])) * draw(st.integers(4097, 80_000))
        return _text(_set(draw(st.sampled_from(STRINGS + [("description",), ("name",), ("timezone",)])), s)).encode()
    if category == "deep-nesting":
        n = draw(st.integers(20, 30_000))
        inner = draw(st.sampled_from(["[" * n + "]" * n, "[" * n, "{a: " * n + "1" + "}" * n]))
        return _marked(draw(st.sampled_from(LEAVES)), inner).encode()
    if category == "alias":
        levels = draw(st.integers(1, 12))
        bomb = "\n".join(["x0: &a0 [lol, lol, lol]"] + [f"x{i}: &a{i} [*a{i-1}, *a{i-1}, *a{i-1}]"
                                                       for i in range(1, levels)])
        where = draw(st.sampled_from([("experiments", 0, "change", "prefix_cache"), ("description",)] + LEAVES))
        return (bomb + "\n" + _marked(where, f"*a{levels - 1}")).encode()
    if category == "duplicate-key":
        path = draw(st.sampled_from([p for p in LEAVES if isinstance(p[-1], str)]))
        text = _text(_set(path, MARK))
        m = re.search(rf"^(\s*(?:- )?){re.escape(path[-1])}: {MARK}$", text, re.M)
        if m is None:                       # a flow-style or quoted key: duplicate a top-level key instead
            return (KIMI_TEXT + f"\n{path[0]}: {{}}\n").encode()
        dup = " " * len(m.group(1)) + f"{path[-1]}: 1"
        return (text[:m.start()] + f"{m.group(1)}{path[-1]}: 2\n{dup}" + text[m.end():]).encode()
    if category == "non-utf8":
        return draw(st.one_of(
            st.binary(min_size=1, max_size=4000),
            st.just(KIMI_TEXT.replace("Kimi K3", "Kimi K3 caf\xe9").encode("latin-1")),
            st.just(KIMI_TEXT.encode("utf-16")),
            st.just(KIMI_TEXT.encode() + b"\xff\xfe" + b"\x00" * 8)))
    if category == "hostile-name":
        key = draw(st.sampled_from([("name",), ("namespace",), ("hardware", "node_pool"), ("service_account",),
                                    ("runs_pvc",), ("experiments", 0, "name"), ("bench", "cases", 0, "name"),
                                    ("hardware", "nodes", 0, "name"), ("nightly", "schedule"), ("timezone",)]))
        return _text(_set(key, draw(hostile_names))).encode()
    if category == "unknown-key":
        where = draw(st.sampled_from(MAPPINGS))
        key = draw(st.text(min_size=1, max_size=40).filter(lambda k: k not in KIMI))
        return _text(_set(where + (key,), draw(scalars))).encode()
    if category == "oversized-file":
        return (KIMI_TEXT + "\n# " + "x" * draw(st.integers(256 * 1024, 600 * 1024)) + "\n").encode()
    raise AssertionError(category)


def _run(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main(argv)
        except SystemExit as exc:           # argparse: must still be one line, exit 2
            rc = exc.code if isinstance(exc.code, int) else 2
    return rc, err.getvalue()


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _check(work: Path, argv: list[str], must_name: str | None) -> int:
    before = _tree(work)
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10
    rc, err = _run(argv)
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10) - peak_before
    assert "Traceback" not in err, err[-2000:]
    # 1: lint's own verdict on a profile that validates (a finding a line each, then their count), never a crash
    assert rc in (0, 2) or (rc == 1 and argv[0] == "lint" and re.search(r"^lint: \d+ finding", err, re.M)), \
        (rc, err[-2000:])
    if rc == 2:
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) == 1, err[-2000:]
        assert re.match(r"^(ProfileError|UsageError|RenderError): ", lines[0]), lines[0]
        assert len(lines[0]) < 2000, lines[0][:200]
        if must_name is not None:
            assert must_name in lines[0], lines[0]
    created = {p for p in _tree(work) - before if not p.startswith("out")}
    assert not created, f"written outside --out: {sorted(created)}"
    assert grown < MEMORY_LIMIT, f"peak RSS grew {grown >> 20} MiB for {argv[:3]}"
    return rc


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("hostile")


# 25 examples a category, the same ones every run (about 25 s on 2 busy cores); HOSTILE_EXAMPLES=500
# HOSTILE_RANDOM=1 for a longer, random search
HOSTILE = settings(max_examples=int(os.environ.get("HOSTILE_EXAMPLES", "25")), deadline=20_000,
                   derandomize=not os.environ.get("HOSTILE_RANDOM"), database=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                          HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize("category", [c for c in CATEGORIES if c != "cli-arguments"])
@HOSTILE
@given(data=st.data())
def test_hostile_profile(work, category, data):
    content = data.draw(profiles(category))
    prof = work / "p.yaml"
    prof.write_bytes(content)
    rc = _check(work, ["lint", "--profile", str(prof)], must_name=str(prof))
    if rc == 0:     # lint accepted it: render must write only under --out, and what it writes is accepted too
        out = work / "out"
        assert _check(work, ["render", "--profile", str(prof), "--out", str(out), "--no-lint"], str(prof)) == 0
    if category in REFUSED:
        assert rc == 2, f"{category}: accepted"


@HOSTILE
@given(data=st.data())
def test_hostile_cli_arguments(work, data):
    (work / "a-file").write_text("x")
    profile = data.draw(st.one_of(hostile_names, st.sampled_from(
        ["kimi-k3-h20", "/nonexistent/p.yaml", str(work), str(work / "a-file"), "../kimi-k3-h20", "p.yml",
         "x" * 5000 + ".yaml"])))
    out = data.draw(st.sampled_from([str(work / "out" / "o"), str(work / "a-file"), str(work / "a-file" / "o")]))
    command = data.draw(st.sampled_from(["lint", "render", "plan"]))
    argv = [command, "--profile", profile] + (["--out", out, "--no-lint"] if command == "render" else [])
    argv += data.draw(st.lists(st.sampled_from(["--bogus", "-x", "--out", "", "--profile"]), max_size=2))
    _check(work, argv, must_name=None)


def test_every_category_is_in_the_doc():
    """The doc's table and this test name the same categories."""
    doc = (Path(__file__).resolve().parent.parent / "docs" / "reliability.md").read_text()
    section = doc.split("## Hostile input", 1)[1].split("\n## ", 1)[0]
    named = re.findall(r"^\| `([a-z0-9-]+)` \|", section, re.M)
    assert named == CATEGORIES
