"""Render a profile's gate graph into Argo documents with Hera (pure, offline).

``render_documents(profile)`` returns plain dicts: the WorkflowTemplate, the
nightly CronWorkflow, the RBAC objects, the profile's ConfigMap and the janitor's
CronWorkflow. ``render_profile`` writes them as YAML (sorted keys, so the output
is byte-identical across runs). Submitting is a separate call (:mod:`gauntlet.workflows.submit`).

Only a ``hardware.kind: kubernetes`` profile renders: a local profile's paths and
images mean nothing to a cluster (:class:`RenderError`).

Every step pod reads the profile that was rendered, not whatever the step image
carries: the validated profile and the pinned image list travel in a ConfigMap
(``gauntlet-<profile>-profile``) mounted at :data:`PROFILE_DIR`, so
``gauntlet render --profile path/to/mine.yaml`` renders documents that run.

Evidence always stays on the runs PVC. The ``evidence`` output artifact is declared
only when the profile names an artifact repository (``artifact_repository``:
``default`` for the controller's default, or a ConfigMap name): without one Argo's
wait container fails to save it and the node ends in Error.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import yaml
from hera.workflows import (DAG, Artifact, Container, CronWorkflow, Parameter, RetryStrategy, Task, UserContainer,
                            WorkflowTemplate)
from hera.workflows import models as m

from gauntlet.steps import needs_of
from gauntlet.params import load_images
from gauntlet.params.loader import ImageRef
from gauntlet.params.models import Profile
from gauntlet.contract import EXIT_TRANSIENT, UsageError
from gauntlet.contract.layout import RunLayout, output_path
from gauntlet.steps.backends.kubernetes import RUN_LABEL
from gauntlet.workflows import refs
from gauntlet.workflows.graph import (DEFAULT_TIMEOUT_S, Dag, Graph, Need, RetryPolicy, Run, When, build_graph,
                                      dag_engine, output_default, retry_policy)
from gauntlet.workflows.graph import Task as GTask
from gauntlet.workflows.graph import image_key
from gauntlet.workflows.plan import window_reserve_s
from gauntlet.steps.window import RESERVE_ENV

__all__ = ["render_documents", "render_profile", "template_name", "cron_name", "janitor_name", "RenderError",
           "unverified_images", "refuse_unverified", "UNVERIFIED_ANNOTATION", "ALLOW_UNVERIFIED_ENV",
           "argo_depends", "argo_when",
           "RUN_LABEL", "RUN_KIND_LABEL", "nightly_deadline_s", "PROFILE_DIR", "JANITOR_SCHEDULE", "JANITOR_GRACE"]

ARGO_RUN_DIR = f"/runs/{refs.workflow('uid')}"
ARGO_LAYOUT = RunLayout(PurePosixPath(ARGO_RUN_DIR))
CODE_DIR = "/opt/gauntlet"          # where the step image keeps the project (app/ + deps/)
PROFILE_DIR = "/etc/gauntlet/profile"   # the rendered profile's ConfigMap, in every step pod
IMAGES_KEY = "images.yaml"              # the pinned image list beside it ($GAUNTLET_IMAGES)
JANITOR_SCHEDULE = "*/5 * * * *"
JANITOR_GRACE = "10m"
CONFIGMAP_MAX_BYTES = 1 << 20           # Kubernetes refuses a ConfigMap whose data is over 1 MiB
NAME_MAX = {"CronWorkflow": 52, "WorkflowTemplate": 63, "ConfigMap": 253}   # Argo's and Kubernetes' limits
HOSTNAME = "kubernetes.io/hostname"
# which run of the graph a template (and each workflow made from it) is: qualification or nightly
RUN_KIND_LABEL = "gauntlet.dev/run-kind"
# the annotation naming the images a rendered document pulls by a stand-in digest; the override of the refusal
UNVERIFIED_ANNOTATION = "gauntlet.dev/unverified-images"
ALLOW_UNVERIFIED_ENV = "GAUNTLET_ALLOW_UNVERIFIED_IMAGES"


class RenderError(UsageError):
    """The profile cannot become Argo documents that run; one line saying why and what to do."""


def template_name(profile: Profile, run: Run = "qualification") -> str:
    """The WorkflowTemplate of one run: ``gauntlet-<profile>`` (the qualification), ``gauntlet-<profile>-nightly``."""
    return f"gauntlet-{profile.name}" + ("-nightly" if run == "nightly" else "")


def cron_name(profile: Profile) -> str:
    return f"gauntlet-{profile.name}-nightly"


def janitor_name() -> str:
    return "gauntlet-janitor"


def profile_configmap_name(profile: Profile) -> str:
    return f"gauntlet-{profile.name}-profile"


def _out_dir(dag: Dag, task: GTask) -> str:
    return str(ARGO_LAYOUT.task_dir(task.name, dag_engine(dag.name, {i: str(refs.input_param(i)) for i in dag.inputs})))


def _localize(text: str, inputs: dict[str, str]) -> str:
    """Rewrite DAG-scope references in a container arg into the template's own inputs.

    `tasks.*` and a DAG's `inputs.*` only resolve in the DAG's task arguments, so each
    becomes an input parameter of the container template, passed by the task.
    """
    def sub(ref: refs.Ref) -> str | None:
        if ref == refs.parameter("run-dir"):
            return ARGO_RUN_DIR
        if ref.kind in ("parameter", "workflow"):
            return None
        name = ref.name if ref.kind == "input" else f"{ref.task}-{ref.name}"
        inputs[name] = str(ref)
        return str(refs.input_param(name))
    return refs.replace(text, sub)


def _step_image(profile: Profile, images: dict[str, ImageRef], task: GTask) -> tuple[str, bool]:
    """(image, in_engine_image), from the gate's NEEDS.image (graph.image_key): an engine image runs the
    project's code copied in by an init container."""
    ref = images[image_key(profile, task)]
    return ref.ref, ref.engine is not None


