"""Gate 2 on Kubernetes: server-side-apply the engine, wait until it really answers; teardown.

``deploy`` renders the engine's Services and StatefulSet (:mod:`gauntlet.steps.backends.kubernetes.manifests`),
applies them under one field manager (an Argo retry converges on the same objects), and
waits with the profile's ``ready_timeout_s``: every rank Running, then the leader's
``/health``, then a one-token completion through the client Service. It fails fast when
a pod exits, is OOM-killed, restarts, or cannot pull its image. Either way it keeps the
evidence: image digest, every rank's argv, env, nodes, start-up time, per-rank GPU
memory lines, every rank's log.

``teardown`` saves the logs, scales this run's StatefulSet of the engine to 0 and waits until
its pods (and so their GPUs) are gone: the baseline's (``!gauntlet.dev/variant``), or with
``--variant`` that variant's only (``gauntlet.dev/variant=<name>``), so releasing one never
touches the other (:func:`gauntlet.steps.backends.kubernetes.manifests.engine_selector`).

$GAUNTLET_READY_URL replaces the client Service URL for the readiness requests only
(kubectl port-forward from outside the cluster; the tests' fake engine).
"""

from __future__ import annotations

import os
import re
import shlex
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gauntlet.contract import Check, write_json_atomic
from gauntlet.params import load_images
from gauntlet.params.models import Profile
from gauntlet.steps.engines.commands import args_hash, context_of

if TYPE_CHECKING:
    from gauntlet.steps.backends.protocol import EngineRequest, StopRequest

__all__ = ["deploy", "deployed", "restart", "teardown", "ReadyOutcome", "wait_ready", "memory_lines", "POLL_S", "TEARDOWN_TIMEOUT_S"]

POLL_S = 10.0
TEARDOWN_TIMEOUT_S = 900
# what SGLang and vLLM log about the GPU memory each rank took
_MEM = re.compile(r"(mem usage=|avail mem=|Model loading took|KV cache memory|KV Cache is allocated|"
                  r"Memory profiling takes|GPU KV cache size)", re.IGNORECASE)


def memory_lines(log: str, limit: int = 20) -> list[str]:
    """The lines of an engine log that state GPU memory (weights, KV cache); the per-rank memory record."""
    return [ln.strip()[:300] for ln in log.splitlines() if _MEM.search(ln)][:limit]


@dataclass
class ReadyOutcome:
    ready: bool
    reason: str
    elapsed_s: float
    pods: list[dict[str, Any]] = field(default_factory=list)
    health_status: int | None = None
    generation: str | None = None
    stuck: bool = False             # a rank could not start (Unschedulable, image, config) for the grace


def _namespace(profile: Profile) -> str:
    return os.environ.get("GAUNTLET_NAMESPACE") or profile.namespace


def wait_ready(mgr: Any, selector: str, replicas: int, url: str, served_name: str, timeout_s: float,
               poll_s: float | None = None, owner: str | None = None) -> ReadyOutcome:
    """Poll until every rank runs and the leader answers /health and a one-token completion; fail fast.
    ``owner``: the StatefulSet, whose FailedCreate event says why a rank was never created (Pod Security
    admission refusing it, a quota): stuck after the same grace as a pod that cannot start."""
    import httpx

    from gauntlet.steps.backends.kubernetes.manager import pod_state
    from gauntlet.steps.backends.kubernetes.stuck import StuckWatch, refused
    from gauntlet.steps.client.http import EngineClient

    poll_s = POLL_S if poll_s is None else poll_s
    stuck_watch = StuckWatch()
    t0 = time.monotonic()
    last = "no pods yet"
    states: list[Any] = []
    health = None
    while time.monotonic() - t0 < timeout_s:
        pods = mgr.pods(selector)
        states = [pod_state(p) for p in pods]
        bad = [s for s in states if s.problem]
        if bad:
            return ReadyOutcome(False, "; ".join(f"{s.name}: {s.problem}" for s in bad), time.monotonic() - t0,
                                [asdict(s) for s in states])
        live = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
        why = refused(mgr, "StatefulSet", owner) if owner and len(live) < replicas else None
        stuck = stuck_watch.check(pods, {f"StatefulSet {owner}": why} if why else None)
        if stuck:
            return ReadyOutcome(False, f"cannot start: {stuck}", time.monotonic() - t0, [asdict(s) for s in states],
                                stuck=True)
        running = [s for s in states if s.phase == "Running"]
        if len(running) < replicas:
            last = f"{len(running)}/{replicas} ranks running ({', '.join(f'{s.name}={s.phase}' for s in states)})"
        else:
            try:
                with EngineClient(url, timeout_s=10) as leader:
                    r = leader.health()
                    health = r.status_code
                    if r.status_code == 200:
                        g = leader.post("/v1/completions", {"model": served_name, "prompt": "Hello", "max_tokens": 1,
                                                            "temperature": 0}, timeout=300)
                        if g.status_code == 200 and g.json().get("choices"):
                            return ReadyOutcome(True, "ready", time.monotonic() - t0, [asdict(s) for s in states],
                                                health, g.json()["choices"][0].get("text"))
                        last = f"/health 200 but /v1/completions answered {g.status_code}: {g.text[:200]}"
                    else:
                        last = f"/health answered {r.status_code}"
            except (httpx.HTTPError, ValueError) as exc:
                last = f"leader not answering yet: {type(exc).__name__}"
        time.sleep(poll_s)
    return ReadyOutcome(False, f"not ready after {timeout_s:.0f}s: {last}", time.monotonic() - t0,
                        [asdict(s) for s in states], health)


