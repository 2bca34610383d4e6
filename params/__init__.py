"""Profiles: YAML files validated into typed models (see :mod:`params.models`)."""

from params.loader import ProfileError, load_profile, profile_path, list_profiles, load_images, ImageRef
from params.models import Profile

__all__ = ["ProfileError", "Profile", "load_profile", "profile_path", "list_profiles", "load_images", "ImageRef"]
