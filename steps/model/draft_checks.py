"""Gate 0: the draft a planned speculative variant takes from the checkpoint is in it.

A Gate 6 variant starts hours into the run. SGLang's DSpark without ``speculative.draft_model`` takes its
draft from the target checkpoint and refuses to start when that holds none; this judges, from the model
directory on the node and before any GPU is requested, whether the engine would find one. Which methods take
their draft from the checkpoint, and where the engine looks, is each engine's (``Engine.checkpoint_draft``, a
:class:`gauntlet.steps.engines.adapter.CheckpointDraft`); this module asks every planned variant's engine and
applies the same two tests: one of its config keys set in config.json, else its subfolder's file present.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gauntlet.contract import Check
from gauntlet.params.models import Profile
from gauntlet.steps.engines import engine as engine_of
from gauntlet.steps.engines.adapter import CheckpointDraft

__all__ = ["draft_checks", "find_draft", "CHECK"]

CHECK = "variant-draft"


def find_draft(rule: CheckpointDraft, config: Mapping[str, Any], is_file: Callable[[str], bool]) -> tuple[bool, str]:
    """(found, where it is, or why the engine would refuse to start) for a checkpoint (pure but for ``is_file``)."""
    keys = [k for k in rule.config_keys if config.get(k) is not None]
    if keys:
        return True, f"bundled in the checkpoint (config.json sets {', '.join(keys)})"
    if rule.subfolder_config and is_file(rule.subfolder_config):
        return True, f"in the checkpoint's own folder for it ({rule.subfolder_config})"
    where = " nor ".join([f"a key of {', '.join(rule.config_keys)} in config.json",
                          *([rule.subfolder_config] if rule.subfolder_config else [])])
    return False, (f"the checkpoint has neither {where}: the engine would refuse to start ({rule.refusal!r}); "
                   "set the variant's speculative.draft_model")


def draft_checks(profile: Profile, config: Mapping[str, Any] | None, is_file: Callable[[str], bool]) -> list[Check]:
    """One check per (variant, engine) whose merged args take their draft from the checkpoint; none for the rest.

    ``config``: config.json (None when it did not parse: the config-json check says why); ``is_file``: whether
    a path relative to the model directory is a file there (the engine's own test: symlinks followed)."""
    checks: list[Check] = []
    for v in profile.experiments:
        names = [v.engine] if v.engine else profile.engine_order()
        for name in names:
            rule = engine_of(name).checkpoint_draft
            # the profile validated this change against this engine's args when it loaded
            if rule is None or not rule.needed(profile.engines[name].args.with_change(v.change)):
                continue
            label = f"{CHECK}/{v.name}" + (f"/{name}" if len(names) > 1 else "")
            found, detail = find_draft(rule, config or {}, is_file)
            if config is None and not found:
                checks.append(Check(label, "skip", "the draft in the checkpoint", None,
                                    "config.json did not parse (see config-json): whether it bundles the draft "
                                    "cannot be told"))
                continue
            checks.append(Check(label, "pass" if found else "fail", "the draft in the checkpoint",
                                detail if found else None, f"variant {v.name} on {name}: the draft is {detail}"
                                if found else f"variant {v.name} on {name}: {detail}"))
    return checks
