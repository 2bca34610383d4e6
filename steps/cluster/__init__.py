"""The cluster's facts: GPUs, fabric, NCCL, telemetry, the engine's ranks."""
