"""Gate 0 join: every node's preflight saw the same model (same fingerprint).

Reads each ``--inputs`` evidence directory's verdict (the contract's reader, I/O), then
:func:`compare` (pure) names the node(s) that differ from the majority and what
differs: config, index, tokenizer, processor, or which shard.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gauntlet.contract import Check, CorruptVerdict, UsageError, Verdict
from gauntlet.contract.layout import verdict_path
from gauntlet.steps.gate import Needs
from gauntlet.steps.model.fingerprint import extract_fingerprint, fingerprint_diff
from gauntlet.steps.options import GateOptions, option

__all__ = ["NAME", "HELP", "NEEDS", "Options", "run", "read_input", "compare"]

NAME = "preflight-compare"
HELP = "Gate 0 join: fail unless every node's preflight fingerprint is the same"
NEEDS = Needs()


@dataclass(frozen=True, kw_only=True)
class Options(GateOptions):
    inputs: tuple[str, ...] = option(nargs="+", metavar="DIR",
                                     help="per-node preflight evidence directories (each with verdict.json)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.inputs:
            raise UsageError("--inputs needs at least one preflight evidence directory")


def read_input(d: Path) -> dict[str, Any]:
    """{label, node, status, fingerprint, error} for one evidence directory; never raises."""
    info: dict[str, Any] = {"label": d.name, "dir": str(d), "node": None, "status": None, "fingerprint": None,
                            "error": None}
    try:
        v = Verdict.read(d)
    except CorruptVerdict as exc:
        info["error"] = {"missing": f"{exc.path} is missing (did preflight run on this node?)",
                         "unreadable": f"{exc.path}: {exc.why}",
                         "not-json": f"{exc.path}: invalid JSON: {exc.why}"}.get(
                             exc.kind, f"{exc.path} is not a verdict ({exc.why})")
        return info
    info.update(status=v.status, node=v.metrics.get("node"), fingerprint=extract_fingerprint(v.metrics))
    if info["fingerprint"] is None:
        info["error"] = f"{verdict_path(d)} carries no fingerprint (status {v.status!r})"
    return info


def _who(i: dict[str, Any]) -> str:
    return f"{i['label']} (node {i['node']})" if i.get("node") else i["label"]


def compare(inputs: list[dict[str, Any]], expected_nodes: int | None = None) -> tuple[list[Check], dict[str, Any]]:
    """Pure: the inputs' facts -> checks naming the odd node(s) out and what differs."""
    checks: list[Check] = []
    bad = [i["error"] for i in inputs if i["error"]]
    checks.append(Check("evidence", "fail" if bad else "pass", len(inputs), len(inputs) - len(bad),
                        "; ".join(bad) if bad else f"{len(inputs)} preflight verdicts with fingerprints"))
    if expected_nodes:
        checks.append(Check.compare("node-count", expected_nodes, len(inputs),
                                    "" if len(inputs) != expected_nodes else f"{len(inputs)} nodes"))
    not_pass = [f"{_who(i)} preflight is {i['status']}" for i in inputs if i["status"] not in (None, "pass")]
    checks.append(Check("preflight-verdicts", "fail" if not_pass else "pass", "pass", not_pass or "pass",
                        "; ".join(not_pass) if not_pass else "every node's preflight passed"))
    have = [i for i in inputs if i["fingerprint"]]
    metrics: dict[str, Any] = {"fingerprints": {i["label"]: i["fingerprint"]["sha256"] for i in have},
                               "nodes": {i["label"]: i["node"] for i in inputs}}
    if not have:
        checks.append(Check("fingerprints-match", "fail", "one fingerprint", None, "no fingerprint to compare"))
        return checks, metrics
    counts = Counter(i["fingerprint"]["sha256"] for i in have)
    # the majority is the reference; a tie goes to the first input's fingerprint
    ref_sha = max(counts, key=lambda s: (counts[s], -next(n for n, i in enumerate(have) if i["fingerprint"]["sha256"] == s)))
    ref = next(i for i in have if i["fingerprint"]["sha256"] == ref_sha)
    odd = [i for i in have if i["fingerprint"]["sha256"] != ref_sha]
    details = [f"{_who(i)} differs from {_who(ref)}: {'; '.join(fingerprint_diff(ref['fingerprint'], i['fingerprint']))}"
               for i in odd]
    checks.append(Check("fingerprints-match", "fail" if odd else "pass", ref_sha,
                        sorted(counts) if odd else ref_sha,
                        " | ".join(details) if odd else f"{len(have)} nodes share fingerprint {ref_sha[:16]}"))
    metrics["differing"] = [i["label"] for i in odd]
    metrics["outputs"] = {"fingerprint": ref_sha if not odd else ""}
    return checks, metrics


def run(opts: Options, out: Path) -> tuple[list[Check], dict[str, Any]]:
    profile = opts.profile
    nodes = len(profile.hardware.nodes) if profile is not None and profile.hardware.kind == "kubernetes" else None
    return compare([read_input(Path(d)) for d in opts.inputs], expected_nodes=nodes)
