"""Talking to a served engine: HTTP, streaming, replies, the bench client and the metrics sampler."""