def _save_logs(mgr: Any, selector: str, out: Path) -> dict[str, dict[str, Any]]:
    """Every rank's log (and the previous instance's after a restart) under out/logs/; per-rank memory lines."""
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    ranks: dict[str, dict[str, Any]] = {}
    for p in mgr.pods(selector):
        name = p["metadata"]["name"]
        text = ""
        for c in [c["name"] for c in p["spec"].get("initContainers", [])] + [c["name"] for c in p["spec"]["containers"]]:
            t = mgr.logs(name, c)
            (logs / f"{name}.{c}.log").write_text(t)
            prev = mgr.logs(name, c, previous=True) if any(
                int(cs.get("restartCount") or 0) for cs in (p.get("status") or {}).get("containerStatuses") or []
                if cs.get("name") == c) else ""
            if prev:
                (logs / f"{name}.{c}.previous.log").write_text(prev)
            text += t
        ranks[name] = {"node": p["spec"].get("nodeName"), "gpu_memory": memory_lines(text)}
    return ranks


def deploy(opts: EngineRequest, out: Path) -> tuple[list[Check], dict[str, Any]]:
    from gauntlet.steps.backends.kubernetes import RUN_LABEL, run_id_from
    from gauntlet.steps.backends.kubernetes import manifests as M
    from gauntlet.steps.backends.kubernetes.api import connect
    from gauntlet.steps.backends.kubernetes.apply import apply
    from gauntlet.steps.backends.kubernetes.manager import Manager, NotOurs

    profile = opts.the_profile
    engine, variant = opts.engine, opts.variant or None
    spec = opts.engine_spec()
    run_id = run_id_from(opts.run_id)
    ns = _namespace(profile)
    image = load_images()[spec.image]
    objs = M.engine_objects(profile, engine, run_id, image.ref, spec, variant, node_env=opts.node_envs())
    for o in objs:
        o["metadata"]["namespace"] = ns
    names = M.engine_names(engine, run_id, variant)
    sts = objs[-1]
    replicas = sts["spec"]["replicas"]
    leader = f"{names['statefulset']}-0.{names['headless']}.{ns}.svc.cluster.local"
    argvs = M.rank_argvs(profile, engine, spec, leader)
    env = {e["name"]: e.get("value", "(from the pod)") for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]}
    endpoint = M.endpoint_url(profile, engine, run_id, variant).replace(f".{profile.namespace}.svc", f".{ns}.svc")
    write_json_atomic(out / "manifests.json", objs)
    record: dict[str, Any] = {"engine": engine, "variant": variant, "image": image.ref, "image_digest": image.digest,
              "image_version": image.version, "args_hash": args_hash(engine, spec), "argv_per_rank": argvs,
              "env": env, "endpoint": endpoint, "statefulset": names["statefulset"], "namespace": ns}
    write_json_atomic(out / "deploy.json", record)

    api = connect()
    mgr = Manager(api, ns, run_id)
    checks: list[Check] = []
    try:
        for o in objs:
            mgr.get(o["kind"], o["metadata"]["name"])     # refuses a same-named object that is not ours
    except NotOurs as exc:
        return [Check("names_free", "fail", "no foreign object under our names", str(exc),
                      f"{exc}; rename or remove it by hand (gauntlet never touches it)")], {"outputs": {"endpoint": ""}}
    t0 = time.monotonic()
    for o in objs:
        apply(api, o)
    checks.append(Check("applied", "pass", [o["kind"] for o in objs], [o["metadata"]["name"] for o in objs],
                        f"server-side applied {len(objs)} objects as field manager gauntlet (labelled {RUN_LABEL})"))
    selector = M.engine_selector(engine, variant)
    url = os.environ.get("GAUNTLET_READY_URL") or endpoint
    outcome = wait_ready(mgr, selector, replicas, url, profile.model.served_name, spec.ready_timeout_s,
                         owner=names["statefulset"])
    ranks = _save_logs(mgr, selector, out)
    if outcome.stuck:       # a rank that cannot start: give back what the others hold now, not at cleanup
        mgr.scale(names["statefulset"], 0)
        outcome.reason += f"; scaled {names['statefulset']} to 0"
    nodes = sorted({r["node"] for r in ranks.values() if r["node"]})
    want_nodes = sorted(n.name for n in profile.hardware.nodes)
    checks.append(Check("one_rank_per_node", "pass" if nodes == want_nodes and len(ranks) == replicas else "fail",
                        want_nodes, {k: v["node"] for k, v in ranks.items()},
                        f"{len(ranks)} ranks on {nodes}" if nodes == want_nodes
                        else f"ranks placed on {nodes}, want one on each of {want_nodes}"))
    checks.append(Check("ready", "pass" if outcome.ready else "fail", f"/health and 1 token within {spec.ready_timeout_s}s",
                        outcome.reason if not outcome.ready else f"{outcome.elapsed_s:.0f}s",
                        f"{engine} answered a one-token completion ({outcome.generation!r}) after "
                        f"{outcome.elapsed_s:.0f}s" if outcome.ready else f"{engine} not ready: {outcome.reason}; "
                        f"rank logs in {out / 'logs'}"))
    record.update({"startup_s": round(time.monotonic() - t0, 1), "ready": outcome.ready, "reason": outcome.reason,
                   "ranks": ranks, "pods": outcome.pods})
    write_json_atomic(out / "deploy.json", record)
    metrics = {"engine": engine, "variant": variant, "image": image.ref, "startup_s": record["startup_s"],
               "nodes": nodes, "ranks": ranks, "args_hash": record["args_hash"], "argv_per_rank": argvs,
               "outputs": {"endpoint": endpoint if outcome.ready else ""}}
    return checks, metrics


