"""The exit handler on Kubernetes: keep the evidence, then give everything this run made back.

Order matters: first every held pod's log (every container, and the previous instance after
a restart), the objects as the server holds them (args, env, image) and a summary of the
run's verdicts; then scale every StatefulSet to 0 and delete the StatefulSets, Jobs and
Services that carry ``gauntlet.dev/run=<uid>``; then wait for their pods to go. Anything
without the label is never listed, scaled or deleted. Running it twice is harmless: the
second run finds nothing and says so.

It never stops at the first error: each object is released on its own, an API error on
one is recorded (as data) and the others are still released. The verdict names every
object the run had and its final replica count (``deleted`` when it is gone), and
``metrics.held`` lists what still holds something; the step's exit code follows it.

Argo's own step pods carry the run label too (the template's ``podMetadata``), the
cleanup pod among them: they are Argo's (its podGC and the workflow's ownerReference
remove them) and hold no GPU of the engine, so they are neither deleted nor waited for.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gauntlet.contract import Check, CorruptVerdict, TransientError, Verdict, write_json_atomic
from gauntlet.contract.layout import RunLayout

if TYPE_CHECKING:
    from gauntlet.params import Profile
    from gauntlet.steps.backends.protocol import ReleaseRequest

__all__ = ["cleanup", "release_run", "Released", "ApiErrors", "held_pods", "POLL_S", "WAIT_S", "KIND_ORDER", "ARGO_POD_LABEL"]

POLL_S = 5.0
WAIT_S = 600
KIND_ORDER = ("StatefulSet", "Job", "Service")      # stop the GPU users first, their DNS last
ARGO_POD_LABEL = "workflows.argoproj.io/workflow"    # set by Argo on every step pod it creates
_DONE = ("Succeeded", "Failed")


def held_pods(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pods that still hold something: not Argo's step pods, not finished."""
    return [p for p in pods if ARGO_POD_LABEL not in (p.get("metadata", {}).get("labels") or {})
            and (p.get("status") or {}).get("phase") not in _DONE]


def _results(run_dir: Path, own: Path) -> dict[str, str]:
    """Every gate's verdict status in the run directory (the exit handler's own excluded)."""
    out: dict[str, str] = {}
    run = RunLayout(run_dir)
    try:
        files = run.verdict_files()
    except OSError:
        return out
    for f in files:
        if own in f.parents:
            continue
        try:
            out[run.relative(f)] = Verdict.read(f).status
        except CorruptVerdict:
            out[run.relative(f)] = "unreadable"
    return out


class ApiErrors:
    """API errors as data: what failed, and whether any was transient (worth Argo's retry)."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self.transient = False

    def guard(self, what: str, fn: Any, *a: Any, default: Any = None, **kw: Any) -> Any:
        """``fn(*a, **kw)``, or ``default`` with the error recorded."""
        try:
            return fn(*a, **kw)
        except TransientError as exc:
            self.transient = True
            self.items.append(f"{what}: {exc}")
        except Exception as exc:  # noqa: BLE001 - 403, NotOurs, a bug: recorded, the rest still runs
            self.items.append(f"{what}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        return default


def _replicas(kind: str, obj: dict[str, Any]) -> int:
    """Pods the object still asks for or has: a StatefulSet's replicas, a Job's active pods, 0 for a Service."""
    spec, st = obj.get("spec") or {}, obj.get("status") or {}
    if kind == "Job":
        return int(st.get("active") or 0)
    if kind == "StatefulSet":
        return max(int(spec.get("replicas") or 0), int(st.get("replicas") or 0))
    return 0


def cleanup(opts: ReleaseRequest, profile: Profile | None, out: Path) -> tuple[list[Check], dict[str, Any]]:
    """The run's logs, objects and verdicts under ``out``, then everything labelled with it released; never raises."""
    from gauntlet.steps.backends.kubernetes import run_id_from
    from gauntlet.steps.backends.kubernetes.api import connect
    from gauntlet.steps.backends.kubernetes.manager import Manager
    from gauntlet.steps.backends.argo import parse_failures

    ns = os.environ.get("GAUNTLET_NAMESPACE") or (profile.namespace if profile is not None else "gauntlet")
    out = Path(out)
    run_dir = Path(opts.run_dir) if opts.run_dir else Path(RunLayout.of_task(out, in_sequence=False).root)
    err = ApiErrors()
    base: dict[str, Any] = {"namespace": ns, "actions": [], "saved_logs": [], "objects": {},
            "workflow_status": opts.workflow_status}
    run_id = err.guard("run id", run_id_from, opts.run_id)
    api = err.guard("Kubernetes API", connect) if run_id else None
    if api is None:
        detail = "; ".join(err.items)
        return ([Check("released", "fail", "every labelled object released", None,
                       f"could not look for this run's objects: {detail}")],
                {**base, "run_id": run_id, "held": ["unknown: the run's objects could not be listed"],
                 "transient": err.transient, "errors": err.items})
    mgr = Manager(api, ns, run_id)
    r = release_run(mgr, out, err, wait_s=WAIT_S, before_release=lambda: err.guard(
        "results.json", write_json_atomic, out / "results.json", {
            "workflow_status": opts.workflow_status,
            "failures": parse_failures(opts.failures)[0],
            "verdicts": _results(run_dir, out)}))
    checks = [
        Check("evidence_saved", "pass", "every held pod's log", len(r.saved),
              f"saved {len(r.saved)} container log(s), {r.listed} object(s) and {len(_results(run_dir, out))} "
              "verdict(s)" if r.saved or r.listed else "nothing of this run left on the cluster: no logs to save"),
        r.check(f"nothing labelled {mgr.selector} in {ns}: already clean"),
    ]
    checks += [Check("api-error", "fail", "no API error", e, e) for e in err.items]
    return checks, {**base, "run_id": run_id, "actions": r.actions, "saved_logs": r.saved, "objects": r.final,
                    "held": r.held, "transient": err.transient, "errors": err.items}


