"""Gate 0 preflight: is the model directory on this node complete and the model the profile expects?

Zero GPUs, no weight data read: :func:`gather` reads the small files, the
directory listing and every shard's header (I/O); :func:`judge` turns those
facts into named checks (pure); :func:`run` is the `gauntlet step preflight`
entry. The evidence holds the fingerprint that `preflight-compare` joins.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import posixpath
import shutil
import socket
import stat
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gauntlet.contract import Check, UsageError, write_json_atomic
from gauntlet.params.models import ModelSpec, Profile
from gauntlet.steps.gate import Needs
from gauntlet.steps.model.config_checks import config_checks
from gauntlet.steps.model.fingerprint import component_of, extract_fingerprint, fingerprint, fingerprint_diff
from gauntlet.steps.model.marker import CHECKSUM_FILES, CHECKSUM_SUFFIXES, is_checksum_file, parse_marker
from gauntlet.steps.model.checks import INDEX_NAME, layout_checks
from gauntlet.steps.model.expectations import Handling, handling, settle, snippet
from gauntlet.steps.model.draft_checks import draft_checks
from gauntlet.steps.model.shards import PARTIAL_SUFFIX, index_path_problem, read_header, resolve_inside, walk_entries
from gauntlet.steps.model.tensor_checks import consistency_checks
from gauntlet.steps.options import GateOptions, option

__all__ = ["NAME", "HELP", "NEEDS", "Options", "run", "gather", "judge", "resolve_model_path"]

NAME = "preflight"
HELP = "Gate 0: model directory integrity (config, index, shard headers, tokenizer, marker) and fingerprint"
NEEDS = Needs(model_cache="read", size="large", transient=False, per_node=True)

SMALL_FILE_LIMIT = 512 << 20   # config/tokenizer files; anything bigger is not one
HF_METADATA = ".cache/huggingface/download/config.json.metadata"   # `hf download --local-dir`: commit on line 1


@dataclass(frozen=True, kw_only=True)
class Options(GateOptions):
    model_path: str | None = option(None, help="model directory (default: the profile's model.mount_path; relative "
                                               "to the current dir)")
    pin: str | None = option(None, help="pinned fingerprint JSON (or a previous preflight verdict.json)")
    discover: bool = option(False, help="a discovery run: pass each expectation the profile leaves null as "
                                        "'discovered' with the value this directory holds, and write them as the "
                                        "YAML to paste into the profile (discovered.yaml)")


def resolve_model_path(profile: Profile, given: str | None) -> Path:
    """The profile's model directory rule (:meth:`Profile.model_dir`), made absolute against the current dir."""
    p = profile.model_dir(given)
    return p if p.is_absolute() else Path.cwd() / p


# ---------------------------------------------------------------- I/O: gather the facts

def _read_small(root: Path, name: str, parse: bool) -> dict[str, Any]:
    info: dict[str, Any] = {"present": False, "size": None, "sha256": None, "error": None}
    real, escape = resolve_inside(root, name)
    try:
        st = os.stat(real)
    except FileNotFoundError:
        if os.path.islink(root / name):
            info.update(present=True, error="dangling symlink")
        return info
    except OSError as exc:
        info.update(present=True, error=f"cannot stat: {exc.strerror or exc}")
        return info
    info["present"] = True
    if escape:
        info["error"] = escape
        return info
    if not stat.S_ISREG(st.st_mode):
        info["error"] = "not a regular file"
        return info
    info["size"] = st.st_size
    if st.st_size == 0:
        info["error"] = "is empty (0 bytes)"
        return info
    if st.st_size > SMALL_FILE_LIMIT:
        info["error"] = f"{st.st_size} bytes is too large for this kind of file"
        return info
    try:
        data = real.read_bytes()
    except PermissionError:
        info["error"] = "cannot read: permission denied"
        return info
    except OSError as exc:
        info["error"] = f"cannot read: {exc.strerror or exc}"
        return info
    info["sha256"] = hashlib.sha256(data).hexdigest()
    if parse:
        try:
            info["json"] = json.loads(data)
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
            info["error"] = f"invalid JSON: {exc}"
        else:
            repeated = _repeated_keys(name, data, info["json"])
            if repeated:
                info["duplicate_keys"] = repeated
    else:
        info["text"] = data.decode("utf-8", errors="replace") if name.endswith(".jinja") else None
    return info


def _repeated_keys(name: str, data: bytes, doc: Any) -> list[str]:
    """Keys config.json or the index repeat in one object (json.loads keeps the last one silently)."""
    if name not in ("config.json", INDEX_NAME):
        return []
    if name == INDEX_NAME:  # 150k entries: parse twice only when the count of shard values disagrees
        wm = doc.get("weight_map") if isinstance(doc, dict) else None
        if isinstance(wm, dict) and data.count(b'.safetensors"') == len(wm):
            return []
    repeated: list[str] = []
    json.loads(data, object_pairs_hook=lambda pairs: _once(pairs, repeated))
    return repeated