def _volumes(profile: Profile) -> list[m.Volume]:
    mdl = profile.model
    vols = [
        m.Volume(name="runs", persistent_volume_claim=m.PersistentVolumeClaimVolumeSource(claim_name=profile.runs_pvc)),
        m.Volume(name="model-cache", host_path=m.HostPathVolumeSource(path=mdl.host_cache_path, type="Directory")),
        m.Volume(name="model-cache-rw", host_path=m.HostPathVolumeSource(path=mdl.host_cache_path,
                                                                          type="DirectoryOrCreate")),
        m.Volume(name="gauntlet-code", empty_dir=m.EmptyDirVolumeSource()),
        m.Volume(name="profile", config_map=m.ConfigMapVolumeSource(name=profile_configmap_name(profile))),
    ]
    if mdl.source_path:
        vols.append(m.Volume(name="model-source", host_path=m.HostPathVolumeSource(path=mdl.source_path,
                                                                                    type="Directory")))
    return vols


def _mounts(profile: Profile, task: GTask) -> list[m.VolumeMount]:
    mdl = profile.model
    mounts = [m.VolumeMount(name="runs", mount_path="/runs"),
              m.VolumeMount(name="profile", mount_path=PROFILE_DIR, read_only=True)]
    needs = needs_of(task.step_name())
    if needs.model_cache == "read":
        mounts.append(m.VolumeMount(name="model-cache", mount_path=mdl.mount_path, read_only=True))
    if needs.model_cache == "write":
        mounts.append(m.VolumeMount(name="model-cache-rw", mount_path=mdl.host_cache_path))
        if mdl.source_path:
            mounts.append(m.VolumeMount(name="model-source", mount_path=mdl.source_path, read_only=True))
    return mounts


