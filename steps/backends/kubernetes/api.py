"""The one place that imports the kubernetes client: connect, call, translate errors.

Calls go through :func:`call`, which asks for the raw response (no model
deserialisation, so a partial object from the server or the test double never
breaks parsing) and turns the client's errors into the step contract's:
404 -> :class:`NotFound`, 409 -> :class:`Conflict`, 401/403 -> :class:`UsageError`
(RBAC or credentials: retrying will not help), 5xx/429/connection -> :class:`TransientError`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from gauntlet.contract import GauntletError, TransientError, UsageError

__all__ = ["Api", "NotFound", "Conflict", "connect", "call"]

APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"


class NotFound(GauntletError):
    """404: the object is not there (callers that expect it may be gone catch it)."""


class Conflict(GauntletError):
    """409: another field manager owns a field we apply."""


@dataclass
class Api:
    core: Any
    apps: Any
    batch: Any
    client: Any
    custom: Any = None          # CustomObjectsApi: Argo's workflows (the janitor)
    admission: Any = None       # AdmissionregistrationV1Api: the label policy and its binding (params)


def connect() -> Api:
    """$GAUNTLET_KUBE_API (a URL: kubectl proxy, the test double), else in-cluster, else ~/.kube/config."""
    from kubernetes import client, config

    url = os.environ.get("GAUNTLET_KUBE_API")
    if url:
        cfg = client.Configuration()
        cfg.host = url.rstrip("/")
        api_client = client.ApiClient(cfg)
    else:
        try:
            if os.environ.get("KUBERNETES_SERVICE_HOST"):
                config.load_incluster_config()
            else:
                config.load_kube_config()
        except Exception as exc:  # the config loaders raise several unrelated types
            raise UsageError(f"no Kubernetes API: not in a pod and no usable kubeconfig ({exc}); "
                             "run inside the cluster or set GAUNTLET_KUBE_API") from None
        api_client = client.ApiClient()
    return Api(client.CoreV1Api(api_client), client.AppsV1Api(api_client), client.BatchV1Api(api_client),
               api_client, client.CustomObjectsApi(api_client), client.AdmissionregistrationV1Api(api_client))


def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` on a generated API method; the JSON body (or text for logs) or a translated error."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    what = getattr(fn, "__name__", "call")
    try:
        resp = fn(*args, _preload_content=False, _request_timeout=60, **kwargs)
    except ApiException as exc:
        reason = _reason(exc)
        if exc.status == 404:
            raise NotFound(f"{what}: {reason}") from None
        if exc.status == 409:
            raise Conflict(f"{what}: {reason}") from None
        if exc.status in (401, 403):
            raise UsageError(f"{what}: {exc.status} {reason} (check the Role in steps/backends/kubernetes/rbac.py is bound)") \
                from None
        if exc.status == 422 or exc.status == 400:
            raise UsageError(f"{what}: {exc.status} {reason}") from None
        raise TransientError(f"{what}: {exc.status} {reason}") from None
    except (HTTPError, OSError) as exc:
        raise TransientError(f"{what}: Kubernetes API unreachable: {exc}") from None
    data = resp.data
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
    if what.endswith("_log"):
        return text
    return json.loads(text) if text.strip() else {}


def _reason(exc: Any) -> str:
    try:
        return json.loads(exc.body).get("message") or exc.reason
    except (TypeError, ValueError, AttributeError):
        return str(exc.reason)
