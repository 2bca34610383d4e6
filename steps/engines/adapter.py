"""What an engine provides to gauntlet: :class:`Engine`, the record each engine module defines as ``ENGINE``.

Below the registry (:mod:`gauntlet.steps.engines`) and the engine modules, which both import it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

from gauntlet.contract import Check
from gauntlet.params.models import EngineSpec
from gauntlet.steps.engines.replies import ReplyRules

__all__ = ["Engine", "REQUIRED"]


@dataclass(frozen=True, kw_only=True)
class Engine:
    """What one engine provides. The first group every engine has; the rest is None/False where it has none."""

    name: str
    title: str                                            # how reports and messages write it: "vLLM"
    program: Callable[[str], list[str]]                   # python -> the argv's program part
    serve: Callable[..., list[str]]                       # (spec, *, model_path, served_name, host, placement)
    flags: Callable[[EngineSpec], list[str]]              # the args' and parsers' flags (args.extra not included)
    context_flags: tuple[str, ...]                        # the flag(s) bounding one request's prompt + answer
    checker: Callable[[], Any]                            # Gate 0's adapter onto its own parser (built in its image)
    replies: ReplyRules                                   # where its replies legitimately differ from OpenAI's
    metrics: Mapping[str, tuple[str, ...]]                # engine-neutral gauge -> its Prometheus names
    env: Callable[[EngineSpec], Mapping[str, str]] | None = None    # env the args imply
    host_ip_env: str | None = None                        # a variable the pod fills from $(HOST_IP)
    expert_recorder: bool = False                         # it has the expert distribution recorder Gate 4 reads
    local_weights: Callable[[Path, EngineSpec, str], tuple[Check, dict[str, Any]]] | None = None
    diagnostic_client: str | None = None                  # the label of its own bench client, if any
    diagnostic_bench: Callable[..., Any] | None = None    # (BenchRequest, *, python, timeout_s) -> a run with .record


# what every engine must give (the rest is optional)
REQUIRED = tuple(f.name for f in fields(Engine) if f.default is MISSING)