def _resources(profile: Profile, task: GTask) -> m.ResourceRequirements:
    req: dict[str, Any] = {"cpu": "1", "memory": "2Gi"}
    lim: dict[str, Any] = {"memory": "8Gi"}
    if needs_of(task.step_name()).size == "large":
        req, lim = {"cpu": "2", "memory": "2Gi"}, {"memory": "16Gi"}
    if needs_of(task.step_name()).node_gpus:
        gpus = str(profile.hardware.gpus_per_node)
        req = {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": gpus}
        lim = {"memory": "256Gi", "nvidia.com/gpu": gpus}
    return m.ResourceRequirements(requests={k: m.Quantity(v) for k, v in req.items()},
                                  limits={k: m.Quantity(v) for k, v in lim.items()})


def on_pool(task: GTask) -> bool:
    """Whether the task's pod belongs on the pool: it mounts the nodes' model cache, takes a node's GPUs or
    is pinned to one node. Such a pod is pinned to the pool and carries its tolerations; no other pod is."""
    needs = needs_of(task.step_name())
    return needs.model_cache is not None or needs.node_gpus or needs.per_node or task.node is not None


def _placement(profile: Profile, task: GTask) -> dict[str, Any]:
    """A pool pod's node affinity (its own node, else any of the profile's), tolerations and priority class.

    Its deadline must count the time it waits Pending: a pod's activeDeadlineSeconds runs from the pod's
    startTime, which the kubelet sets only once the pod is on a node, so an unschedulable pod never reaches
    it. Argo's template ``timeout`` is checked on the Pending node itself: executeTemplate calls
    checkTemplateTimeout(processedTmpl, node) before creating anything (workflow/controller/operator.go,
    v4.0.5 lines 2188-2195 and 2548-2566; v4.1.2 checkTemplateTimeouts, lines 2292-2307 and 2698-2724, which
    also deletes the pod) and fails the node once ``node.StartedAt + timeout`` passed while it is Pending.
    But with a retryStrategy the node it checks is the Retry node, created Running (operator.go v4.0.5
    line 2321) and left Running while its child is Pending (processNodeRetries, lines 996-999), so a retried
    template's ``timeout`` never fires. Hence render gives a gate that never exits 75 (``Needs.transient``
    False) no retryStrategy and ``timeout`` = its deadline (see _container). v4.0.5 re-checks at the next
    reconcile (a pod event or the workflow resync); v4.1.2 also requeues at the deadline.
    """
    if not on_pool(task):
        return {}
    if needs_of(task.step_name()).per_node and task.node is None:
        raise RenderError(f"task {task.name}: gate {task.step} runs once per node, but the task names no node")
    hw = profile.hardware
    nodes = [task.node] if task.node else [n.name for n in hw.nodes]
    term = m.NodeSelectorTerm(match_expressions=[m.NodeSelectorRequirement(key=HOSTNAME, operator="In",
                                                                           values=nodes)])
    out: dict[str, Any] = {"affinity": m.Affinity(node_affinity=m.NodeAffinity(
        required_during_scheduling_ignored_during_execution=m.NodeSelector(node_selector_terms=[term])))}
    if hw.tolerations:
        out["tolerations"] = [m.Toleration(**t.manifest()) for t in hw.tolerations]
    if hw.priority_class_name:
        out["priority_class_name"] = hw.priority_class_name
    return out


def _env() -> list[m.EnvVar]:
    return [
        m.EnvVar(name="GAUNTLET_RUN_ID", value=str(refs.workflow("uid"))),
        m.EnvVar(name="GAUNTLET_WORKFLOW", value=str(refs.workflow("name"))),
        m.EnvVar(name="GAUNTLET_NAMESPACE", value=str(refs.workflow("namespace"))),
        m.EnvVar(name="GAUNTLET_RESULTS_URI", value=str(refs.parameter("results-uri"))),
        m.EnvVar(name="NODE_NAME", value_from=m.EnvVarSource(field_ref=m.ObjectFieldSelector(field_path="spec.nodeName"))),
        m.EnvVar(name="PYTHONUNBUFFERED", value="1"),
        m.EnvVar(name="GAUNTLET_IMAGES", value=f"{PROFILE_DIR}/{IMAGES_KEY}"),
    ]


def _retry(policy: RetryPolicy | None) -> RetryStrategy | None:
    # Only a transient infrastructure error (exit 75) is retried; a failed verdict (exit 1) never is.
    # No backoff.maxDuration: Argo v4 counts it from the FIRST attempt's start and makes it the next
    # attempt's deadline (workflow/controller/operator.go processNodeRetries), so a step that exits 75
    # after it would never be retried and a retry would be killed early. Each attempt is bounded by the
    # template's activeDeadlineSeconds, the attempts by `limit`, the whole run by the workflow's deadline.
    # The base wait may be a workflow parameter: Argo substitutes global parameters into the template
    # (retryStrategy included) before processNodeRetries parses it (common.ProcessArgs).
    if policy is None:
        return None
    return RetryStrategy(limit=str(policy.limit), retry_policy="Always",
                         expression=f"asInt(lastRetry.exitCode) == {EXIT_TRANSIENT}",
                         backoff=m.Backoff(duration=policy.backoff, factor=str(policy.factor)))


def _container(profile: Profile, images: dict[str, ImageRef], dag: Dag, task: GTask,
               name: str) -> tuple[Container, dict[str, str]]:
    inputs: dict[str, str] = {}
    out = _out_dir(dag, task)
    argv = ["step", task.step_name(), "--profile", f"{PROFILE_DIR}/{profile.name}.yaml", "--out", out]
    argv += list(task.args)
    args = [_localize(a, inputs) for a in argv]
    image, in_engine = _step_image(profile, images, task)
    outputs: list[Parameter | Artifact] = [Parameter(name=o, value_from=m.ValueFrom(path=str(output_path(PurePosixPath(_localize(out, {})), o)),
                                                         default=output_default(o)))
               for o in ("verdict", *task.outputs)]
    if profile.artifact_repository is not None:
        outputs.append(Artifact(name="evidence", path=_localize(out, {}), optional=True))
    env = _env()
    if needs_of(task.step_name()).windowed:
        # the gate stops this long before Argo's deadline (ARGO_DEADLINE), so the release and the report run
        env.append(m.EnvVar(name=RESERVE_ENV, value=str(window_reserve_s(profile))))
    env_from = None
    if needs_of(task.step_name()).results_secret:
        # results-store credentials (e.g. AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY/AWS_ENDPOINT_URL)
        env_from = [m.EnvFromSource(secret_ref=m.SecretEnvSource(name="gauntlet-results", optional=True))]
    init: list[UserContainer | m.UserContainer] | None = None
    if in_engine:
        command = ["python3", "-m", "gauntlet.workflows.cli"]
        # app/lib/gauntlet holds links to app/{workflows,steps,params}: the `gauntlet.*` namespace
        # without installing anything into the engine image (images/steps/Dockerfile)
        env.append(m.EnvVar(name="PYTHONPATH", value=f"{CODE_DIR}/app/lib"))
        init = [m.UserContainer(name="gauntlet-code", image=images["steps"].ref,
                                command=["cp", "-a", f"{CODE_DIR}/app", "/code/app"],
                                volume_mounts=[m.VolumeMount(name="gauntlet-code", mount_path="/code")])]
    else:
        command = ["gauntlet"]
    deadline = task.timeout_s or DEFAULT_TIMEOUT_S
    policy = retry_policy(task)
    mounts = _mounts(profile, task)
    if in_engine:
        mounts.append(m.VolumeMount(name="gauntlet-code", mount_path=CODE_DIR))
    c = Container(
        name=name,
        image=image,
        image_pull_policy="IfNotPresent",
        command=command,
        args=args,
        env=env,
        env_from=env_from,
        inputs=[Parameter(name=k) for k in sorted(inputs)],
        outputs=outputs,
        volume_mounts=mounts,
        resources=_resources(profile, task),
        retry_strategy=_retry(policy),
        init_containers=init,
        active_deadline_seconds=deadline,
        timeout=None if policy is not None else f"{deadline}s",
        **_placement(profile, task),
        labels={"gauntlet.dev/gate": task.gate or "none", "gauntlet.dev/step": task.step or ""},
        service_account_name=_account(profile, task.step_name()),
        pod_spec_patch=('{"hostNetwork": true, "dnsPolicy": "ClusterFirstWithHostNet"}'
                        if needs_of(task.step_name()).host_network else None),
    )
    return c, inputs


def _account(profile: Profile, step: str) -> str | None:
    """The service account of the step's API role (its ``NEEDS.api``): each pod holds only what its gate calls."""
    from gauntlet.steps.backends import BACKENDS, require
    from gauntlet.steps.backends.protocol import Access
    return require(BACKENDS["kubernetes"], Access, "render").account(profile, needs_of(step).api)


def argo_depends(needs: tuple[Need, ...]) -> str | None:
    """A task's needs as Argo's ``depends``: ``a.Succeeded && (b.Succeeded || b.Skipped)``; None for none.

    A need of several phases is parenthesized, except the lone need of a task that runs on its
    upstream's failure too (``regress.Succeeded || regress.Failed``): the form these documents have
    always had (tests/golden). Argo reads both forms alike.
    """
    def term(n: Need) -> str:
        text = " || ".join(f"{n.task}.{p}" for p in n.phases)
        return f"({text})" if len(n.phases) > 1 and (len(needs) > 1 or "Skipped" in n.phases) else text
    return " && ".join(term(n) for n in needs) or None


def argo_when(when: When | None) -> str | None:
    """A condition as Argo's ``when`` (govaluate): a bool compared unquoted, text quoted, one-of as a regex
    anchored on each comma-separated item (``sglang,vllm`` matches sglang and vllm; ``sglangx`` nothing)."""
    if when is None:
        return None
    if isinstance(when.value, bool):
        return f"{when.subject} == {'true' if when.value else 'false'}"
    if when.op == "one-of":
        return f"'{when.subject}' =~ '(^|,)({'|'.join(when.value)})(,|$)'"
    return f"'{when.subject}' == '{when.value}'"


def _dag(profile: Profile, images: dict[str, ImageRef], dag: Dag, prefix: str) -> tuple[DAG, list[Container]]:
    containers: list[Container] = []
    tasks: list[Task | m.DAGTask] = []
    for t in dag.tasks:
        depends, when = argo_depends(t.depends), argo_when(t.when)
        if t.dag:
            args = [Parameter(name=k, value=v) for k, v in sorted(t.inputs.items())]
            tasks.append(Task(name=t.name, template=t.dag, arguments=args, depends=depends, when=when))
            continue
        tname = f"{prefix}{t.name}"
        c, inputs = _container(profile, images, dag, t, tname)
        containers.append(c)
        args = [Parameter(name=k, value=v) for k, v in sorted(inputs.items())]
        tasks.append(Task(name=t.name, template=tname, arguments=args or None, depends=depends, when=when))
    params = [Parameter(name=i) for i in dag.inputs] or None
    return DAG(name=dag.name, tasks=tasks, inputs=params), containers


def _rbac(profile: Profile) -> list[dict[str, Any]]:
    from gauntlet.steps.backends import BACKENDS, require
    from gauntlet.steps.backends.protocol import Access
    return require(BACKENDS["kubernetes"], Access, "render").access_manifests(profile)


def _profile_configmap(profile: Profile, images: dict[str, ImageRef]) -> dict[str, Any]:
    """The validated profile and the pinned image list, as every step pod reads them (PROFILE_DIR)."""
    pinned = {"images": {k: v.model_dump(mode="json") for k, v in sorted(images.items())}}
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": profile_configmap_name(profile), "namespace": profile.namespace,
                         "labels": {"app.kubernetes.io/part-of": "gauntlet", "gauntlet.dev/profile": profile.name}},
            "data": {f"{profile.name}.yaml": dump_yaml(profile.model_dump(mode="json")),
                     IMAGES_KEY: dump_yaml(pinned)}}


