"""The exit handler: runs whatever happened, keeps the evidence, gives every resource of the run back.

It cannot refuse. Whatever its arguments (a malformed ``--workflow-status`` or
``--failures``, a profile that does not load, an API error on one object) it
first releases every object carrying the run's label, then records what it
could not parse or do as failed checks. Its exit code says only whether
something is still held afterwards: 0 nothing held (even with failed checks),
75 still held after a transient error (Argo retries it), 1 still held.

The back end (:func:`gauntlet.steps.backends.backend_for`) releases: locally
:func:`gauntlet.steps._deploy_local.cleanup` stops every engine process group of the run
(found by state file and by label) and confirms none is left; on Kubernetes
:func:`gauntlet.steps._cleanup_k8s.cleanup` saves logs first, then scales to 0 and deletes
only what carries the run's label.

``{{workflow.failures}}`` reaches the container as Argo's controller leaves it: the
JSON list passed through Go's ``strconv.Quote`` (workflow/controller/operator.go,
v4.0.5), so "nothing failed" is ``"null"`` with the quotes and a failure is a JSON
string literal whose content is the list. :func:`parse_failures` takes that form,
the bare JSON the local runner used to pass, and Go escapes JSON lacks.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gauntlet.contract import EXIT_FAIL, EXIT_PASS, EXIT_TRANSIENT, Check, Verdict
from gauntlet.steps import Needs
from gauntlet.steps.backends import BACKENDS, backend_for
from gauntlet.steps.options import GateOptions, option

NAME = "cleanup"
HELP = "exit handler: keep logs, stop/delete everything this run created (always runs, never refuses)"
# The step loads the profile itself: a profile that does not load must not stop the release.
NEEDS = Needs(profile=False, results_secret=True)
WORKFLOW_PHASES = ("Succeeded", "Failed", "Error")

__all__ = ["Options", "parse_failures", "parse_status", "go_unquote", "run", "exit_code"]


@dataclass(frozen=True, kw_only=True)
class Options(GateOptions):
    """Nothing is refused here: every value is judged after the release (see :func:`run`)."""

    # the step loads --profile itself (NEEDS.profile is False): a broken one is recorded, never refused
    profile_ref: str | None = option(None, flag="--profile",
                                     help="profile name or YAML path (a broken one is recorded)")
    workflow_status: str = option("Unknown", help="{{workflow.status}}: Succeeded, Failed or Error")
    failures: str = option("null", help="{{workflow.failures}}: Argo's quoted JSON list (\"null\" when nothing "
                                        "failed) or bare JSON")
    backend: str | None = option(None, choices=tuple(BACKENDS),
                                 help="default: the profile's hardware.kind (in a pod without a profile: kubernetes)")
    run_id: str | None = option(None, help="run id / workflow uid")
    run_dir: str | None = option(None, help="local run directory (default: the parent of --out)")


# ------------------------------------------------------------------ arguments, judged (pure)

_GO_ESC = re.compile(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[0-7]{3}|[abfnrtv\\'\"])")
_SIMPLE = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\", "'": "'",
           '"': '"'}


def go_unquote(text: str) -> str:
    """The string a Go double-quoted literal denotes (``strconv.Quote``'s output, which may use
    ``\\x``/``\\U`` escapes that JSON lacks). ValueError when it is not one."""
    if len(text) < 2 or text[0] != '"' or text[-1] != '"':
        raise ValueError("not a double-quoted string")
    body = text[1:-1]
    if re.search(r'(?<!\\)(?:\\\\)*"', body):
        raise ValueError("unescaped quote inside the literal")

    def sub(m: re.Match[str]) -> str:
        e = m.group(1)
        if e[0] in "xuU":
            return chr(int(e[1:], 16))
        if e[0].isdigit():
            return chr(int(e, 8))
        return _SIMPLE[e]
    rest = _GO_ESC.sub("", body)
    if "\\" in rest:
        raise ValueError("unknown escape")
    return _GO_ESC.sub(sub, body)


def parse_failures(text: str | None) -> tuple[list[dict[str, Any]], str | None]:
    """``({{workflow.failures}} as a list, problem)``; never raises.

    Accepts Argo's form (the JSON list through ``strconv.Quote``: ``"null"`` or
    ``"[{\\"displayName\\":...}]"``), bare JSON (``null``, ``[...]``) and empty. Anything
    else gives ``[]`` and a one-line problem naming what arrived.
    """
    raw = (text or "").strip()
    value: Any = raw
    for _ in range(3):                      # at most: Go-quoted -> JSON text -> list
        if not isinstance(value, str):
            break
        s = value.strip()
        if s in ("", "null"):
            return [], None
        try:
            value = json.loads(s)
        except ValueError:
            try:
                value = go_unquote(s)
            except ValueError:
                return [], f"--failures: expected Argo's {{{{workflow.failures}}}} (a JSON list, or null), got {raw[:80]!r}"
    if value is None:
        return [], None
    if not isinstance(value, list):
        return [], f"--failures: expected a JSON list, got {type(value).__name__}: {raw[:80]!r}"
    bad = [i for i, f in enumerate(value) if not isinstance(f, dict)]
    if bad:
        return [f for f in value if isinstance(f, dict)], f"--failures: entries {bad} are not objects"
    return value, None


def parse_status(text: str | None) -> tuple[str, str | None]:
    """``({{workflow.status}}, problem)``; an unexpected value is kept and named, never fatal."""
    s = (text or "").strip().strip('"')
    if s in WORKFLOW_PHASES:
        return s, None
    return s or "Unknown", f"--workflow-status: expected one of {', '.join(WORKFLOW_PHASES)}, got {text!r}"


# ------------------------------------------------------------------ the step

def _profile(opts: Options) -> tuple[Any, str | None]:
    if opts.profile is not None:
        return opts.profile, None
    if not opts.profile_ref:
        return None, "--profile: not given; falling back to the environment for backend and namespace"
    from gauntlet.params import ProfileError, load_profile
    try:
        return load_profile(opts.profile_ref), None
    except ProfileError as exc:
        return None, f"profile did not load ({str(exc).splitlines()[0][:300]}); released by label anyway"
    except Exception as exc:  # noqa: BLE001 - a broken image list or YAML library must not stop the release
        return None, f"profile did not load ({type(exc).__name__}: {exc}); released by label anyway"


def run(opts: Options, out: Path) -> tuple[list[Check], dict[str, Any]]:
    problems: list[str] = []
    profile, why = _profile(opts)
    if why:
        problems.append(why)
    failures, why = parse_failures(opts.failures)
    if why:
        problems.append(why)
    status, why = parse_status(opts.workflow_status)
    if why:
        problems.append(why)
    if opts.backend is not None and opts.backend not in BACKENDS:
        problems.append(f"--backend: expected one of {', '.join(BACKENDS)}, got {opts.backend!r}; chose by the profile")
    backend = backend_for(profile, opts.backend if opts.backend in BACKENDS else None)

    # release first: nothing above may stop it
    checks, metrics = backend.cleanup(opts, profile, out)
    checks += [Check("arguments", "fail", "valid arguments and profile", p, p) for p in problems]
    metrics.update(workflow_status=status, failures=failures, problems=problems, backend=backend.name)
    return checks, metrics


def exit_code(verdict: Verdict) -> int:
    """0 unless something is still held: 75 when a transient error may be why (Argo retries), else 1."""
    m = verdict.metrics
    if not m.get("held"):
        return EXIT_PASS
    return EXIT_TRANSIENT if m.get("transient") else EXIT_FAIL