def _once(pairs: list[tuple[str, Any]], repeated: list[str]) -> dict[str, Any]:
    """json's object hook: the dict json.loads would build (the last value wins), noting each repeated key."""
    d = dict(pairs)
    if len(d) < len(pairs):
        seen: dict[str, Any] = {}
        for k, v in pairs:
            if k in seen and len(repeated) < 20:
                show = [x if isinstance(x, str | int | float) else type(x).__name__ for x in (seen[k], v)]
                repeated.append(f"{k!r} twice ({show[0]!r}, then {show[1]!r}; JSON readers keep the last)")
            seen[k] = v
    return d


def _shard_facts(root: Path, name: str) -> dict[str, Any]:
    problem = index_path_problem(name)
    if problem:
        return {"path_problem": problem}
    real, escape = resolve_inside(root, name)
    if escape:
        return {"path_problem": escape}
    try:
        st = os.stat(real)
    except FileNotFoundError:
        return {"missing": True}
    except OSError as exc:
        return {"stat_error": f"cannot stat: {exc.strerror or exc}"}
    if not stat.S_ISREG(st.st_mode):
        return {"not_regular": "directory" if stat.S_ISDIR(st.st_mode) else "special file", "size": None}
    if st.st_size == 0:
        return {"size": 0}
    return read_header(real)


def _chat_template_syntax(files: dict[str, dict[str, Any]]) -> str | None:
    """A jinja syntax error in the chat template, when jinja2 is importable (the engines use it)."""
    try:
        import jinja2
    except ImportError:
        return None
    sources = []
    if (files.get("chat_template.jinja") or {}).get("text"):
        sources.append(("chat_template.jinja", files["chat_template.jinja"]["text"]))
    tc = (files.get("tokenizer_config.json") or {}).get("json")
    if isinstance(tc, dict) and isinstance(tc.get("chat_template"), str):
        sources.append(("tokenizer_config.json chat_template", tc["chat_template"]))
    env = jinja2.Environment()
    for where, text in sources:
        try:
            env.parse(text)
        except jinja2.TemplateSyntaxError as exc:
            return f"{where}: jinja syntax error at line {exc.lineno}: {exc.message}"
    return None


def gather(model_dir: Path, spec: ModelSpec) -> dict[str, Any]:
    """Everything the checks judge, read from the directory. Reads headers and small files only."""
    facts: dict[str, Any] = {"model_dir": str(model_dir), "dir_error": None, "entries": {}, "files": {},
                             "shards": {}, "weight_map": None, "strays": [], "marker": {}}
    try:
        st = os.stat(model_dir)
        if not stat.S_ISDIR(st.st_mode):
            facts["dir_error"] = f"{model_dir} is not a directory"
        else:
            os.listdir(model_dir)
    except FileNotFoundError:
        facts["dir_error"] = f"{model_dir} does not exist"
    except PermissionError:
        facts["dir_error"] = f"{model_dir}: cannot list: permission denied"
    except OSError as exc:
        facts["dir_error"] = f"{model_dir}: {exc.strerror or exc}"
    if facts["dir_error"]:
        return facts
    entries, list_errors = walk_entries(model_dir)
    facts["entries"], facts["list_errors"] = entries, list_errors

    parse = {"config.json", INDEX_NAME, "tokenizer_config.json", "chat_template.json"}
    parse |= {f for f in [*spec.tokenizer_files, *spec.processor_files] if f.endswith(".json")}
    names = parse | set(spec.tokenizer_files) | set(spec.processor_files) | {"chat_template.jinja"}
    names |= {rel for rel, e in entries.items() if "/" not in rel and e["type"] != "dir" and component_of(rel)}
    for name in sorted(names):
        facts["files"][name] = _read_small(model_dir, name, parse=name in parse)

    idx = facts["files"][INDEX_NAME]
    shard_names: list[str] = []
    if idx.get("json") is not None:
        wm = idx["json"].get("weight_map") if isinstance(idx["json"], dict) else None
        if not isinstance(wm, dict) or not set(map(type, wm.values())) <= {str}:   # (C-level at 150k tensors)
            facts["index_error"] = "no weight_map {tensor: shard file} mapping"
        elif not wm:
            facts["index_error"] = "weight_map is empty"
        else:
            facts["weight_map"] = wm
            shard_names = sorted(set(wm.values()))
    elif not idx["present"] and "model.safetensors" in entries:
        facts["single_file"] = True
        shard_names = ["model.safetensors"]
    facts["index_duplicates"] = idx.get("duplicate_keys", [])
    for name in shard_names:
        facts["shards"][name] = _shard_facts(model_dir, name)
    if facts.get("single_file"):
        t = facts["shards"]["model.safetensors"].get("tensors")
        facts["weight_map"] = {k: "model.safetensors" for k in t} if t is not None else None
    named = {posixpath.normpath(n) for n in shard_names}
    facts["strays"] = sorted(rel for rel, e in entries.items() if e["type"] in ("file", "symlink")
                             and ((rel.endswith(".safetensors") and rel not in named) or rel.endswith(PARTIAL_SUFFIX)))
    facts["chat_template_syntax"] = _chat_template_syntax(facts["files"])

    marker: dict[str, Any] = {"present": False}
    mpath = model_dir / spec.marker
    if os.path.lexists(mpath):
        marker["present"] = True
        try:
            mst = os.stat(mpath)
            if not stat.S_ISREG(mst.st_mode):  # a FIFO would block the read
                raise ValueError("marker is not a regular file")
            if mst.st_size > SMALL_FILE_LIMIT:
                raise ValueError("marker is too large")
            data, err = parse_marker(mpath.read_text(errors="replace"))
            marker.update(data=data, error=err)
        except PermissionError:
            marker["error"] = "cannot read: permission denied"
        except (OSError, ValueError) as exc:
            marker["error"] = f"cannot read: {getattr(exc, 'strerror', None) or exc}"
    facts["marker"] = marker

    facts["revision"], facts["revision_source"] = _revision(model_dir, marker, facts["files"])
    facts["checksums"] = {rel: {"size": e["size"]} for rel, e in entries.items()
                          if "/" not in rel and e["type"] == "file" and is_checksum_file(rel)}
    return facts