def _template(profile: Profile, graph: Graph, images: dict[str, ImageRef]) -> WorkflowTemplate:
    templates: list[Any] = []
    main, cs = _dag(profile, images, graph.main, "")
    templates += [main, *cs]
    for seq in graph.sequences:
        d, cs = _dag(profile, images, seq, "seq-")
        templates += [d, *cs]
    exit_c, exit_inputs = _container(profile, images, graph.main, graph.exit_handler, "cleanup")
    assert not exit_inputs, "the exit handler takes only workflow-scope values"
    templates.append(exit_c)
    params = [Parameter(name=k, value=v[0], enum=list(v[1]) if v[1] else None, description=v[2])
              for k, v in graph.parameters.items() if k != "run-dir"]
    labels = {"app.kubernetes.io/part-of": "gauntlet", "gauntlet.dev/profile": profile.name}
    nightly = graph.run == "nightly"
    what = (f"the scheduled regression run of {profile.name} (Gate 0, Gate 1, smoke, Gate 4 on nightly.cases, "
            f"regress; {profile.nightly.window_h:g} h window)" if nightly else "")
    return WorkflowTemplate(
        name=template_name(profile, graph.run),
        namespace=profile.namespace,
        labels={**labels, RUN_KIND_LABEL: graph.run},
        annotations={"workflows.argoproj.io/description": what or profile.description or profile.name},
        entrypoint="main",
        on_exit="cleanup",
        arguments=params,
        templates=templates,
        service_account_name=profile.service_account,
        # the nightly's window is its deadline: a night that outlives it fails and its exit handler releases the
        # GPUs before the next night (the pool's mutex: a nightly and a qualification never hold it together)
        active_deadline_seconds=nightly_deadline_s(profile) if nightly else profile.active_deadline_s,
        synchronization=m.Synchronization(mutexes=[m.Mutex(name=f"gauntlet-{profile.hardware.node_pool}")]),
        pod_gc=m.PodGC(strategy="OnWorkflowSuccess"),
        ttl_strategy=m.TTLStrategy(seconds_after_success=7 * 86400, seconds_after_failure=14 * 86400),
        pod_metadata=m.Metadata(labels={RUN_LABEL: str(refs.workflow("uid")), **labels}),
        workflow_metadata=m.WorkflowMetadata(labels={**labels, RUN_KIND_LABEL: graph.run}),
        volumes=_volumes(profile),
        artifact_repository_ref=(m.ArtifactRepositoryRef(config_map=profile.artifact_repository)
                                 if profile.artifact_repository not in (None, "default") else None),
    )