@dataclass
class Released:
    """What releasing one run did: every object it had with its final replica count, what is still held."""

    final: dict[str, Any] = field(default_factory=dict)     # "Kind/name" -> replicas, or "deleted"
    held: list[str] = field(default_factory=list)
    actions: list[dict[str, str]] = field(default_factory=list)
    saved: list[str] = field(default_factory=list)
    listed: int = 0

    def summary(self) -> str:
        return ", ".join(f"{k} {v if v == 'deleted' else f'{v} replicas'}" for k, v in self.final.items())

    def check(self, clean: str) -> Check:
        what = self.summary()
        if self.held:
            detail = f"still held: {', '.join(self.held)}" + (f" (final: {what})" if what else "")
        else:
            detail = f"final replicas: {what}" if what else clean
        return Check("released", "fail" if self.held else "pass", {k: 0 for k in self.final}, self.final, detail)


def release_run(mgr: Any, out: Path, err: ApiErrors, wait_s: float = WAIT_S,
                before_release: Any = None) -> Released:
    """Logs and objects.json of one run under ``out``, then scale to 0 and delete what carries its label,
    wait up to ``wait_s`` for its pods to go, and say what is left. Every API error is recorded in
    ``err``; none stops the others. ``mgr`` is the run's :class:`gauntlet.steps.backends.kubernetes.manager.Manager`."""
    r = Released()

    def inventory() -> tuple[dict[str, list[dict[str, Any]] | None], list[dict[str, Any]] | None]:
        objs = {k: err.guard(f"list {k}", mgr.list, k, default=None) for k in KIND_ORDER}
        return objs, err.guard("list pods", mgr.pods, default=None)

    objects, pods = inventory()
    r.listed = sum(len(v or []) for v in objects.values())
    r.saved = _save_logs(mgr, held_pods(pods or []) + _finished_engine_pods(pods or []), out / "logs", err)
    err.guard("objects.json", write_json_atomic, out / "objects.json", {k: v or [] for k, v in objects.items()})
    if before_release is not None:
        before_release()
    for s in objects["StatefulSet"] or []:
        name = s["metadata"]["name"]
        if _replicas("StatefulSet", s) and err.guard(f"scale StatefulSet {name}", mgr.scale, name, 0):
            r.actions.append({"kind": "StatefulSet", "name": name, "action": "scaled to 0"})
    for kind in KIND_ORDER:
        for o in objects[kind] or []:
            name = o["metadata"]["name"]
            if err.guard(f"delete {kind} {name}", mgr.delete, kind, name):
                r.actions.append({"kind": kind, "name": name, "action": "deleted"})

    t0 = time.monotonic()
    left = held_pods(pods or [])
    while left and time.monotonic() - t0 < wait_s:
        time.sleep(POLL_S)
        now = err.guard("list pods", mgr.pods, default=None)
        if now is None:
            break
        left = held_pods(now)
    final, final_pods = inventory()
    for kind in KIND_ORDER:
        before = {o["metadata"]["name"] for o in objects[kind] or []}
        after = {o["metadata"]["name"]: o for o in final[kind] or []}
        for name in sorted(before | set(after)):
            if name in after:
                n = _replicas(kind, after[name])
                r.final[f"{kind}/{name}"] = n
                if n:
                    r.held.append(f"{kind}/{name}")
            else:
                r.final[f"{kind}/{name}"] = "deleted"
        if final[kind] is None:
            r.held.append(f"{kind}: could not be listed")
    for p in held_pods(final_pods or []):
        r.final[f"Pod/{p['metadata']['name']}"] = 1
        r.held.append(f"Pod/{p['metadata']['name']}")
    if final_pods is None:
        r.held.append("Pod: could not be listed")
    return r


def _finished_engine_pods(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Finished pods of the run's own objects (a crashed rank): their logs are evidence too."""
    return [p for p in pods if ARGO_POD_LABEL not in (p.get("metadata", {}).get("labels") or {})
            and (p.get("status") or {}).get("phase") in _DONE]


def _save_logs(mgr: Any, pods: list[dict[str, Any]], logs: Path, err: ApiErrors) -> list[str]:
    saved: list[str] = []
    if err.guard("logs directory", logs.mkdir, 0o755, True, True, default=False) is False:
        return saved
    for p in pods:
        name = p["metadata"]["name"]
        statuses = {cs.get("name"): cs for cs in ((p.get("status") or {}).get("containerStatuses") or [])}
        spec = p.get("spec") or {}
        for c in [c["name"] for c in spec.get("initContainers") or []] + [c["name"] for c in spec.get("containers") or []]:
            text = err.guard(f"log {name}/{c}", mgr.logs, name, c, default=None)
            if text is None:
                continue
            err.guard(f"write log {name}/{c}", (logs / f"{name}.{c}.log").write_text, text)
            saved.append(f"{name}.{c}")
            if int((statuses.get(c) or {}).get("restartCount") or 0):
                prev = err.guard(f"previous log {name}/{c}", mgr.logs, name, c, True, default="")
                err.guard(f"write log {name}/{c}", (logs / f"{name}.{c}.previous.log").write_text, prev)
    return saved