def _revision(model_dir: Path, marker: dict[str, Any], files: dict[str, Any]) -> tuple[str | None, str | None]:
    rev = (marker.get("data") or {}).get("revision")
    if isinstance(rev, str) and rev:
        return rev, "marker"
    try:
        line = (model_dir / HF_METADATA).read_text().splitlines()[0].strip()
        if line:
            return line, HF_METADATA
    except (OSError, IndexError):
        pass
    cfg = (files.get("config.json") or {}).get("json")
    if isinstance(cfg, dict) and isinstance(cfg.get("_commit_hash"), str):
        return cfg["_commit_hash"], "config.json _commit_hash"
    return None, None


# ---------------------------------------------------------------- pure: judge the facts

def _config_json_check(facts: dict[str, Any]) -> tuple[Check, dict[str, Any] | None]:
    info = facts["files"].get("config.json") or {}
    if not info.get("present"):
        return Check("config-json", "fail", "config.json", None, "config.json is missing"), None
    if info.get("error"):
        return Check("config-json", "fail", "config.json", None, f"config.json: {info['error']}"), None
    if not isinstance(info.get("json"), dict):
        return Check("config-json", "fail", "config.json", None, "config.json is not a JSON object"), None
    if info.get("duplicate_keys"):  # which value an engine reads is the parser's choice: refuse to guess
        return Check("config-json", "fail", "config.json", None,
                     "config.json repeats key " + "; ".join(info["duplicate_keys"][:5])), info["json"]
    return Check("config-json", "pass", "config.json", "config.json", "parses"), info["json"]


def judge(facts: dict[str, Any], spec: ModelSpec, pin: dict[str, Any] | None = None, *,
          unknowns: Handling = "require") -> tuple[list[Check], dict[str, Any]]:
    """Pure: facts -> (checks, metrics). The metrics carry the fingerprint. ``unknowns``: what an expectation
    the profile leaves null becomes (steps/model/expectations.py: reported, failed, or discovered, the values
    then in ``metrics["discovered"]``)."""
    if facts.get("dir_error"):
        return [Check("model-dir", "fail", "a readable model directory", None, facts["dir_error"])], {}
    checks = [Check("model-dir", "fail" if facts.get("list_errors") else "pass", "a readable model directory",
                    facts["model_dir"], "; ".join(facts.get("list_errors", [])[:3]) or facts["model_dir"])]
    cfg_check, cfg = _config_json_check(facts)
    checks.append(cfg_check)
    if cfg is not None:
        checks += config_checks(cfg, spec.architecture)
    checks += layout_checks(facts, spec)
    checks += consistency_checks(facts, cfg, spec.architecture)
    checks, discovered = settle(checks, spec, unknowns)
    if unknowns == "discover":
        checks.append(Check("discovered", "pass" if discovered else "skip", None, sorted(discovered),
                            f"{len(discovered)} expectation(s) the profile leaves null, as this directory holds "
                            "them: discovered.yaml beside this verdict, to merge into the profile" if discovered
                            else "nothing to discover: the profile states every Gate 0 expectation"))

    fp = fingerprint(facts["files"], facts["shards"])
    if pin is not None:
        diff = fingerprint_diff(pin, fp)
        checks.append(Check("fingerprint-pin", "fail" if diff else "pass", pin.get("sha256"), fp["sha256"],
                            ("drift from the pinned fingerprint: " + "; ".join(diff)) if diff
                            else "matches the pinned fingerprint"))
    if facts.get("checksums"):
        names = sorted(facts["checksums"])
        checks.append(Check("object-checksums", "pass", None, names,
                            f"attached {', '.join(names)} as evidence (object checksums from the sync tool; "
                            "weights are not re-hashed)"))
    else:
        checks.append(Check("object-checksums", "skip", None, None,
                            "no object-level checksum file beside the model (looked for "
                            f"{', '.join(CHECKSUM_FILES)}, *{', *'.join(CHECKSUM_SUFFIXES)})"))
    shards = facts["shards"]
    metrics = {
        "model_dir": facts["model_dir"],
        "shard_count": len(shards),
        "weight_bytes": sum(s.get("size") or 0 for s in shards.values() if not s.get("path_problem")),
        "tensor_count": len(facts["weight_map"] or {}),
        "revision": facts.get("revision"),
        "revision_source": facts.get("revision_source"),
        "fingerprint": fp,
        "outputs": {"fingerprint": fp["sha256"]},
    }
    if unknowns == "discover":
        metrics["discovered"] = discovered
    return checks, metrics


