"""Gate 0 engine-check, run inside the engine image: does *this* engine build accept the plan?

It asks the engine's own code, never a list written here: its CLI parser is fed
the exact argv of :func:`gauntlet.steps.engines.commands.engine_command` for every rank and for
every Gate 6 variant on this engine; its registries say whether the reasoning and
tool-call parsers and the architecture are known. Checks: the architecture is
registered; the parser accepts every planned flag and value (vLLM: its serve-args
validation and its attention-backend config too; SGLang: its speculative-algorithm
registry too); the ranks differ only in placement (node rank, rendezvous address,
host); each variant parses and changes one group of the engine's options; the
parser names are registered; the engine's ``__version__`` is the one params/images.yaml
records for the image (``engine-version``); every variable of the engine's own prefix in
its env is one the engine reads (``engine-env``: SGLang's ``sglang.srt.environ`` registry,
vLLM's ``vllm.envs``).

Each engine's adapter (its registry entry's ``checker``: ``VllmAdapter`` in :mod:`gauntlet.steps.engines.vllm`,
``SglangAdapter`` in :mod:`gauntlet.steps.engines.sglang`, ``LlamaCppAdapter`` in
:mod:`gauntlet.steps.engines.llamacpp`) does the importing (I/O); :func:`collect` gathers facts through one;
:func:`judge` is pure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gauntlet.contract import Check
from gauntlet.params.models import Profile
from gauntlet.steps.gate import Needs
from gauntlet.steps.engines import ENGINES, engine as engine_of
from gauntlet.steps.gates.shared_options import engine_option
from gauntlet.params import load_images
from gauntlet.steps.engines.commands import Placement, apply_change, engine_command, engine_env, engine_program
from gauntlet.steps.options import GateOptions, option

__all__ = ["NAME", "HELP", "NEEDS", "Options", "run", "planned_argvs", "collect", "judge", "has_linear_attention", "LINEAR_KINDS"]

NAME = "engine-check"
HELP = "Gate 0: the engine image registers the architecture and its own parser accepts every planned flag"
NEEDS = Needs(model_cache="read", transient=False, image="engine")
LEADER = "10.0.0.1:20000"     # placeholder rendezvous address: ranks share it, only its syntax is judged


def planned_argvs(profile: Profile, engine: str, model_path: str) -> dict[str, list[str]]:
    """Each rank's argv without its program (vLLM: ``serve <model> ...``), for the baseline and each variant.

    Keys: ``rank0``, ``rank1`` (two-node profiles), then ``<variant>/rank0`` ... for every Gate 6
    variant that runs on this engine.
    """
    spec = profile.engine(engine)
    n = max(1, len(profile.hardware.nodes)) if profile.hardware.kind == "kubernetes" else 1
    ranks = {"rank0": Placement()} if n == 1 else {
        f"rank{r}": Placement(nnodes=n, node_rank=r, dist_addr=LEADER) for r in range(n)}
    specs = {"": spec} | {f"{v.name}/": apply_change(spec, v.change) for v in profile.experiments
                          if v.engine in (None, engine)}
    skip = len(engine_program(engine))
    return {f"{label}{k}": engine_command(engine, s, model_path=model_path, served_name=profile.model.served_name,
                                          placement=p)[skip:]
            for label, s in specs.items() for k, p in ranks.items()}


def collect(adapter: Any, argvs: dict[str, list[str]], env_names: list[str] | None = None,
            pinned: dict[str, str] | None = None, *, linear: bool = False) -> dict[str, Any]:
    """Facts through one adapter; each query's failure is recorded, not raised. ``env_names``: the variables the
    engine's pods get (judged by the adapter's ``env_problems``, where it has one); ``pinned``: the image's key
    and the version params/images.yaml records for it; ``linear``: the model has linear-attention layers
    (:func:`has_linear_attention`), whose kernels the attention facts name too."""
    facts: dict[str, Any] = {"engine": adapter.engine, "version": adapter.version, "parse": {}, "options": {},
                             "argv": argvs, "rank_flags": sorted(adapter.rank_flags), "groups": {},
                             "pinned": pinned}
    for key, fn in (("architectures", adapter.architectures), ("reasoning_parsers", adapter.reasoning_parsers),
                    ("tool_parsers", adapter.tool_parsers)):
        try:
            facts[key] = fn()
        except Exception as exc:
            facts[key] = None
            facts[f"{key}_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    for key, argv in argvs.items():
        facts["parse"][key], facts["options"][key] = adapter.parse(argv)
    flags = {f for opts in facts["options"].values() if opts for f in opts}
    facts["groups"] = {f: adapter.group_of(f) for f in sorted(flags)}
    facts["defaults"] = {f: adapter.default_of(f) for f in sorted(flags)}
    facts["rules"] = getattr(adapter, "rules", None)
    facts["rules_missing"] = getattr(adapter, "rules_missing", None)
    facts["env_names"] = sorted(env_names or [])
    facts["env_problems"] = None
    if hasattr(adapter, "env_problems"):
        try:
            facts["env_problems"] = adapter.env_problems(facts["env_names"])
        except Exception as exc:
            facts["env_problems_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    # what the baseline's first rank runs for attention, as the engine resolves it (the report shows it beside
    # the A/B table: one profile value sets different knobs on different engines)
    facts["attention"] = (adapter.attention(next(iter(argvs.values())), linear=linear)
                          if hasattr(adapter, "attention") else None)
    return facts


# layer kinds (the profile's words, architecture.layer_kinds) that no softmax attention backend serves: Kimi
# Linear's KDA, Qwen3-Next's gated delta net (its config's layer_types "linear_attention")
LINEAR_KINDS = frozenset({"kda", "gdn", "linear_attention"})


def has_linear_attention(profile: Profile) -> bool:
    """Does the profile's model have linear-attention layers (a kind of :data:`LINEAR_KINDS` counted above 0)?"""
    return any(n and k in LINEAR_KINDS for k, n in (profile.model.architecture.layer_kinds or {}).items())


