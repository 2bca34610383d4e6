"""SGLang's model registry, read from its source instead of imported.

``sglang.srt.models.registry`` builds ``ModelRegistry`` by importing every module
of ``sglang.srt.models`` and taking each one's ``EntryClass`` (a class or a list
of classes, keyed by ``__name__``); a module that fails to import is skipped with
a warning. Outside a GPU image nearly every model module fails on its CUDA
kernels (sgl-kernel, flashinfer, deep_gemm), so importing the registry on a CPU
machine yields an almost empty list that looks like an answer. This reads the
same modules' syntax trees instead: the same package directory, the same
non-package modules, the same ``EntryClass`` assignments, the class names
resolved through ``from x import A as B`` and ``B = A`` the way ``__name__``
would resolve them. engine-check reads it this way everywhere, inside the engine
image too, so the answer does not depend on which model modules happen to import.
"""

from __future__ import annotations

import ast
import importlib.util
import os
from pathlib import Path

__all__ = ["models_dir", "entry_classes", "registered_architectures"]


def models_dir() -> Path:
    """Where the installed ``sglang.srt.models`` package lives (found without importing sglang)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("sglang is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "srt" / "models"
    if not (path / "registry.py").is_file():
        raise ImportError(f"{path}/registry.py not found: not the SGLang layout this reader knows")
    return path


def _names(node: ast.expr) -> list[str] | None:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.List | ast.Tuple) and all(isinstance(e, ast.Name) for e in node.elts):
        return [e.id for e in node.elts]   # type: ignore[attr-defined]
    return None


def entry_classes(source: str) -> list[str] | None:
    """The ``__name__`` of each class a module's top-level ``EntryClass`` names; None without one.

    A top-level class keeps its name; ``from m import A as B`` makes ``B.__name__ == "A"``;
    ``B = A`` follows ``A``. The last ``EntryClass`` assignment wins, as at import time.
    """
    tree = ast.parse(source)
    aliases: dict[str, str] = {}
    entry: list[str] | None = None
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            for a in node.names:
                aliases[a.asname or a.name] = a.name
        elif isinstance(node, ast.ClassDef):
            aliases[node.name] = node.name
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            target = node.targets[0].id
            if target == "EntryClass":
                entry = _names(node.value)
            elif isinstance(node.value, ast.Name):
                aliases[target] = aliases.get(node.value.id, node.value.id)
    if entry is None:
        return None
    return [aliases.get(n, n) for n in entry]


def registered_architectures(path: Path | None = None, disabled: set[str] | None = None) -> dict[str, str]:
    """Architecture -> module file, as ``import_model_classes("sglang.srt.models")`` would register them.

    ``disabled`` are module names skipped like ``SGLANG_DISABLED_MODEL_ARCHS`` (default: that variable).
    """
    path = path or models_dir()
    if disabled is None:
        disabled = {m.strip() for m in os.environ.get("SGLANG_DISABLED_MODEL_ARCHS", "").split(",") if m.strip()}
    out: dict[str, str] = {}
    for f in sorted(path.glob("*.py")):   # pkgutil.iter_modules: non-package modules of the package
        if f.stem == "__init__" or f.stem in disabled:
            continue
        for arch in entry_classes(f.read_text(encoding="utf-8")) or []:
            out.setdefault(arch, f.name)
    return out