# ---------------------------------------------------------------- the step

def _load_pin(path: str) -> dict[str, Any]:
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as exc:
        raise UsageError(f"--pin {path}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise UsageError(f"--pin {path}: invalid JSON: {exc}") from None
    fp = extract_fingerprint(doc)
    if fp is None:
        raise UsageError(f"--pin {path}: no fingerprint in it (expected a preflight verdict.json or "
                         "{sha256, components, shards})")
    return fp


def _evidence_facts(facts: dict[str, Any]) -> dict[str, Any]:
    """The facts without the bulky parts (tensor lists, parsed JSON), for facts.json."""
    small = {k: v for k, v in facts.items() if k not in ("weight_map", "files", "shards", "entries")}
    small["files"] = {n: {k: v for k, v in f.items() if k not in ("json", "text")} for n, f in facts["files"].items()}
    small["shards"] = {n: {k: v for k, v in s.items() if k not in ("tensors", "shapes")}
                       | {"tensor_count": len(s.get("tensors") or {})}
                       for n, s in facts["shards"].items()}
    small["entry_count"] = len(facts.get("entries", {}))
    return small


def run(opts: Options, out: Path) -> tuple[list[Check], dict[str, Any]]:
    profile = opts.the_profile
    model_dir = resolve_model_path(profile, opts.model_path)
    pin = _load_pin(opts.pin) if opts.pin else None     # a bad --pin is a UsageError before anything is read
    # a 150k-tensor layout allocates hundreds of thousands of small objects and no cycles: without this the
    # cyclic GC rescans them over and over (about a third of the wall time there)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        facts = gather(model_dir, profile.model)
        checks, metrics = judge(facts, profile.model, pin, unknowns=handling(profile.purpose, opts.discover))
        if not facts.get("dir_error"):      # a planned variant's draft, where its engine takes it from the checkpoint
            cfg = (facts["files"].get("config.json") or {}).get("json")
            checks += draft_checks(profile, cfg if isinstance(cfg, dict) else None,
                                   lambda rel: (model_dir / rel).is_file())
    finally:
        if was_enabled:
            gc.enable()
    # which node saw this directory: the pod spec sets NODE_NAME from spec.nodeName (downward API)
    metrics["node"] = os.environ.get("NODE_NAME") or socket.gethostname()
    write_json_atomic(out / "facts.json", _evidence_facts(facts))
    if metrics.get("discovered"):
        # the snippet to paste, and where it is: the check's detail names the file (printed in the step's summary
        # and kept in verdict.json), so a discovery run on a cluster's node says where its values are
        where = f"{model_dir} on node {metrics['node']}"
        written = (out / "discovered.yaml").resolve()
        written.write_text(snippet(metrics["discovered"], profile.name, where))
        checks = [replace(c, detail=f"{len(metrics['discovered'])} expectation(s) profile {profile.name} leaves "
                          f"null, as {where} holds them: written to {written}; check each against the release, "
                          "then merge it into the profile's model: section") if c.name == "discovered" else c
                  for c in checks]
    if metrics.get("fingerprint"):
        write_json_atomic(out / "fingerprint.json", metrics["fingerprint"])
    for name in facts.get("checksums", {}):
        dest = out / "checksums" / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            shutil.copyfile(model_dir / name, dest)
        except OSError as exc:
            checks.append(Check("object-checksums", "fail", None, name, f"{name}: cannot copy: {exc.strerror}"))
    return checks, metrics