def _version_check(facts: dict[str, Any]) -> Check:
    """The engine the image holds is the version params/images.yaml pins for it: the adapter's flags, reply
    rules and registries were checked against that one."""
    eng, have, pinned = facts["engine"], facts.get("version"), facts.get("pinned")
    if not pinned:
        return Check("engine-version", "skip", None, have, f"no pinned version given for {eng} (params/images.yaml)")
    want, image = pinned.get("version"), pinned.get("image")
    if have == want:
        return Check("engine-version", "pass", want, have,
                     f"{eng} {have} is the version params/images.yaml pins for image {image!r}")
    return Check("engine-version", "fail", want, have,
                 f"the image's {eng} reports __version__ {have!r}, but params/images.yaml pins image {image!r} at "
                 f"{want!r}: re-pin the image to a build of {want}, or check gauntlet's {eng} adapter against "
                 f"{have} and record that version")


def _env_check(facts: dict[str, Any]) -> Check:
    eng, names, problems = facts["engine"], facts.get("env_names") or [], facts.get("env_problems")
    if facts.get("env_problems_error"):
        return Check("engine-env", "error", names, None, f"cannot read {eng}'s env registry: "
                     f"{facts['env_problems_error']}")
    if problems is None:
        return Check("engine-env", "skip", None, None, f"{eng} has no env registry gauntlet reads")
    if problems:
        return Check("engine-env", "fail", "variables the engine reads", problems,
                     "; ".join(f"{n}: {why}" for n, why in sorted(problems.items())))
    return Check("engine-env", "pass", "variables the engine reads", names,
                 f"{eng} knows every variable of its own it is given ({len(names)} in the env)")


