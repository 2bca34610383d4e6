"""The exit handler: runs whatever happened, keeps the evidence, gives every resource of the run back.

Local back end: :func:`steps._deploy_local.stop_all` stops every engine process
group of the run (found by state file and by label) and the step confirms none
is left. Kubernetes: :func:`steps._cleanup_k8s.cleanup` (logs first, then scale
to 0 and delete only what carries the run's label).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from steps._evidence import Check, UsageError

NAME = "cleanup"
HELP = "exit handler: keep logs, stop/delete everything this run created (always runs)"
NEEDS_PROFILE = True


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workflow-status", default="Unknown", help="{{workflow.status}}: Succeeded, Failed or Error")
    p.add_argument("--failures", default="null", help="{{workflow.failures}}: a JSON list, or the string null")
    p.add_argument("--backend", choices=("local", "kubernetes"), default=None,
                   help="default: the profile's hardware.kind")
    p.add_argument("--run-id", default=None, help="run id / workflow uid")
    p.add_argument("--run-dir", default=None, help="local run directory (default: the parent of --out)")


def parse_failures(text: str) -> list[dict[str, Any]]:
    """Argo's {{workflow.failures}}: the string ``null`` when nothing failed, else a JSON list."""
    if text.strip() in ("", "null"):
        return []
    try:
        data = json.loads(text)
    except ValueError:
        raise UsageError(f"--failures: expected a JSON list or 'null', got {text[:80]!r}") from None
    if not isinstance(data, list):
        raise UsageError(f"--failures: expected a JSON list, got {type(data).__name__}")
    return data


def run(args: argparse.Namespace, out: Path) -> tuple[list[Check], dict[str, Any]]:
    failures = parse_failures(args.failures)
    backend = args.backend or args.profile_obj.hardware.kind
    if backend == "kubernetes":
        from steps._cleanup_k8s import cleanup
        checks, metrics = cleanup(args, out)
    else:
        checks, metrics = _cleanup_local(args, out)
    metrics.update(workflow_status=args.workflow_status, failures=failures)
    return checks, metrics


def _cleanup_local(args: argparse.Namespace, out: Path) -> tuple[list[Check], dict[str, Any]]:
    from steps._deploy_local import find_labelled, stop_all

    run_dir = (Path(args.run_dir) if args.run_dir else Path(out).parent).resolve()
    t0 = time.monotonic()
    stopped = stop_all(run_dir)
    left = find_labelled(run_dir)
    metrics = {"backend": "local", "run_dir": str(run_dir), "stopped": stopped,
               "seconds": round(time.monotonic() - t0, 2)}
    what = (", ".join(f"pgid {s['pgid']} (port {s['port']}, {len(s['pids'])} processes)" for s in stopped)
            or "no engine of this run was still running")
    checks = [Check("engines-stopped", "pass" if not left else "fail", "no engine process of the run left",
                    sorted(left), f"stopped: {what}" if not left else f"still running after SIGKILL: {sorted(left)}")]
    return checks, metrics