def _rank0_argv(script: str) -> list[str]:
    """Rank 0's argv from the launch script's ``0) exec ... ;;`` line (manifests._launch_script), as the API
    server stores it: every ``$`` doubled (manifests._literal), undone here."""
    for line in script.replace("$$", "$").splitlines():
        head, sep, rest = line.strip().partition(") exec ")
        if sep and head == "0":
            return shlex.split(rest.removesuffix(";;"))
    return []


def deployed(profile: Profile, engine: str, run_id: str | None) -> dict[str, Any] | None:
    """This run's baseline StatefulSet of ``engine`` as the API server has it (rank 0's argv, the context it
    serves, replicas), or None when there is none or it is scaled to 0."""
    from gauntlet.steps.backends.kubernetes import manifests as M
    from gauntlet.steps.backends.kubernetes import run_id_from
    from gauntlet.steps.backends.kubernetes.api import connect
    from gauntlet.steps.backends.kubernetes.manager import Manager

    rid = run_id_from(run_id)
    ns = _namespace(profile)
    name = M.engine_names(engine, rid)["statefulset"]
    sts = Manager(connect(), ns, rid).get("StatefulSet", name)
    if sts is None or not int(sts["spec"].get("replicas") or 0):
        return None
    command = sts["spec"]["template"]["spec"]["containers"][0].get("command") or []
    argv = _rank0_argv(command[-1]) if command else []
    return {"record": f"statefulset {ns}/{name}", "argv": argv, "context_length": context_of(engine, argv),
            "replicas": int(sts["spec"]["replicas"])}


