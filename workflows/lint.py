"""Strict offline lint of rendered documents.

Argo documents are validated against their kind's definition in Argo v4.1.2's
JSON schema (vendored in ``workflows/schemas/``; ``$GAUNTLET_ARGO_SCHEMA`` overrides),
patched so IntOrString accepts integers and every object forbids unknown
properties; then the semantic rules Argo's own validator applies that a schema
cannot express. Kubernetes objects are validated with ``kubernetes-validate``.
Each finding names the document, the path and the rule.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from collections.abc import Iterable, Iterator

import yaml

from gauntlet.workflows import refs
from gauntlet.workflows.conditions import ExpressionError, check_when, depends_tasks

if TYPE_CHECKING:
    from gauntlet.params.models import Profile

__all__ = ["Finding", "lint_documents", "lint_paths", "lint_profile", "profile_rules", "print_findings", "schema_path",
           "K8S_VERSION"]

K8S_VERSION = "1.33.0"
ARGO_KINDS = {
    "WorkflowTemplate": "io.argoproj.workflow.v1alpha1.WorkflowTemplate",
    "CronWorkflow": "io.argoproj.workflow.v1alpha1.CronWorkflow",
    "Workflow": "io.argoproj.workflow.v1alpha1.Workflow",
    "ClusterWorkflowTemplate": "io.argoproj.workflow.v1alpha1.ClusterWorkflowTemplate",
}
_TASK_NAME = re.compile(r"^[a-zA-Z0-9][-a-zA-Z0-9]*$")
_ZERO_DIGEST = re.compile(r"@sha256:0{64}$")          # a placeholder, never an image
_GLOBAL_VARS = {"workflow.uid", "workflow.name", "workflow.namespace", "workflow.status", "workflow.failures",
                "workflow.serviceAccountName", "workflow.creationTimestamp", "workflow.duration",
                "workflow.mainEntrypoint", "workflow.priority", "workflow.scheduledTime",
                "workflow.parameters.json"}


@dataclass(frozen=True)
class Finding:
    doc: str
    path: str
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.doc}: {self.path}: [{self.rule}] {self.message}"


def schema_path() -> Path:
    env = os.environ.get("GAUNTLET_ARGO_SCHEMA")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent / "schemas" / "argo-v4.1.2.schema.json"


def _patch(node: Any) -> Any:
    """Forbid unknown properties everywhere; IntOrString accepts integers too."""
    if isinstance(node, dict):
        out = {k: _patch(v) for k, v in node.items()}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [_patch(v) for v in node]
    return node


@functools.lru_cache(maxsize=2)
def _validator(path: str) -> dict[str, Any]:   # kind -> its jsonschema validator
    import jsonschema
    schema = json.loads(Path(path).read_text())
    defs = _patch(copy.deepcopy(schema["definitions"]))
    defs["io.k8s.apimachinery.pkg.util.intstr.IntOrString"] = {"type": ["string", "integer"]}
    root = {"$schema": schema.get("$schema"), "definitions": defs}
    cls = jsonschema.validators.validator_for(root)
    return {kind: cls({**root, "$ref": f"#/definitions/{d}"}) for kind, d in ARGO_KINDS.items()}


def _fmt_path(parts: Iterable[Any]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(root)"


def _schema_findings(name: str, doc: dict[str, Any]) -> list[Finding]:
    kind = doc.get("kind")
    validators = _validator(str(schema_path()))
    if kind not in validators:
        return [Finding(name, "kind", "schema", f"unknown Argo kind {kind!r}")]
    found = []
    for err in sorted(validators[kind].iter_errors(doc), key=lambda e: list(map(str, e.absolute_path))):
        msg = err.message
        if err.validator == "additionalProperties":
            msg = f"unknown field(s): {msg.split('(')[-1].rstrip(')')}" if "(" in msg else msg
        found.append(Finding(name, _fmt_path(err.absolute_path), f"schema.{err.validator}", msg[:300]))
    return found


# --- semantic rules (what Argo's validator checks beyond the schema) --------------------------------------

def _depends_names(expr: str) -> list[str]:
    """The tasks a depends expression names; none when it does not parse (its own finding says so)."""
    try:
        return depends_tasks(expr)
    except ExpressionError:
        return []


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for d in sorted(edges.get(n, ())):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state:
                c = visit(d)
                if c:
                    return c
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(edges):
        if n not in state:
            c = visit(n)
            if c:
                return c
    return None


def _outputs_of(tmpl: dict[str, Any], by_name: dict[str, dict[str, Any]]) -> set[str]:
    outs = {p["name"] for p in tmpl.get("outputs", {}).get("parameters", []) or []}
    return outs


def _spec_findings(name: str, spec: dict[str, Any], base: str) -> list[Finding]:
    f: list[Finding] = []
    templates = spec.get("templates", []) or []
    by_name = {t.get("name"): t for t in templates}
    if len(by_name) != len(templates):
        f.append(Finding(name, f"{base}.templates", "unique-template-names", "template names are not unique"))
    wparams = {p["name"]: p for p in (spec.get("arguments", {}) or {}).get("parameters", []) or []}
    for pname, p in wparams.items():
        if p.get("enum") is not None and "value" in p and p["value"] not in p["enum"]:
            f.append(Finding(name, f"{base}.arguments.parameters.{pname}", "enum-default",
                             f"default {p['value']!r} is not one of its enum {p['enum']}"))
    entry = spec.get("entrypoint")
    if "workflowTemplateRef" not in spec:
        if entry not in by_name:
            f.append(Finding(name, f"{base}.entrypoint", "template-ref", f"entrypoint {entry!r} is not a template"))
        on_exit = spec.get("onExit")
        if on_exit is not None and on_exit not in by_name:
            f.append(Finding(name, f"{base}.onExit", "template-ref", f"onExit {on_exit!r} is not a template"))
    sync = spec.get("synchronization")
    if sync is not None:
        if "mutex" in sync or "semaphore" in sync:
            f.append(Finding(name, f"{base}.synchronization", "argo4-sync",
                             "singular mutex/semaphore was removed in Argo 4: use mutexes/semaphores lists"))
        if not sync.get("mutexes") and not sync.get("semaphores"):
            f.append(Finding(name, f"{base}.synchronization", "empty-sync",
                             "synchronization is empty (Hera's Synchronization(mutex=...) renders {})"))
    f += _volume_findings(name, f"{base}.volumes", spec.get("volumes"))
    for ti, t in enumerate(templates):
        tpath = f"{base}.templates[{ti}]"
        f += _volume_findings(name, f"{tpath}.volumes", t.get("volumes"))
        tname = t.get("name")
        inputs = {p["name"] for p in (t.get("inputs", {}) or {}).get("parameters", []) or []}
        for key in ("container", "script"):
            c = t.get(key)
            if c is not None and not c.get("image"):
                f.append(Finding(name, f"{tpath}.{key}.image", "image-required",
                                 f"template {tname!r} has a {key} without an image"))
            elif c is not None and "@sha256:" not in c["image"]:
                # also catches Hera's silent python:3.10 default for a Container without image
                f.append(Finding(name, f"{tpath}.{key}.image", "image-digest",
                                 f"template {tname!r} image {c['image']!r} is not pinned by digest"))
            elif c is not None and _ZERO_DIGEST.search(c["image"]):
                f.append(Finding(name, f"{tpath}.{key}.image", "image-digest",
                                 f"template {tname!r} image {c['image']!r} has an all-zero digest: a placeholder "
                                 "no registry serves"))
        for ii, ic in enumerate(t.get("initContainers", []) or []):
            if "@sha256:" not in (ic.get("image") or "") or _ZERO_DIGEST.search(ic.get("image") or ""):
                f.append(Finding(name, f"{tpath}.initContainers[{ii}].image", "image-digest",
                                 f"init container {ic.get('name')!r} image is not pinned by a real digest"))
        f += _ref_findings(name, tpath, t, inputs, wparams, tasks=None)
        if "dag" in t:
            f += _dag_findings(name, tpath, t, by_name, inputs, wparams)
    return f


def _volume_findings(name: str, base: str, volumes: Any) -> list[Finding]:
    """A hostPath must be absolute: a node has no working directory to resolve a relative one against."""
    f: list[Finding] = []
    for vi, v in enumerate(volumes or []):
        hp = (v.get("hostPath") or {}).get("path") if isinstance(v, dict) else None
        if hp is not None and not str(hp).startswith("/"):
            f.append(Finding(name, f"{base}[{vi}].hostPath.path", "hostpath-absolute",
                             f"volume {v.get('name')!r} hostPath {hp!r} is relative: use the node's absolute path"))
    return f


def _dag_findings(name: str, tpath: str, t: dict[str, Any], by_name: dict[str, Any], inputs: set[str],
                  wparams: dict[str, Any]) -> list[Finding]:
    f: list[Finding] = []
    tasks = t["dag"].get("tasks", []) or []
    names = [x.get("name") for x in tasks]
    task_by = {x.get("name"): x for x in tasks}
    edges: dict[str, set[str]] = {}
    for i, task in enumerate(tasks):
        p = f"{tpath}.dag.tasks[{i}]"
        tn = task.get("name", "")
        if not _TASK_NAME.match(tn or ""):
            f.append(Finding(name, f"{p}.name", "task-name", f"task name {tn!r} must match {_TASK_NAME.pattern}"))
        if names.count(tn) > 1:
            f.append(Finding(name, f"{p}.name", "unique-task-names", f"task {tn!r} appears twice"))
        if "depends" in task and "dependencies" in task:
            f.append(Finding(name, p, "depends-xor-dependencies", "a task may not mix depends and dependencies"))
        ref = task.get("template")
        if ref is not None and ref not in by_name:
            f.append(Finding(name, f"{p}.template", "template-ref", f"template {ref!r} does not exist"))
        try:
            depends_tasks(task.get("depends"))
        except ExpressionError as exc:
            f.append(Finding(name, f"{p}.depends", "depends-syntax", str(exc)))
        try:
            check_when(task.get("when"))
        except ExpressionError as exc:
            f.append(Finding(name, f"{p}.when", "when-syntax", str(exc)))
        deps = _depends_names(task.get("depends", "") or "") + list(task.get("dependencies", []) or [])
        for d in deps:
            if d not in task_by:
                f.append(Finding(name, f"{p}.depends", "depends-ref", f"depends names unknown task {d!r}"))
        edges[tn] = {d for d in deps if d in task_by}
        # arguments must match the called template's inputs
        called = by_name.get(ref)
        if called is not None:
            want = {q["name"] for q in (called.get("inputs", {}) or {}).get("parameters", []) or []
                    if "value" not in q and "default" not in q}
            given = {q["name"] for q in (task.get("arguments", {}) or {}).get("parameters", []) or []}
            for missing in sorted(want - given):
                f.append(Finding(name, f"{p}.arguments", "input-args",
                                 f"template {ref!r} needs input {missing!r} which the task does not pass"))
        f += _ref_findings(name, p, task, inputs, wparams, tasks=(task_by, by_name, _ancestors(tn, task_by)))
    cyc = _cycle(edges)
    if cyc:
        f.append(Finding(name, f"{tpath}.dag", "dag-cycle", "cycle: " + " -> ".join(cyc)))
    return f


def _ancestors(tn: str, task_by: dict[str, Any]) -> set[str]:
    seen: set[str] = set()
    todo = [tn]
    while todo:
        cur = todo.pop()
        t = task_by.get(cur) or {}
        for d in _depends_names(t.get("depends", "") or "") + list(t.get("dependencies", []) or []):
            if d in task_by and d not in seen:
                seen.add(d)
                todo.append(d)
    return seen


def _walk_strings(node: Any, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(node, str):
        yield path, node
    elif isinstance(node, dict):
        for k, v in node.items():
            yield from _walk_strings(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk_strings(v, f"{path}[{i}]")


def _ref_findings(name: str, base: str, node: dict[str, Any], inputs: set[str], wparams: dict[str, Any],
                  tasks: tuple[dict[str, Any], dict[str, Any], set[str]] | None) -> list[Finding]:
    f: list[Finding] = []
    scan = {k: v for k, v in node.items() if k != "dag"} if tasks is None else node
    for path, s in _walk_strings(scan, base):
        for ref in refs.find(s):
            braced = refs.braced(ref)
            if ref in _GLOBAL_VARS or ref.startswith(("item", "pod.", "node.", "retries", "lastRetry",
                                                       "steps.", "workflow.labels.", "workflow.annotations.",
                                                       "workflow.outputs.", "=")):
                continue
            if ref.startswith("workflow.parameters."):
                pn = ref.split(".", 2)[2]
                if pn not in wparams:
                    f.append(Finding(name, path, "param-ref", f"{braced}: no workflow parameter {pn!r}"))
            elif ref.startswith("inputs.parameters."):
                pn = ref.split(".", 2)[2]
                if pn not in inputs:
                    f.append(Finding(name, path, "param-ref", f"{braced}: the template has no input {pn!r}"))
            elif ref.startswith("inputs.artifacts."):
                continue
            elif ref.startswith("tasks."):
                parts = ref.split(".")
                if tasks is None:
                    f.append(Finding(name, path, "param-ref", f"{braced}: tasks.* only resolves in a DAG task"))
                    continue
                task_by, by_name, ancestors = tasks
                tn = parts[1]
                if tn not in task_by:
                    f.append(Finding(name, path, "param-ref", f"{braced}: no task {tn!r} in this DAG"))
                    continue
                if len(parts) >= 5 and parts[2] == "outputs" and parts[3] == "parameters":
                    called = by_name.get(task_by[tn].get("template"))
                    outs = _outputs_of(called, by_name) if called else set()
                    if parts[4] not in outs:
                        f.append(Finding(name, path, "output-ref",
                                         f"{braced}: task {tn!r} declares no output parameter {parts[4]!r}"))
                    if tn not in ancestors:
                        f.append(Finding(name, path, "output-ref",
                                         f"{braced}: task {tn!r} is not upstream of this task (add it to depends)"))
                elif parts[2:] == ["status"] and tn not in ancestors:
                    # Argo sets tasks.X.status for the task's ancestors only (dag.go buildLocalScopeFromTask) and
                    # refuses any other (validate.go validateDAGTaskArgumentDependency: "missing dependency")
                    f.append(Finding(name, path, "status-ref",
                                     f"{braced}: task {tn!r} is not upstream of this task (add it to depends)"))
            else:
                f.append(Finding(name, path, "param-ref", f"{braced}: unknown variable"))
    return f


def _argo_findings(name: str, doc: dict[str, Any]) -> list[Finding]:
    f = _schema_findings(name, doc)
    kind = doc.get("kind")
    if kind == "CronWorkflow":
        spec = doc.get("spec", {}) or {}
        if "schedule" in spec:
            f.append(Finding(name, "spec.schedule", "argo4-cron", "spec.schedule was removed in Argo 4: use schedules"))
        if not spec.get("schedules"):
            f.append(Finding(name, "spec.schedules", "cron-schedules", "a CronWorkflow needs at least one schedule"))
        f += _spec_findings(name, spec.get("workflowSpec", {}) or {}, "spec.workflowSpec")
    else:
        f += _spec_findings(name, doc.get("spec", {}) or {}, "spec")
    return f


def _k8s_findings(name: str, doc: dict[str, Any]) -> list[Finding]:
    import kubernetes_validate
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = _fmt_path(getattr(exc, "path", []) or [])
        return [Finding(name, path, "kubernetes-validate", str(getattr(exc, "message", exc))[:300])]
    except (kubernetes_validate.SchemaNotFoundError, kubernetes_validate.InvalidSchemaError) as exc:
        return [Finding(name, "kind", "kubernetes-validate", f"no schema for {doc.get('kind')}: {exc}"[:300])]
    return []


def lint_documents(named: list[tuple[str, Any]]) -> list[Finding]:
    """Lint (name, document) pairs; a document of an Argo kind goes to the Argo rules."""
    findings: list[Finding] = []
    for name, doc in named:
        if not isinstance(doc, dict):
            findings.append(Finding(name, "(root)", "document", "not a mapping"))
            continue
        label = f"{name}:{doc.get('kind', '?')}/{(doc.get('metadata') or {}).get('name', '?')}"
        api = str(doc.get("apiVersion", ""))
        if api.startswith("argoproj.io/"):
            findings += _argo_findings(label, doc)
        else:
            findings += _k8s_findings(label, doc)
    return findings


def lint_paths(paths: Iterable[Path]) -> list[Finding]:
    named: list[tuple[str, Any]] = []
    findings: list[Finding] = []
    for p in paths:
        p = Path(p)
        try:
            for doc in yaml.safe_load_all(p.read_text()):
                if doc is not None:
                    named.append((p.name, doc))
        except (OSError, yaml.YAMLError) as exc:
            findings.append(Finding(p.name, "(file)", "yaml", str(exc).splitlines()[0]))
    return findings + lint_documents(named)


def lint_profile(profile: Profile, *, allow_unverified: bool = False) -> list[Finding]:
    """Render the profile in memory and lint what it renders; a cluster profile pulling an image by a stand-in
    digest is refused first (render.refuse_unverified: RenderError, one line) unless ``allow_unverified``."""
    from gauntlet.workflows.render import refuse_unverified, render_documents
    if profile.hardware.kind != "kubernetes":
        return []           # validated on load; a local profile renders no Argo documents
    named: list[tuple[str, Any]] = []
    docs = render_documents(profile)
    refuse_unverified(profile, docs, allow=allow_unverified)
    for fname, doc in docs.items():
        for d in doc if isinstance(doc, list) else [doc]:
            named.append((fname, d))
    return lint_documents(named) + profile_rules(profile, named)


def profile_rules(profile: Profile, named: list[tuple[str, Any]]) -> list[Finding]:
    """What needs the profile beside its rendered documents: the runs volume's access mode, and that every
    pool pod of the WorkflowTemplate is pinned to the pool with its tolerations (workflows/placement_lint.py)."""
    from gauntlet.workflows.placement_lint import placement_problems, runs_volume_problems
    if profile.hardware.kind != "kubernetes":
        return []
    from gauntlet.steps.gates.network import rdma_access_problems
    found = [Finding(f"profile {profile.name}", *p) for p in runs_volume_problems(profile)]
    # an RDMA profile whose NCCL pods (engine, probe) would see /sys/class/infiniband but open no verbs device
    found += [Finding(f"profile {profile.name}", "hardware.fabric", "rdma-device", msg)
              for msg in rdma_access_problems(profile)]
    for name, doc in named:
        if isinstance(doc, dict) and doc.get("kind") == "WorkflowTemplate":
            label = f"{name}:WorkflowTemplate/{(doc.get('metadata') or {}).get('name', '?')}"
            found += [Finding(label, *p) for p in placement_problems(profile, doc)]
    return found


def print_findings(findings: list[Finding]) -> int:
    for fnd in findings:
        print(fnd, file=sys.stderr)
    if findings:
        print(f"lint: {len(findings)} finding(s)", file=sys.stderr)
        return 1
    print("lint: ok")
    return 0
