"""Gate 0, first of all: every workflow parameter the run was given is one it declares, with a value it allows;
and, on the cluster, the API server will admit the run's pods and holds the label policy.

Argo v4.0.5 does not enforce a WorkflowTemplate's ``enum`` on ``argo submit --from workflowtemplate``, and
keeps an undeclared ``-p name=value`` in the workflow's arguments (docs/cluster.md "Retrying, resubmitting,
stopping and deleting a run"). This step reads them all (``{{workflow.parameters.json}}``) and checks each
against the graph's own list (workflows/graph.py ``parameters``, passed as ``--allowed``): a bad one is a
:class:`UsageError` (exit 2) naming the parameter and what it allows, before any GPU is requested.

Then, through the back end (``ClusterInspector.admission_checks``, steps/backends/kubernetes/admission.py): the
namespace's ``pod-security.kubernetes.io/enforce`` level must admit the engine's pods (a failed check naming the
label: Pod Security would refuse them, and the Gate 0/1 step pods, after the run began), and the label policy's
binding must be there. It reads them as the ``admission`` role: three named objects, nothing else.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gauntlet.contract import Check, UsageError
from gauntlet.steps.gate import Needs
from gauntlet.steps.options import GateOptions, option

__all__ = ["NAME", "HELP", "NEEDS", "Options", "run", "RULES", "check_value"]

NAME = "params"
HELP = ("Gate 0, first: refuse an undeclared workflow parameter or a value it does not allow (exit 2); the "
        "namespace's Pod Security level and the label policy")
# it reads the namespace and the label policy's binding; never exits 75 (no retryStrategy: a retry-backoff this
# step refuses would be Argo's to parse), an API that does not answer is a failed check after a few tries
NEEDS = Needs(transient=False, api="admission")

# a base wait Argo's backoff and the local runner read alike: whole seconds, minutes or hours
_DURATION = re.compile(r"[0-9]{1,6}[smh]?")
_SCHEMES = ("file", "s3", "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss")
RULES = {
    "duration": "a whole number of seconds, minutes or hours (30s, 2m, 1h)",
    "uri": f"a path, or a URI of {', '.join(_SCHEMES)} without credentials",
    "path": "a path without spaces",
}


def _uri_ok(text: str) -> bool:
    from gauntlet.params.secrets import uri_credential
    if not text or any(c.isspace() for c in text) or uri_credential(text):
        return False
    return "://" not in text or text.split("://", 1)[0] in _SCHEMES


def check_value(name: str, rule: str, value: str) -> str | None:
    """Why ``value`` is not allowed for ``name`` under ``rule`` (``one-of:a|b``; ``list-of:a|b``: distinct
    allowed values separated by commas; or a key of RULES); None if it is."""
    if rule.startswith("one-of:"):
        allowed = rule.split(":", 1)[1].split("|")
        return None if value in allowed else f"one of {', '.join(allowed)}"
    if rule.startswith("list-of:"):
        allowed = rule.split(":", 1)[1].split("|")
        items = value.split(",")
        ok = all(i in allowed for i in items) and len(set(items)) == len(items)
        return None if ok else f"one of {', '.join(allowed)}, or several of them separated by commas"
    ok = {"duration": lambda: bool(_DURATION.fullmatch(value)), "uri": lambda: _uri_ok(value),
          "path": lambda: bool(value) and not any(c.isspace() for c in value)}[rule]()
    return None if ok else RULES[rule]


def _allowed(items: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        name, sep, rule = item.partition("=")
        if not sep or not (rule.startswith(("one-of:", "list-of:")) or rule in RULES):
            raise UsageError(f"--allowed {item!r}: NAME=one-of:a|b, NAME=list-of:a|b or NAME={'|'.join(RULES)}")
        out[name] = rule
    return out


def _given(text: str) -> dict[str, str]:
    try:
        doc = json.loads(text) if text.strip() not in ("", "null") else []
        pairs = [(p["name"], p.get("value")) for p in doc]
    except (ValueError, TypeError, KeyError):
        raise UsageError(f"--given {text[:80]!r}: not Argo's workflow.parameters.json (a list of "
                         "{name, value})") from None
    return {str(k): "" if v is None else str(v) for k, v in pairs}


@dataclass(frozen=True, kw_only=True)
class Options(GateOptions):
    given: str = option(help="every parameter the workflow was given, as Argo's {{workflow.parameters.json}}")
    allowed: tuple[str, ...] = option(nargs="+", metavar="NAME=RULE",
                                      help="each declared parameter and its rule: one-of:a|b, duration, uri, path")

    def __post_init__(self) -> None:
        super().__post_init__()
        allowed, given = _allowed(self.allowed), _given(self.given)
        for name, value in given.items():
            if name not in allowed:
                raise UsageError(f"parameter {name!r} is not a parameter of this workflow "
                                 f"(its parameters: {', '.join(sorted(allowed))})")
            why = check_value(name, allowed[name], value)
            if why is not None:
                raise UsageError(f"parameter {name}={value!r}: must be {why}")


def run(opts: Options, out: Path) -> tuple[list[Check], dict[str, Any]]:
    from gauntlet.steps.backends import backend_for, capability
    from gauntlet.steps.backends.protocol import ClusterInspector

    given = _given(opts.given)
    checks = [Check("parameters", "pass", detail=f"{len(given)} given, each declared and allowed")]
    inspector = capability(backend_for(opts.the_profile), ClusterInspector)
    if inspector is not None:       # locally nothing admits pods
        checks += inspector.admission_checks(opts.the_profile)
    return checks, {"parameters": given}