def _cron(profile: Profile, graph: Graph) -> CronWorkflow:
    labels = {"app.kubernetes.io/part-of": "gauntlet", "gauntlet.dev/profile": profile.name}
    return CronWorkflow(
        name=cron_name(profile),
        namespace=profile.namespace,
        labels=labels,
        schedules=[profile.nightly.schedule],
        timezone=profile.timezone,
        concurrency_policy="Forbid",
        starting_deadline_seconds=3600,
        successful_jobs_history_limit=14,
        failed_jobs_history_limit=30,
        workflow_template_ref=m.WorkflowTemplateRef(name=template_name(profile, "nightly")),
        arguments=[Parameter(name="engines", value=graph.parameters["engines"][0])],
        workflow_metadata=m.WorkflowMetadata(labels={**labels, "gauntlet.dev/nightly": "true",
                                                     RUN_KIND_LABEL: graph.run}),
    )


def _janitor(profile: Profile, images: dict[str, ImageRef]) -> CronWorkflow:
    """Every few minutes: release what labelled runs left behind once their workflow is gone or long
    finished (`argo terminate` skips the exit handler; a controller restart or a lost pod can too)."""
    janitor_account = _account(profile, "janitor")
    labels = {"app.kubernetes.io/part-of": "gauntlet"}
    out = f"/runs/janitor/{refs.workflow('name')}"
    c = Container(
        name="janitor", image=images[profile.step_image].ref, image_pull_policy="IfNotPresent",
        command=["gauntlet"],
        args=["step", "janitor", "--out", out, "--grace", str(refs.parameter("grace"))],
        env=[m.EnvVar(name="GAUNTLET_NAMESPACE", value=str(refs.workflow("namespace"))),
             m.EnvVar(name="PYTHONUNBUFFERED", value="1")],
        volume_mounts=[m.VolumeMount(name="runs", mount_path="/runs")],
        resources=m.ResourceRequirements(requests={"cpu": m.Quantity("100m"), "memory": m.Quantity("256Mi")},
                                         limits={"memory": m.Quantity("1Gi")}),
        outputs=[Parameter(name="verdict", value_from=m.ValueFrom(path=str(output_path(PurePosixPath(out), "verdict")),
                                                                  default=output_default("verdict")))],
        active_deadline_seconds=900,
    )
    return CronWorkflow(
        name=janitor_name(), namespace=profile.namespace, labels=labels,
        schedules=[JANITOR_SCHEDULE], concurrency_policy="Forbid", starting_deadline_seconds=300,
        successful_jobs_history_limit=3, failed_jobs_history_limit=10,
        entrypoint="janitor", templates=[c], service_account_name=janitor_account,
        arguments=[Parameter(name="grace", value=JANITOR_GRACE,
                             description="release a run's objects once its workflow finished this long ago")],
        volumes=[m.Volume(name="runs", persistent_volume_claim=m.PersistentVolumeClaimVolumeSource(
            claim_name=profile.runs_pvc))],
        pod_gc=m.PodGC(strategy="OnPodSuccess"),
        ttl_strategy=m.TTLStrategy(seconds_after_success=3600, seconds_after_failure=7 * 86400),
        workflow_metadata=m.WorkflowMetadata(labels={**labels, "gauntlet.dev/janitor": "true"}),
    )


