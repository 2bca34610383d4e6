"""What an engine provides to gauntlet: :class:`Engine`, the record each engine module defines as ``ENGINE``.

Below the registry (:mod:`gauntlet.steps.engines`) and the engine modules, which both import it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

from gauntlet.contract import Check
from gauntlet.params.models import EngineArgs, EngineSpec
from gauntlet.steps.engines.replies import ReplyRules

__all__ = ["Engine", "CheckpointDraft", "REQUIRED"]


@dataclass(frozen=True, kw_only=True)
class CheckpointDraft:
    """Where an engine finds a speculative method's draft model when ``speculative.draft_model`` is unset: in the
    target checkpoint, bundled (any of ``config_keys`` set in its config.json, top level) or in a folder of its own
    (``subfolder_config``, a file of the model directory); with neither it refuses to start, saying ``refusal``."""

    methods: tuple[str, ...]            # the speculative.method values this holds for, upper case
    config_keys: tuple[str, ...]
    subfolder_config: str | None
    refusal: str

    def needed(self, args: EngineArgs) -> bool:
        """Do these args take their draft from the checkpoint?"""
        s = args.speculative
        return s is not None and s.method.upper() in self.methods and not s.draft_model


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
    # its Prometheus counters appear at their first count (absent from a scrape: zero), as SGLang's do
    counters_from_first_count: bool = False
    # env its own start-up sets from the args and the profile's env (it wins over the profile's, as in its process)
    env: Callable[[EngineSpec], Mapping[str, str]] | None = None
    host_ip_env: str | None = None                        # a variable the pod fills from $(HOST_IP)
    expert_recorder: bool = False                         # it has the expert distribution recorder Gate 4 reads
    local_weights: Callable[[Path, EngineSpec, str], tuple[Check, dict[str, Any]]] | None = None
    diagnostic_client: str | None = None                  # the label of its own bench client, if any
    diagnostic_bench: Callable[..., Any] | None = None    # (BenchRequest, *, python, timeout_s) -> a run with .record
    # where it takes a speculative method's draft from when the args name none (Gate 0 checks it is there)
    checkpoint_draft: CheckpointDraft | None = None
    # the log line it prints when its KV pool holds fewer tokens than one request of the context it serves
    # (groups ``pool``, ``context``); Gate 5 reads a restart's logs for it (steps/gates/_ladder_restart.py)
    kv_pool_capped: re.Pattern[str] | None = None
    # python -> one line while its program is still being built in the background on this machine (`make run`
    # starts the local second engine's cold build beside the first engine's gates), else None
    building: Callable[[str], str | None] | None = None


# what every engine must give (the rest is optional)
REQUIRED = tuple(f.name for f in fields(Engine) if f.default is MISSING)
