"""The exit handler: runs whatever happened, keeps the evidence, gives every resource of the run back.

It cannot refuse. Whatever its arguments (a malformed ``--workflow-status`` or
``--failures``, a profile that does not load, an API error on one object) it
first releases every object carrying the run's label, then records what it
could not parse or do as failed checks. Its exit code says only whether
something is still held afterwards: 0 nothing held (even with failed checks),
75 still held after a transient error (Argo retries it), 1 still held.

Local back end: :func:`gauntlet.steps._deploy_local.stop_all` stops every engine process
group of the run (found by state file and by label) and the step confirms none
is left. Kubernetes: :func:`gauntlet.steps._cleanup_k8s.cleanup` (logs first, then scale
to 0 and delete only what carries the run's label).

``{{workflow.failures}}`` reaches the container as Argo's controller leaves it: the
JSON list passed through Go's ``strconv.Quote`` (workflow/controller/operator.go,
v4.0.5), so "nothing failed" is ``"null"`` with the quotes and a failure is a JSON
string literal whose content is the list. :func:`parse_failures` takes that form,
the bare JSON the local runner used to pass, and Go escapes JSON lacks.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from pathlib import Path
from typing import Any

from gauntlet.steps import Needs
from gauntlet.contract import EXIT_FAIL, EXIT_PASS, EXIT_TRANSIENT, Check, Verdict

NAME = "cleanup"
HELP = "exit handler: keep logs, stop/delete everything this run created (always runs, never refuses)"
# The step loads the profile itself: a profile that does not load must not stop the release.
NEEDS = Needs(profile=False, results_secret=True)
WORKFLOW_PHASES = ("Succeeded", "Failed", "Error")

__all__ = ["parse_failures", "parse_status", "go_unquote", "run", "exit_code"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    try:        # the CLI adds --profile only for steps whose runner loads it; a caller may have added it
        p.add_argument("--profile", default=None, help="profile name or YAML path (a broken one is recorded)")
    except argparse.ArgumentError:
        pass
    p.add_argument("--workflow-status", default="Unknown", help="{{workflow.status}}: Succeeded, Failed or Error")
    p.add_argument("--failures", default="null",
                   help="{{workflow.failures}}: Argo's quoted JSON list (\"null\" when nothing failed) or bare JSON")
    p.add_argument("--backend", choices=("local", "kubernetes"), default=None,
                   help="default: the profile's hardware.kind (in a pod without a profile: kubernetes)")
    p.add_argument("--run-id", default=None, help="run id / workflow uid")
    p.add_argument("--run-dir", default=None, help="local run directory (default: the parent of --out)")


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

def _profile(args: argparse.Namespace) -> tuple[Any, str | None]:
    if getattr(args, "profile_obj", None) is not None:
        return args.profile_obj, None
    if not getattr(args, "profile", None):
        return None, "--profile: not given; falling back to the environment for backend and namespace"
    from gauntlet.params import ProfileError, load_profile
    try:
        return load_profile(args.profile), None
    except ProfileError as exc:
        return None, f"profile did not load ({str(exc).splitlines()[0][:300]}); released by label anyway"
    except Exception as exc:  # noqa: BLE001 - a broken image list or YAML library must not stop the release
        return None, f"profile did not load ({type(exc).__name__}: {exc}); released by label anyway"


def _backend(args: argparse.Namespace, profile: Any) -> str:
    if args.backend:
        return args.backend
    if profile is not None:
        return profile.hardware.kind
    in_cluster = os.environ.get("KUBERNETES_SERVICE_HOST") or os.environ.get("GAUNTLET_KUBE_API")
    return "kubernetes" if in_cluster else "local"


def run(args: argparse.Namespace, out: Path) -> tuple[list[Check], dict[str, Any]]:
    problems: list[str] = []
    profile, why = _profile(args)
    args.profile_obj = profile
    if why:
        problems.append(why)
    failures, why = parse_failures(getattr(args, "failures", None))
    if why:
        problems.append(why)
    status, why = parse_status(getattr(args, "workflow_status", None))
    if why:
        problems.append(why)
    backend = _backend(args, profile)

    # release first: nothing above may stop it
    if backend == "kubernetes":
        from gauntlet.steps._cleanup_k8s import cleanup
        checks, metrics = cleanup(args, out)
    else:
        checks, metrics = _cleanup_local(args, out)
    checks += [Check("arguments", "fail", "valid arguments and profile", p, p) for p in problems]
    metrics.update(workflow_status=status, failures=failures, problems=problems, backend=backend)
    return checks, metrics


def exit_code(verdict: Verdict) -> int:
    """0 unless something is still held: 75 when a transient error may be why (Argo retries), else 1."""
    m = verdict.metrics
    if not m.get("held"):
        return EXIT_PASS
    return EXIT_TRANSIENT if m.get("transient") else EXIT_FAIL


def _cleanup_local(args: argparse.Namespace, out: Path) -> tuple[list[Check], dict[str, Any]]:
    from gauntlet.steps._deploy_local import find_labelled, stop_all

    run_dir = (Path(args.run_dir) if args.run_dir else Path(out).parent).resolve()
    t0 = time.monotonic()
    errors: list[str] = []
    stopped: list[dict[str, Any]] = []
    try:
        stopped = stop_all(run_dir)
    except Exception as exc:  # noqa: BLE001 - recorded; what is left is judged below
        errors.append(f"stop_all({run_dir}): {type(exc).__name__}: {exc}")
    try:
        left = sorted(find_labelled(run_dir)) if run_dir != Path(run_dir.anchor) else []
    except OSError as exc:
        errors.append(f"listing labelled processes: {exc}")
        left = []
    metrics = {"backend": "local", "run_dir": str(run_dir), "stopped": stopped,
               "held": [f"pgid {p}" for p in left], "transient": False,
               "seconds": round(time.monotonic() - t0, 2)}
    what = (", ".join(f"pgid {s['pgid']} (port {s['port']}, {len(s['pids'])} processes) -> 0 running"
                      for s in stopped) or "no engine of this run was still running")
    checks = [Check("engines-stopped", "pass" if not left else "fail", "no engine process of the run left",
                    left, f"stopped: {what}" if not left else f"still running after SIGKILL: process groups {left}")]
    checks += [Check("release-error", "fail", "no error while releasing", e, e) for e in errors]
    return checks, metrics