def _refuse_unrunnable(profile: Profile) -> None:
    if profile.hardware.kind != "kubernetes":
        raise RenderError(f"profile {profile.name} has hardware.kind {profile.hardware.kind!r}: Argo documents "
                          f"only for a kubernetes profile (run this one with `gauntlet run --profile {profile.name}`)")


def nightly_deadline_s(profile: Profile) -> int:
    """The nightly's activeDeadlineSeconds: its window."""
    return int(round(profile.nightly.window_h * 3600))


def _refuse_short_deadlines(profile: Profile, graph: Graph, images: dict[str, ImageRef]) -> None:
    """A task or run whose plan does not fit its deadline, or a nightly over its window or GPU-hour budget:
    RenderError, one line (workflows/plan.py too_short)."""
    from gauntlet.workflows.plan import image_fixes, plan_graph, too_short
    why = too_short(plan_graph(graph, profile, "argo", image_fixes(profile, images)))
    if why is not None:
        raise RenderError(why)


def render_documents(profile: Profile, images: dict[str, ImageRef] | None = None) -> dict[str, Any]:
    """File name -> document (or list of documents) for one kubernetes profile; RenderError otherwise."""
    _refuse_unrunnable(profile)
    images = load_images() if images is None else images
    graph = build_graph(profile, "argo")
    nightly = build_graph(profile, "argo", "nightly")
    _refuse_short_deadlines(profile, graph, images)
    _refuse_short_deadlines(profile, nightly, images)
    docs: dict[str, Any] = {
        f"{template_name(profile)}.workflowtemplate.yaml": _template(profile, graph, images).to_dict(),
        f"{template_name(profile, 'nightly')}.workflowtemplate.yaml": _template(profile, nightly, images).to_dict(),
        f"{cron_name(profile)}.cronworkflow.yaml": _cron(profile, nightly).to_dict(),
        f"{template_name(profile)}.rbac.yaml": _rbac(profile),
        f"{template_name(profile)}.profile.yaml": _profile_configmap(profile, images),
        f"{janitor_name()}.cronworkflow.yaml": _janitor(profile, images).to_dict(),
    }
    _record_unverified(docs, images)
    _refuse_oversized(docs)
    return docs


