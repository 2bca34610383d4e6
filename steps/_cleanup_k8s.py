"""The exit handler on Kubernetes: keep the evidence, then give everything this run made back.

Order matters: first every pod's log (every container, and the previous instance after a
restart), the objects as the server holds them (args, env, image) and a summary of the
run's verdicts; then scale every StatefulSet to 0 and delete the StatefulSets, Jobs and
Services that carry ``gauntlet.dev/run=<uid>``; then wait for their pods to go. Anything
without the label is never listed, scaled or deleted. Running it twice is harmless: the
second run finds nothing and says so.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from steps._evidence import Check, write_json_atomic

__all__ = ["cleanup", "POLL_S", "WAIT_S", "KIND_ORDER"]

POLL_S = 5.0
WAIT_S = 600
KIND_ORDER = ("StatefulSet", "Job", "Service")      # stop the GPU users first, their DNS last


def _results(run_dir: Path, own: Path) -> dict[str, str]:
    """Every gate's verdict status in the run directory (the exit handler's own excluded)."""
    out: dict[str, str] = {}
    for f in sorted(run_dir.glob("**/verdict.json")):
        if own in f.parents:
            continue
        try:
            out[str(f.parent.relative_to(run_dir))] = json.loads(f.read_text()).get("status", "?")
        except (OSError, ValueError):
            out[str(f.parent.relative_to(run_dir))] = "unreadable"
    return out


def _failures(text: str | None) -> Any:
    """{{workflow.failures}}: the string null when nothing failed, else JSON (kept raw if it is not)."""
    if text in (None, "", "null"):
        return []
    try:
        return json.loads(text)
    except ValueError:
        return text


def cleanup(args: argparse.Namespace, out: Path) -> tuple[list[Check], dict[str, Any]]:
    from steps._k8s import run_id_from
    from steps._k8s.api import connect
    from steps._k8s.manager import Manager

    profile = args.profile_obj
    run_id = run_id_from(args)
    ns = os.environ.get("GAUNTLET_NAMESPACE") or profile.namespace
    mgr = Manager(connect(), ns, run_id)
    out = Path(out)
    run_dir = Path(getattr(args, "run_dir", None) or out.parent)
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)

    pods = mgr.pods()
    saved = []
    for p in pods:
        name = p["metadata"]["name"]
        statuses = {cs.get("name"): cs for cs in ((p.get("status") or {}).get("containerStatuses") or [])}
        for c in [c["name"] for c in p["spec"].get("initContainers", [])] + [c["name"] for c in p["spec"]["containers"]]:
            (logs / f"{name}.{c}.log").write_text(mgr.logs(name, c))
            saved.append(f"{name}.{c}")
            if int((statuses.get(c) or {}).get("restartCount") or 0):
                (logs / f"{name}.{c}.previous.log").write_text(mgr.logs(name, c, previous=True))
    objects = {kind: mgr.list(kind) for kind in KIND_ORDER}
    write_json_atomic(out / "objects.json", objects)          # args, env, image of everything the run made
    write_json_atomic(out / "results.json", {
        "workflow_status": getattr(args, "workflow_status", None),
        "failures": _failures(getattr(args, "failures", None)),
        "verdicts": _results(run_dir, out)})

    actions: list[dict[str, str]] = []
    for s in objects["StatefulSet"]:
        name = s["metadata"]["name"]
        if (s.get("spec") or {}).get("replicas", 0) and mgr.scale(name, 0):
            actions.append({"kind": "StatefulSet", "name": name, "action": "scaled to 0"})
    for kind in KIND_ORDER:
        for o in objects[kind]:
            name = o["metadata"]["name"]
            if mgr.delete(kind, name):
                actions.append({"kind": kind, "name": name, "action": "deleted"})
    t0 = time.monotonic()
    left = mgr.pods()
    while left and time.monotonic() - t0 < WAIT_S:
        time.sleep(POLL_S)
        left = mgr.pods()
    remaining = {k: [o["metadata"]["name"] for o in mgr.list(k)] for k in KIND_ORDER}
    remaining = {k: v for k, v in remaining.items() if v}
    left_names = [p["metadata"]["name"] for p in left]
    checks = [
        Check("evidence_saved", "pass", "every pod's log", len(saved),
              f"saved {len(saved)} container log(s) of {len(pods)} pod(s), {sum(map(len, objects.values()))} "
              f"object(s) and {len(_results(run_dir, out))} verdict(s)" if pods or any(objects.values())
              else "nothing of this run left on the cluster: no logs to save"),
        Check("released", "fail" if remaining or left_names else "pass", {}, {**remaining, "pods": left_names},
              f"still present: {remaining or ''} {left_names or ''}".strip() if remaining or left_names
              else (f"{len(actions)} action(s): " + ", ".join(f"{a['kind']} {a['name']} {a['action']}"
                                                             for a in actions)) if actions
              else f"nothing labelled {mgr.selector} in {ns}: already clean"),
    ]
    return checks, {"run_id": run_id, "namespace": ns, "actions": actions, "saved_logs": saved,
                    "workflow_status": getattr(args, "workflow_status", None)}
