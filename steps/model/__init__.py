"""The model and its cache: zero-GPU integrity checks, the completion marker, local models."""
