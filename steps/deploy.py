"""Gate 2: deploy one engine and wait until it really answers.

The back end comes from the profile (``hardware.kind``) unless ``--backend``
says otherwise: ``local`` starts a subprocess (steps/_deploy_local.py),
``kubernetes`` server-side-applies a StatefulSet (steps/_deploy_k8s.py).
Either writes ``outputs/endpoint`` for the later gates.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from typing import Any

from gauntlet.steps import Needs
from gauntlet.contract import Check, UsageError

NAME = "deploy"
HELP = "Gate 2: deploy the engine (local subprocess or Kubernetes StatefulSet) and wait for readiness"
NEEDS = Needs()
BACKENDS = {"local": "gauntlet.steps._deploy_local", "kubernetes": "gauntlet.steps._deploy_k8s"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", required=True, help="engine name from the profile (sglang, vllm)")
    p.add_argument("--backend", choices=sorted(BACKENDS), default=None,
                   help="default: the profile's hardware.kind")
    p.add_argument("--run-id", default=None, help="run id / workflow uid (labels what this run creates)")
    p.add_argument("--variant", default=None, help="Gate 6 variant to deploy instead of the baseline args")


def backend_module(args: argparse.Namespace):
    profile = args.profile_obj
    if args.engine not in profile.engines:
        raise UsageError(f"--engine {args.engine}: not in profile {profile.name} (has {', '.join(profile.engines)})")
    return importlib.import_module(BACKENDS[args.backend or profile.hardware.kind])


def run(args: argparse.Namespace, out: Path) -> tuple[list[Check], dict[str, Any]]:
    return backend_module(args).deploy(args, out)
