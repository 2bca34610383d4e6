"""Load and validate profiles and the pinned image list, with one-line errors."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gauntlet.contract import UsageError
from gauntlet.params import _messages
from gauntlet.params._yaml import YamlRefused, read_yaml
from gauntlet.params.models import Profile

__all__ = ["ProfileError", "load_profile", "profile_path", "list_profiles", "load_images", "ImageRef",
           "format_validation_error", "PROFILES_DIR", "IMAGES_FILE"]

PROFILES_DIR = Path(__file__).resolve().parent / "profiles"
IMAGES_FILE = Path(__file__).resolve().parent / "images.yaml"   # package data of gauntlet.params (pyproject)
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_ZERO_DIGEST = "sha256:" + "0" * 64          # a placeholder: what a local "image" (a PyPI build) carries
_PROFILE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")   # a file under params/profiles/


class ProfileError(UsageError):
    """A profile or image list is invalid; the message is one line naming file and field (exit 2)."""


def list_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def profile_path(name_or_path: str | Path) -> Path:
    shown = _messages.short(str(name_or_path))
    try:
        p = Path(name_or_path)
        if p.suffix in (".yaml", ".yml") or p.exists():
            if not p.is_file():
                raise ProfileError(f"{shown}: no such profile file")
            return p
        if not _PROFILE_NAME.match(str(name_or_path)):
            raise ProfileError(f"{shown}: no such profile file, and not a profile name (lower-case letters, "
                               f"digits and '-'; known: {', '.join(list_profiles())})")
        cand = PROFILES_DIR / f"{name_or_path}.yaml"
        if cand.is_file():
            return cand
    except (OSError, ValueError) as exc:      # a name too long for the file system, a NUL byte
        raise ProfileError(f"{shown}: not a readable profile path ({getattr(exc, 'strerror', None) or exc})") from None
    raise ProfileError(f"{shown}: no such profile (known: {', '.join(list_profiles())})")


def format_validation_error(source: str, err: ValidationError) -> str:
    """Pydantic's errors as ``file: a.b.c: expected int, got 'sixteen'`` joined by '; ' (the first few,
    each bounded: an error never repr()s a whole input)."""
    return f"{source}: " + _messages.join(err.errors(include_url=False))


def _read_yaml(path: Path) -> Any:
    try:
        return read_yaml(path)
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except YamlRefused as exc:
        raise ProfileError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}:" if mark else ""
        what = " ".join(str(getattr(exc, "problem", None) or exc).split())   # a ReaderError's text spans lines
        raise ProfileError(f"{path}:{where} invalid YAML: {what[:200]}") from None


def load_profile(name_or_path: str | Path, images: dict[str, ImageRef] | None = None) -> Profile:
    """Validate a profile (by name or path) and the images it names; raise ProfileError."""
    path = profile_path(name_or_path)
    data = _read_yaml(path)
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        profile = Profile.model_validate(data)
    except ValidationError as exc:
        raise ProfileError(format_validation_error(str(path), exc)) from None
    images = load_images() if images is None else images
    refs = [("step_image", profile.step_image)] + [
        (f"engines.{n}.image", e.image) for n, e in profile.engines.items()]
    for field, key in refs:
        if key not in images:
            raise ProfileError(f"{path}: {field}: image {key!r} is not pinned in {IMAGES_FILE.name} "
                               f"(known: {', '.join(sorted(images))})")
    return profile


class ImageRef(BaseModel):
    """An image pinned by its linux/amd64 manifest digest, and the internal tag it syncs to.

    ``version`` is what the image holds: an engine image's engine as its ``__version__`` says (Gate 0's
    engine-check fails on another), a step image's gauntlet. ``verified`` is true only for a digest someone
    read from the registry for that tag (``crane digest``) and synced; a digest written by hand, copied or
    all zeros is a stand-in (``verified: false``), which ``gauntlet render``/``lint``/``submit`` refuse for
    a cluster profile (gauntlet.workflows.render ``unverified_images``; docs/cluster.md, "Pinning the images")."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    repository: str
    tag: str
    digest: str = Field(description="linux/amd64 manifest digest, sha256:<64 hex>")
    internal: str = Field(description="internal registry repository:tag the digest is synced to")
    engine: str | None = None
    version: str = Field(min_length=1, max_length=64, description="the engine's __version__ (engine images), else "
                         "the gauntlet version the step image was built from")
    verified: bool = Field(False, description="true: the digest was read from the registry for this tag and "
                           "synced; false (the default): a stand-in, refused for a cluster profile")
    fixes: list[str] = []

    @field_validator("digest")
    @classmethod
    def _digest(cls, v: str) -> str:
        if not _DIGEST.match(v):
            raise ValueError(f"expected a sha256:<64 hex> manifest digest, got {v!r}; pin the image by digest")
        return v

    @model_validator(mode="after")
    def _zero_is_a_stand_in(self) -> ImageRef:
        if self.verified and self.stand_in_digest:
            raise ValueError(f"verified: an all-zero digest is a stand-in, never verified ({self.repository}:"
                             f"{self.tag}); put the digest the registry gives for the tag")
        return self

    @property
    def stand_in_digest(self) -> bool:
        return self.digest == _ZERO_DIGEST

    @property
    def ref(self) -> str:
        """What pods pull: the internal copy, by digest."""
        return f"{self.internal.rsplit(':', 1)[0]}@{self.digest}"


def load_images(path: Path | None = None) -> dict[str, ImageRef]:
    """The pinned images: ``path``, else ``$GAUNTLET_IMAGES``, else the package's own ``params/images.yaml``."""
    path = Path(path or os.environ.get("GAUNTLET_IMAGES") or IMAGES_FILE)
    data = _read_yaml(path)
    if not isinstance(data, dict) or not isinstance(data.get("images"), dict):
        raise ProfileError(f"{path}: expected a mapping with key 'images'")
    out = {}
    for key, spec in data["images"].items():
        try:
            out[key] = ImageRef.model_validate(spec)
        except ValidationError as exc:
            raise ProfileError(format_validation_error(f"{path}: images.{key}", exc)
                               .replace(f"{path}: images.{key}: ", f"{path}: images.{key}.")) from None
    return out
