"""Stop one engine after its sequence and wait until its resources are free."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gauntlet.steps import Needs
from gauntlet.contract import Check
from gauntlet.steps.deploy import backend_module

NAME = "teardown"
HELP = "stop the engine this run deployed (scale to 0 / stop the process group) and wait until freed"
NEEDS = Needs()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", required=True)
    p.add_argument("--backend", choices=["local", "kubernetes"], default=None)
    p.add_argument("--run-id", default=None)


def run(args: argparse.Namespace, out: Path) -> tuple[list[Check], dict[str, Any]]:
    return backend_module(args).teardown(args, out)
