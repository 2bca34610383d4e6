"""Kubernetes plumbing for the cluster back end: plan (manifests), execute (apply), manage (owned CRUD).

- :mod:`gauntlet.steps.backends.kubernetes.manifests`: pure builders of every object a run creates, all labelled with the run;
- :mod:`gauntlet.steps.backends.kubernetes.apply`: server-side apply under one field manager;
- :mod:`gauntlet.steps.backends.kubernetes.manager`: scale / delete / list / logs that refuse objects without the run's label;
- :mod:`gauntlet.steps.backends.kubernetes.rbac`: the exact rules those calls need, and the Role that grants them.

The kubernetes client is imported only inside :mod:`gauntlet.steps.backends.kubernetes.api`, which talks to the server,
so rendering stays offline and pure.
"""

from __future__ import annotations

import os
import re

from gauntlet.contract import UsageError

__all__ = ["RUN_LABEL", "FIELD_MANAGER", "ENGINE_LABEL", "COMPONENT_LABEL", "VARIANT_LABEL", "run_id_from", "dns_name"]

RUN_LABEL = "gauntlet.dev/run"
ENGINE_LABEL = "gauntlet.dev/engine"
COMPONENT_LABEL = "gauntlet.dev/component"
# present (the variant's name) on a Gate 6 variant's objects, absent on the baseline's: `!gauntlet.dev/variant`
VARIANT_LABEL = "gauntlet.dev/variant"
FIELD_MANAGER = "gauntlet"


def run_id_from(given: str | None) -> str:
    """The workflow uid that labels what this run creates: --run-id (``given``), else $GAUNTLET_RUN_ID."""
    rid = given or os.environ.get("GAUNTLET_RUN_ID")
    if not rid:
        raise UsageError("no run id: pass --run-id {{workflow.uid}} or set GAUNTLET_RUN_ID "
                         "(everything a run creates is labelled with it)")
    if not re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", rid):
        raise UsageError(f"run id {rid!r} is not a valid label value (63 chars of [A-Za-z0-9-_.])")
    return rid


def dns_name(*parts: str, limit: int = 52) -> str:
    """A DNS-1035 name from parts, short enough for StatefulSet pod names and their controller-revision label."""
    s = re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")
    if not s or not s[0].isalpha():
        s = "g-" + s
    return s[:limit].rstrip("-")
