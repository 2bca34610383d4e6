"""The back ends a run can use: a registry of names to modules, imported on demand, and one rule to choose.

``local`` runs the engine as a labelled process group on this machine; ``kubernetes``
server-side-applies labelled objects in the profile's namespace. Every gate that acts on
the run's resources (deploy, teardown, cleanup, network, nodes, janitor) and both runners
(``gauntlet run`` and the Argo render) reach them only through :data:`BACKENDS`,
:func:`backend_for` and :func:`capability`; the ``--backend`` choices come from the registry
(:func:`gauntlet.steps.gates.shared_options.backend_option`).

What a caller may ask is in :mod:`gauntlet.steps.backends.protocol`: every back end is a
:class:`~gauntlet.steps.backends.protocol.Backend`; what only some do (the runner's mark, RBAC,
the cluster's API) is a Protocol a back end lists in its ``claims``.

A back end's module is imported when it is first chosen, and its plumbing (the Kubernetes
client, process groups) only when called, so choosing one, or rendering, starts nothing.
Nothing here imports a gate, and no implementation imports this registry.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, TypeVar, cast

from gauntlet.contract import UsageError
from gauntlet.params.models import BACKEND_KINDS
from gauntlet.steps.backends.protocol import Backend

if TYPE_CHECKING:
    from gauntlet.params import Profile

__all__ = ["BACKENDS", "backend_for", "capability", "require"]

P = TypeVar("P")

# name -> the module whose ``BACKEND`` implements it
MODULES = {"kubernetes": "gauntlet.steps.backends.kubernetes.backend",
           "local": "gauntlet.steps.backends.local.backend"}


class Registry(Mapping[str, Backend]):
    """The back ends by name, each module imported the first time it is asked for."""

    def __init__(self, modules: Mapping[str, str]) -> None:
        self._modules = dict(modules)
        self._loaded: dict[str, Backend] = {}

    def __getitem__(self, name: str) -> Backend:
        if name not in self._loaded:
            self._loaded[name] = importlib.import_module(self._modules[name]).BACKEND
        return self._loaded[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def __len__(self) -> int:
        return len(self._modules)


BACKENDS: Mapping[str, Backend] = Registry(MODULES)
if set(MODULES) != set(BACKEND_KINDS):
    raise ImportError(f"the back-end registry {sorted(MODULES)} must name each hardware kind {sorted(BACKEND_KINDS)}")


def backend_for(profile: Profile | None, override: str | None = None) -> Backend:
    """``override`` (``--backend``), else the profile's ``hardware.kind``; without a profile (cleanup when it
    does not load, the janitor) kubernetes inside a cluster, else local."""
    if override:
        name = override
    elif profile is not None:
        name = profile.hardware.kind
    else:
        in_cluster = os.environ.get("KUBERNETES_SERVICE_HOST") or os.environ.get("GAUNTLET_KUBE_API")
        name = "kubernetes" if in_cluster else "local"
    if name not in BACKENDS:
        raise UsageError(f"back end {name!r}: expected one of {', '.join(sorted(BACKENDS))}")
    return BACKENDS[name]


# ``proto`` is a Protocol class; typed as a callable because mypy refuses an abstract class for ``type[P]``
def capability(backend: Backend, proto: Callable[..., P]) -> P | None:
    """``backend`` as ``proto`` when it claims it (``Backend.claims``), else None."""
    return cast(P, backend) if proto in backend.claims else None


def require(backend: Backend, proto: Callable[..., P], why: str) -> P:
    """``backend`` as ``proto``; UsageError naming ``why`` (what needed it) when it does not claim it."""
    found = capability(backend, proto)
    if found is None:
        have = sorted(n for n in BACKENDS if proto in BACKENDS[n].claims)
        raise UsageError(f"{why}: the {backend.name} back end does not do {getattr(proto, '__name__', proto)} "
                         f"(back ends that do: {', '.join(have) or 'none'})")
    return found