def _diff(a: dict[str, Any], b: dict[str, Any], defaults: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """flag -> (value in a, value in b) for every flag set differently (absent: the parser's default)."""
    return {f: (a.get(f, defaults.get(f)), b.get(f, defaults.get(f))) for f in sorted(set(a) | set(b))
            if a.get(f, defaults.get(f)) != b.get(f, defaults.get(f))}


def _by_error(errs: dict[str, str]) -> list[tuple[list[str], str]]:
    """The same rejection on several ranks said once: [(ranks, error)] in the ranks' order."""
    out: dict[str, list[str]] = {}
    for rank, err in errs.items():
        out.setdefault(err, []).append(rank)
    return [(rs, e) for e, rs in out.items()]


def _show(d: dict[str, tuple[Any, Any]]) -> str:
    return ", ".join(f"{f} {x!r}->{y!r}" for f, (x, y) in d.items())


def _ranks_check(facts: dict[str, Any], ranks: list[str]) -> Check:
    eng, opts = facts["engine"], facts["options"]
    if len(ranks) < 2:
        return Check("ranks", "skip", None, None, "one rank: nothing to compare")
    if any(opts.get(r) is None for r in ranks):
        return Check("ranks", "skip", None, None, "a rank's command did not parse (see cli-flags)")
    allowed, dfl = set(facts["rank_flags"]), facts["defaults"]
    bad = {r: {f: v for f, v in _diff(opts[ranks[0]], opts[r], dfl).items() if f not in allowed} for r in ranks[1:]}
    bad = {r: d for r, d in bad.items() if d}
    if bad:
        return Check("ranks", "fail", sorted(allowed), {r: list(d) for r, d in bad.items()},
                     "; ".join(f"{ranks[0]} and {r} differ beyond placement as {eng} parses them: {_show(d)}"
                               for r, d in bad.items()))
    return Check("ranks", "pass", sorted(allowed), {r: _diff(opts[ranks[0]], opts[r], dfl) for r in ranks[1:]},
                 f"{eng}'s parser sees the {len(ranks)} ranks differ only in placement "
                 f"({', '.join(sorted({f for r in ranks[1:] for f in _diff(opts[ranks[0]], opts[r], dfl)}))})")


def _variant_check(facts: dict[str, Any], name: str, ranks: list[str]) -> Check:
    eng, opts = facts["engine"], facts["options"]
    check = f"variant-{name}"
    errs = {r: facts["parse"][f"{name}/{r}"] for r in ranks if facts["parse"][f"{name}/{r}"]}
    if errs:
        if all(facts["parse"].get(r) == e for r, e in errs.items()):
            return Check(check, "fail", "accepted", errs, f"variant {name!r} inherits the baseline command's "
                         f"rejection ({', '.join(errs)}; see cli-flags)")
        return Check(check, "fail", "accepted", errs, "; ".join(
            f"{eng}'s own parser rejects variant {name!r} ({', '.join(rs)}): {e}" for rs, e in _by_error(errs)))
    base = opts.get(ranks[0])
    if base is None:
        return Check(check, "skip", None, None, "the baseline command did not parse (see cli-flags)")
    d = _diff(base, opts[f"{name}/{ranks[0]}"], facts["defaults"])
    groups = sorted({facts["groups"].get(f, f) for f in d})
    if not d:
        return Check(check, "fail", "one change", {}, f"variant {name!r} parses to the baseline's options on "
                     f"{eng}: it changes nothing")
    if len(groups) > 1:
        return Check(check, "fail", "one group of options", d,
                     f"variant {name!r} changes {len(groups)} groups of {eng}'s options ({', '.join(groups)}): "
                     f"{_show(d)}; a variant changes one variable")
    return Check(check, "pass", "one group of options", d, f"{eng} accepts variant {name!r}: {_show(d)}")


def _expected_archs(profile: Profile, model_path: Path) -> tuple[list[str] | None, str]:
    if profile.model.architecture.architectures:
        return list(profile.model.architecture.architectures), "the profile"
    try:
        cfg = json.loads((model_path / "config.json").read_text())
        if isinstance(cfg.get("architectures"), list):
            return cfg["architectures"], f"{model_path}/config.json"
    except (OSError, ValueError, AttributeError):
        pass
    return None, ""


def _registered(name: str, label: str, want: str | None, have: list[str] | None, err: str | None,
                engine: str, field: str) -> Check:
    if want is None:
        return Check(name, "skip", None, None, f"the profile plans no {label} (engines.{engine}.{field})")
    if have is None:
        return Check(name, "error", want, None, f"cannot list {engine}'s {label}s: {err}")
    if want in have:
        return Check(name, "pass", want, want, f"{want!r} is registered in {engine}")
    return Check(name, "fail", want, None, f"{label} {want!r} is not registered in {engine} "
                 f"(engines.{engine}.{field}); registered: {', '.join(have)}")


def judge(facts: dict[str, Any], profile: Profile, engine: str, archs: list[str] | None,
          archs_source: str) -> list[Check]:
    """Pure: engine facts -> checks."""
    eng = facts["engine"]
    checks = [Check("engine-import", "pass", engine, facts.get("version"), f"{eng} {facts.get('version')} imported"),
              _version_check(facts), _env_check(facts)]
    have = facts.get("architectures")
    if archs is None:
        checks.append(Check("architecture", "skip", None, None, "unknown expectation: fill "
                            "model.architecture.architectures (and no config.json to read it from)"))
    elif have is None:
        checks.append(Check("architecture", "error", archs, None,
                            f"cannot list {eng}'s registered architectures: {facts.get('architectures_error')}"))
    else:
        missing = [a for a in archs if a not in have]
        checks.append(Check("architecture", "fail" if missing else "pass", archs, [a for a in archs if a in have],
                            (f"{', '.join(missing)} (from {archs_source}) not in {eng}'s model registry "
                             f"({len(have)} architectures)") if missing
                            else f"{', '.join(archs)} registered in {eng} (from {archs_source})"))
    ranks = [k for k in facts["parse"] if "/" not in k]
    bad = {rank: err for rank in ranks if (err := facts["parse"][rank])}
    checks.append(Check("cli-flags", "fail" if bad else "pass", "accepted", bad or "accepted",
                        "; ".join(f"{eng}'s own parser rejects the {' and '.join(rs)} command{'s' * (len(rs) > 1)}: "
                                  f"{err}" for rs, err in _by_error(bad))
                        if bad else f"{eng}'s own parser accepts the planned command ({', '.join(ranks)})"))
    checks.append(_ranks_check(facts, ranks))
    if facts.get("rules_missing"):
        checks.append(Check("engine-rules", "skip", None, None, f"{eng}'s cross-flag rules were not run here: "
                            f"{facts['rules_missing']} (they run inside the engine image)"))
    elif facts.get("rules"):
        checks.append(Check("engine-rules", "pass", facts["rules"], facts["rules"],
                            f"{eng}'s own rules ran on every planned command: {', '.join(facts['rules'])}"))
    variants = list(dict.fromkeys(k.split("/")[0] for k in facts["parse"] if "/" in k))
    checks += [_variant_check(facts, v, ranks) for v in variants]
    spec = profile.engine(engine)
    checks.append(_registered("reasoning-parser", "reasoning parser", spec.reasoning_parser,
                              facts.get("reasoning_parsers"), facts.get("reasoning_parsers_error"), eng,
                              "reasoning_parser"))
    checks.append(_registered("tool-call-parser", "tool-call parser", spec.tool_call_parser,
                              facts.get("tool_parsers"), facts.get("tool_parsers_error"), eng, "tool_call_parser"))
    return checks


@dataclass(frozen=True, kw_only=True)
class Options(GateOptions):
    engine: str = option(choices=tuple(sorted(ENGINES)), help="which engine this image holds")
    model_path: str | None = option(None, help="model directory for the command line and, when the profile leaves "
                                               "architectures null, its config.json (default: model.mount_path)")

    def __post_init__(self) -> None:
        super().__post_init__()
        engine_option(self, self.engine)


def run(opts: Options, out: Path) -> tuple[list[Check], dict[str, Any]]:
    profile = opts.the_profile
    engine = opts.engine
    model_path = profile.model_dir(opts.model_path)
    argvs = planned_argvs(profile, engine, str(model_path))
    try:
        adapter = engine_of(engine).checker()
    except ImportError as exc:
        image = profile.engine(engine).image
        return [Check("engine-import", "error", engine, None,
                      f"{engine} is not importable here ({exc}); engine-check must run inside the engine image "
                      f"(params/images.yaml {image!r})")], {"argv": argvs}
    except Exception as exc:  # the engine is there but broken (torch/driver mismatch): still one line
        return [Check("engine-import", "error", engine, None,
                      f"importing {engine} failed: {type(exc).__name__}: {exc}".splitlines()[0])], {"argv": argvs}
    spec = profile.engine(engine)
    # the pod's env names (the clear ones with the engine's own, then those read from Secrets)
    env_names = [*engine_env(engine, spec), *spec.secret_env]
    key = spec.image
    pinned = {"image": key, "version": load_images()[key].version}     # $GAUNTLET_IMAGES in the pods
    facts = collect(adapter, argvs, env_names, pinned, linear=has_linear_attention(profile))
    archs, source = _expected_archs(profile, model_path)
    checks = judge(facts, profile, engine, archs, source)
    (out / "engine-facts.json").write_text(json.dumps(facts, indent=1, default=str))
    return checks, {"engine": engine, "version": facts.get("version"), "argv": argvs,
                    "attention": facts.get("attention")}
