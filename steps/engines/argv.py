"""What every engine's command line is built from: one rank's :class:`Placement` and the ``--name value`` rule.

Engine-independent, and below the engines' own modules (each one imports these; nothing here knows an engine).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Placement", "flag"]


@dataclass(frozen=True)
class Placement:
    """Where one rank of a multi-node engine runs; the only per-node difference."""

    nnodes: int = 1
    node_rank: int = 0
    dist_addr: str | None = None     # leader host:port for rendezvous
    host_ip: str | None = None
    extra_env: dict[str, str] = field(default_factory=dict)


def flag(name: str, value: Any) -> list[str]:
    """``--name value``; a bare ``--name`` for True; nothing for False or None."""
    if value is True:
        return [f"--{name}"]
    if value is False or value is None:
        return []
    return [f"--{name}", str(value)]
