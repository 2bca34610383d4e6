"""Profiles: YAML files validated into typed models (see :mod:`gauntlet.params.models`)."""

from gauntlet.params.loader import ProfileError, load_profile, profile_path, list_profiles, load_images, ImageRef
from gauntlet.params.models import Profile

__all__ = ["ProfileError", "Profile", "load_profile", "profile_path", "list_profiles", "load_images", "ImageRef"]
