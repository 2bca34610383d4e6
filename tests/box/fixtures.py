"""pytest fixtures for the box (registered in tests/conftest.py through ``pytest_plugins``).

``control_plane``: one box per test session (built first if a pin changed). ``box_session``: the
box prepared for the kimi-k3-h20 template, with the process kubelet running the profile's two
nodes, another team's GPU node and a general node (:func:`box.scenarios.box_nodes`). If the box cannot be built or started, every test that uses it
fails with the reason: never a silent skip.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from box.build import BuildError, ensure_built
from box.controlplane import BoxError, ControlPlane

__all__ = ["control_plane", "box_session", "no_run_left_behind"]


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    try:
        binaries = ensure_built(verbose=True)
    except BuildError as exc:
        pytest.fail(f"the box could not be built: {exc}", pytrace=False)
    workdir = tmp_path_factory.mktemp("box")
    cp = ControlPlane(workdir=workdir, binaries=binaries)
    try:
        cp.start()
    except BoxError as exc:
        pytest.fail(f"the box did not start: {exc}", pytrace=False)
    # start-up to a ready API server and a started controller, for docs/cluster.md
    rec = Path(__file__).resolve().parents[2] / "build" / "box-startup.json"
    rec.parent.mkdir(exist_ok=True)
    rec.write_text(json.dumps({"startup_s": cp.startup_s, "built_s": binaries.built_s}))
    yield cp
    cp.stop()


@pytest.fixture(scope="session")
def box_session(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory):
    from box.kubelet import ProcessKubelet, default_images
    from box.scenarios import PROFILE, BoxSession, box_nodes
    from gauntlet.params import load_profile

    profile = load_profile(PROFILE)
    nodes = [n.name for n in profile.hardware.nodes]
    work = tmp_path_factory.mktemp("kubelet")
    roots = {n: work / "nodes" / n for n in nodes}
    kubelet = ProcessKubelet(control_plane.api_client(), workdir=work, host_roots=roots, **box_nodes(profile),
                             images=default_images(control_plane.bin_dir, control_plane.executor_image))
    kubelet.start()
    session = BoxSession(control_plane, kubelet, roots, work)
    try:
        session.prepare()
        yield session
    finally:
        session.close()
        kubelet.stop()
        if os.environ.get("GAUNTLET_BOX_KEEP"):
            print(f"box kept: {control_plane.workdir} {work}")


@pytest.fixture(autouse=True)
def no_run_left_behind(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test on a box: a workflow it left unfinished (a timed-out wait, a failed assertion mid-run) is
    stopped, so the next test on this box does not sit Pending behind it on the pool's mutex until it times out
    too. Tests that use no box are left alone."""
    yield
    if "box_session" not in request.fixturenames:
        return
    left = request.getfixturevalue("box_session").stop_leftovers()
    if left:
        print(f"box: stopped the runs {request.node.nodeid} left unfinished: {', '.join(left)}")


def pvc_dir(session, claim: str) -> Path:
    return Path(session.kubelet._claim_dir(session.ns, claim))
