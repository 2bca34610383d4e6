"""Server-side apply under one field manager: re-applying the same manifest is a no-op,
so an Argo retry of a gate converges instead of failing on "already exists"."""

from __future__ import annotations

from typing import Any

from gauntlet.steps._k8s import FIELD_MANAGER, RUN_LABEL
from gauntlet.steps._k8s.api import APPLY, Api, call
from gauntlet.steps._k8s.manager import KINDS

__all__ = ["apply", "apply_all"]


def apply(api: Api, manifest: dict[str, Any]) -> dict[str, Any]:
    """PATCH (application/apply-patch+yaml, force) one labelled object; returns the server's object."""
    kind = manifest["kind"]
    if kind not in KINDS:
        raise ValueError(f"apply: a run creates only {sorted(KINDS)}, not {kind}")
    meta = manifest["metadata"]
    if RUN_LABEL not in (meta.get("labels") or {}):
        raise ValueError(f"apply: {kind} {meta['name']} carries no {RUN_LABEL} label: cleanup could not find it")
    attr, suffix = KINDS[kind]
    fn = getattr(getattr(api, attr), f"patch_{suffix}")
    return call(fn, meta["name"], meta["namespace"], manifest, field_manager=FIELD_MANAGER, force=True,
                _content_type=APPLY)


def apply_all(api: Api, manifests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [apply(api, m) for m in manifests]