def _images_of(node: Any) -> Iterator[str]:
    """Every container's and init container's ``image`` in a rendered document."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "image" and isinstance(v, str):
                yield v
            else:
                yield from _images_of(v)
    elif isinstance(node, list):
        for v in node:
            yield from _images_of(v)


def _record_unverified(docs: dict[str, Any], images: dict[str, ImageRef]) -> None:
    """Each document that pulls an image whose digest is a stand-in (params/images.yaml ``verified: false``)
    names those images' keys in its annotation :data:`UNVERIFIED_ANNOTATION`, so the template says so
    wherever it is read (the Argo UI, ``kubectl get -o yaml``, :func:`unverified_images`)."""
    by_ref = {ref.ref: key for key, ref in images.items()}
    for doc in docs.values():
        for d in doc if isinstance(doc, list) else [doc]:
            keys = sorted({by_ref[i] for i in _images_of(d) if i in by_ref and not images[by_ref[i]].verified})
            if keys:
                d.setdefault("metadata", {}).setdefault("annotations", {})[UNVERIFIED_ANNOTATION] = ",".join(keys)


def unverified_images(docs: dict[str, Any]) -> list[str]:
    """The image keys the rendered documents pull with a stand-in digest (their :data:`UNVERIFIED_ANNOTATION`)."""
    keys = {k for doc in docs.values() for d in (doc if isinstance(doc, list) else [doc]) if isinstance(d, dict)
            for k in ((d.get("metadata") or {}).get("annotations") or {}).get(UNVERIFIED_ANNOTATION, "").split(",") if k}
    return sorted(keys)


def refuse_unverified(profile: Profile, docs: dict[str, Any], *, allow: bool) -> None:
    """A ``cluster`` profile's documents that pull a stand-in digest are refused (RenderError, exit 2, one line)
    unless ``allow`` (``--allow-unverified-images`` or ``$GAUNTLET_ALLOW_UNVERIFIED_IMAGES=1``): the pods would
    pull whatever the internal registry holds under that digest, if anything. A ``test`` profile renders them."""
    keys = unverified_images(docs)
    if keys and profile.purpose == "cluster" and not (allow or os.environ.get(ALLOW_UNVERIFIED_ENV) == "1"):
        raise RenderError(f"profile {profile.name} (purpose: cluster) pulls images whose digests are not verified: "
                          f"{', '.join(keys)} (params/images.yaml verified: false); re-pin them (docs/cluster.md, "
                          f"\"Pinning the images\") or pass --allow-unverified-images to render them anyway, recorded "
                          f"in the template's {UNVERIFIED_ANNOTATION} annotation")


def _refuse_oversized(docs: dict[str, Any]) -> None:
    """What Kubernetes or Argo would refuse at submit time, refused here: a name over its kind's limit, a
    ConfigMap over 1 MiB (the profile models bound both; this is the last word before a file is written)."""
    for fname, doc in docs.items():
        for d in doc if isinstance(doc, list) else [doc]:
            kind, name = d.get("kind", ""), d.get("metadata", {}).get("name", "")
            if len(name) > NAME_MAX.get(kind, 253):
                raise RenderError(f"{fname}: {kind} name {name[:40]!r}... is {len(name)} characters, over "
                                  f"the {NAME_MAX.get(kind, 253)} Kubernetes/Argo accept")
            if kind == "ConfigMap":
                size = sum(len(k.encode()) + len(v.encode()) for k, v in d.get("data", {}).items())
                if size > CONFIGMAP_MAX_BYTES:
                    raise RenderError(f"{fname}: ConfigMap {name} holds {size:,} bytes, over the 1 MiB "
                                      f"({CONFIGMAP_MAX_BYTES:,} bytes) Kubernetes accepts: shorten the profile")


def dump_yaml(doc: Any) -> str:
    """Deterministic YAML: sorted keys, block style, one document or a multi-document stream."""
    docs = doc if isinstance(doc, list) else [doc]
    return "---\n".join(yaml.safe_dump(d, sort_keys=True, default_flow_style=False, width=120) for d in docs)


def render_profile(profile: Profile, out: Path, *, allow_unverified: bool = False) -> list[Path]:
    """Write the documents into ``out``; nothing is written for a profile :func:`refuse_unverified` refuses."""
    out = Path(out)
    docs = render_documents(profile)
    refuse_unverified(profile, docs, allow=allow_unverified)
    out.mkdir(parents=True, exist_ok=True)
    root = out.resolve()
    paths = []
    for name, doc in docs.items():
        p = out / name
        # names come from the validated profile name; still, never a path, and never through a link out of --out
        if Path(name).name != name or name in (".", "..") or p.resolve().parent != root:
            raise RenderError(f"{name!r}: a rendered file name must be a plain file name inside {out}")
        p.write_text(dump_yaml(doc))
        paths.append(p)
    return paths