def restart(opts: EngineRequest, out: Path) -> tuple[list[Check], dict[str, Any]]:
    """Restart the run's baseline engine with ``opts`` (Gate 5: another context), same names and Services.

    Every rank is stopped first (scale to 0, wait until the pods are gone): a rolling update would mix old
    and new ranks of one TP group. Then :func:`deploy` applies the new template and waits until it answers."""
    from gauntlet.steps.backends.kubernetes import manifests as M
    from gauntlet.steps.backends.kubernetes import run_id_from
    from gauntlet.steps.backends.kubernetes.api import connect
    from gauntlet.steps.backends.kubernetes.manager import Manager

    profile = opts.the_profile
    rid = run_id_from(opts.run_id)
    mgr = Manager(connect(), _namespace(profile), rid)
    name = M.engine_names(opts.engine, rid)["statefulset"]
    ours = re.compile(rf"{re.escape(name)}-\d+")

    def left() -> list[str]:
        return [p["metadata"]["name"] for p in mgr.pods(f"gauntlet.dev/component=engine,"
                                                         f"gauntlet.dev/engine={opts.engine}")
                if ours.fullmatch(p["metadata"]["name"])]

    t0 = time.monotonic()
    scaled = mgr.scale(name, 0)
    pods = left()
    while pods and time.monotonic() - t0 < TEARDOWN_TIMEOUT_S:
        time.sleep(POLL_S)
        pods = left()
    stopped = Check("ranks-stopped", "fail" if pods else "pass", "every rank gone before the new template",
                    pods, f"pods still present after {TEARDOWN_TIMEOUT_S}s: {pods}" if pods else
                    f"scaled {name} to 0{'' if scaled else ' (it did not exist)'}: every rank gone after "
                    f"{time.monotonic() - t0:.0f}s")
    stop_s = round(time.monotonic() - t0, 1)
    if pods:
        return [stopped], {"engine": opts.engine, "outputs": {"endpoint": ""}, "stop_s": stop_s}
    checks, metrics = deploy(opts, out)
    return [stopped, *checks], {**metrics, "stop_s": stop_s}


def teardown(opts: StopRequest, out: Path) -> tuple[list[Check], dict[str, Any]]:
    from gauntlet.steps.backends.kubernetes import run_id_from
    from gauntlet.steps.backends.kubernetes.api import connect
    from gauntlet.steps.backends.kubernetes.manager import Manager
    from gauntlet.steps.backends.kubernetes.manifests import engine_selector

    profile = opts.the_profile
    engine, variant = opts.engine, opts.variant or None
    what = f"{engine} variant {variant}" if variant else f"{engine} baseline"
    run_id = run_id_from(opts.run_id)
    mgr = Manager(connect(), _namespace(profile), run_id)
    selector = engine_selector(engine, variant)
    sets = mgr.list("StatefulSet", selector)
    if not sets:
        return [Check("scaled_to_zero", "pass", 0, [], f"no {what} StatefulSet of run {run_id}: nothing to stop")], \
            {"engine": engine, "variant": variant, "selector": selector, "stopped": []}
    ranks = _save_logs(mgr, selector, out)
    # released by an earlier teardown (Gate 6 frees the baseline before its variants): nothing runs, its
    # rank logs were saved by that task
    released = not ranks and all(int(s["spec"].get("replicas") or 0) == 0 for s in sets)
    stopped = []
    for s in sets:
        name = s["metadata"]["name"]
        if mgr.scale(name, 0):
            stopped.append(name)
    t0 = time.monotonic()
    left = mgr.pods(selector)
    while left and time.monotonic() - t0 < TEARDOWN_TIMEOUT_S:
        time.sleep(POLL_S)
        left = mgr.pods(selector)
    names = [p["metadata"]["name"] for p in left]
    done = (f"{', '.join(stopped)} already at 0 (released earlier; its rank logs are in that task's evidence)"
            if released else f"scaled {', '.join(stopped)} to 0")
    checks = [Check("scaled_to_zero", "pass", 0, {n: 0 for n in stopped}, done),
              Check("gpus_free", "fail" if left else "pass", [], names,
                    f"pods still present after {TEARDOWN_TIMEOUT_S}s: {names}" if left
                    else f"all {what} pods gone after {time.monotonic() - t0:.0f}s: their GPUs are free")]
    write_json_atomic(out / "teardown.json", {"selector": selector, "stopped": stopped, "ranks": ranks, "left": names})
    return checks, {"engine": engine, "variant": variant, "selector": selector, "stopped": stopped,
                    "logs_saved": sorted(ranks), "wait_s": round(time.monotonic() - t0, 1)}

