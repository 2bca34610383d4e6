"""Create or update the rendered templates on an Argo server (the one I/O half of rendering).

``--dry-run`` prints the exact ``argo``/``kubectl`` commands instead. RBAC and the
profile's ConfigMap (what every step pod reads) are applied with kubectl: Argo's API
takes neither. Two WorkflowTemplates (the qualification, submitted by hand, and the nightly, which the nightly
CronWorkflow submits) and the janitor's CronWorkflow beside the nightly's.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gauntlet.params.models import Profile
from gauntlet.contract import TransientError, UsageError
from gauntlet.workflows.lint import lint_paths, print_findings
from gauntlet.workflows.render import cron_name, janitor_name, render_profile, template_name

__all__ = ["submit", "commands"]


def commands(profile: Profile, out: Path, namespace: str) -> list[str]:
    """What a person would type: apply RBAC, create/update templates, start a run. Each command is an argv
    joined by shlex.join, so no name, path or namespace is ever read by the shell as more than one word."""
    wt = out / f"{template_name(profile)}.workflowtemplate.yaml"
    nightly = out / f"{template_name(profile, 'nightly')}.workflowtemplate.yaml"
    cron = out / f"{cron_name(profile)}.cronworkflow.yaml"
    rbac = out / f"{template_name(profile)}.rbac.yaml"
    config = out / f"{template_name(profile)}.profile.yaml"
    janitor = out / f"{janitor_name()}.cronworkflow.yaml"
    j = shlex.join

    def create_or_update(kind: str, path: Path) -> str:
        return f"{j(['argo', kind, 'create', '-n', namespace, str(path)])} || " \
               f"{j(['argo', kind, 'update', '-n', namespace, str(path)])}"

    return [
        j(["kubectl", "apply", "--server-side", "--field-manager=gauntlet", "-n", namespace, "-f", str(rbac),
           "-f", str(config)]),
        create_or_update("template", wt),
        create_or_update("template", nightly),
        create_or_update("cron", cron),
        create_or_update("cron", janitor),
        j(["argo", "submit", "-n", namespace, "--from", f"workflowtemplate/{template_name(profile)}",
           "-p", "engines=both", "--watch"]),
    ]


def submit(profile: Profile, *, out: Path, namespace: str | None = None, host: str | None = None,
           token: str | None = None, dry_run: bool = False, verify_ssl: bool = True,
           allow_unverified: bool = False) -> int:
    """`gauntlet submit`: render, lint, then create or update the templates on the Argo server at ``host``
    (a cluster profile pulling a stand-in image digest is refused unless ``allow_unverified``)."""
    namespace = namespace or profile.namespace
    paths = render_profile(profile, out, allow_unverified=allow_unverified)
    rc = print_findings(lint_paths(paths))
    if rc:
        return rc
    if dry_run:
        for c in commands(profile, out, namespace):
            print(c)
        return 0
    token = token or os.environ.get("ARGO_TOKEN")
    if not host:
        raise UsageError("submit: --host is required (or use --dry-run to print the argo commands)")
    import yaml
    from hera.exceptions import AlreadyExists, HeraException
    from hera.workflows import WorkflowsService
    from hera.workflows.models import (CreateCronWorkflowRequest, CronWorkflow, UpdateCronWorkflowRequest,
                                       WorkflowTemplate, WorkflowTemplateCreateRequest,
                                       WorkflowTemplateUpdateRequest)
    svc = WorkflowsService(host=host, token=token, namespace=namespace, verify_ssl=verify_ssl)
    by_name = {p.name: p for p in paths}
    wts = [WorkflowTemplate.model_validate(yaml.safe_load(by_name[f"{n}.workflowtemplate.yaml"].read_text()))
           for n in (template_name(profile), template_name(profile, "nightly"))]
    crons = [CronWorkflow.model_validate(yaml.safe_load(by_name[f"{n}.cronworkflow.yaml"].read_text()))
             for n in (cron_name(profile), janitor_name())]

    def create_or_update(kind: str, obj: Any, create: Callable[[Any], object], get: Callable[[str], Any],
                         update: Callable[[Any, str], object]) -> None:
        name = obj.metadata.name
        try:
            create(obj)
            print(f"created {kind}/{name}")
        except AlreadyExists:
            obj.metadata.resource_version = get(name).metadata.resource_version
            update(obj, name)
            print(f"updated {kind}/{name}")

    try:
        for wt in wts:
            create_or_update(
                "workflowtemplate", wt,
                lambda t: svc.create_workflow_template(WorkflowTemplateCreateRequest(template=t), namespace=namespace),
                lambda n: svc.get_workflow_template(n, namespace=namespace),
                lambda t, n: svc.update_workflow_template(n, WorkflowTemplateUpdateRequest(template=t),
                                                          namespace=namespace))
        for cron in crons:
            create_or_update(
                "cronworkflow", cron,
                lambda c: svc.create_cron_workflow(CreateCronWorkflowRequest(cron_workflow=c), namespace=namespace),
                lambda n: svc.get_cron_workflow(n, namespace=namespace),
                lambda c, n: svc.update_cron_workflow(n, UpdateCronWorkflowRequest(cron_workflow=c),
                                                      namespace=namespace))
    except HeraException as exc:
        raise UsageError(f"submit: Argo refused: {str(exc).splitlines()[0]}") from None
    except OSError as exc:
        raise TransientError(f"submit: cannot reach {host}: {exc}") from None
    print(f"RBAC and the profile's ConfigMap are not applied through Argo: {commands(profile, out, namespace)[0]}")
    print(f"start a run: {commands(profile, out, namespace)[-1]}")
    return 0
