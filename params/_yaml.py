"""Read a profile's YAML as hostile input: bounded size, UTF-8 only, no aliases, no duplicate keys,
bounded nesting. Every refusal is one line naming the file (and the line where YAML knows it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

__all__ = ["read_yaml", "MAX_BYTES", "MAX_DEPTH", "YamlRefused"]

MAX_BYTES = 256 * 1024   # the largest profile read (the shipped ones are under 16 KiB)
MAX_DEPTH = 32           # nested mappings/lists (the shipped profiles nest 5 deep)


class YamlRefused(Exception):
    """The file is not a profile this loader will parse; the message is one line without the file name."""


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader refusing anchors/aliases (a YAML bomb), duplicate keys and deep nesting."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()  # type: ignore[no-untyped-call]  # types-PyYAML leaves Parser.peek_event bare
        line = event.start_mark.line + 1
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise YamlRefused(f"line {line}: YAML anchors and aliases are refused (write each value out)")
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise YamlRefused(f"line {line}: nested more than {MAX_DEPTH} levels deep")
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            self.flatten_mapping(node)
            seen: set[Any] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    dup = key in seen
                    seen.add(key)
                except TypeError:       # an unhashable key: SafeLoader's own error says so
                    continue
                if dup:
                    text = str(key)
                    text = text if len(text) <= 60 else text[:57] + "..."
                    raise YamlRefused(f"line {key_node.start_mark.line + 1}: duplicate key {text!r} "
                                      f"(the later one would silently replace the earlier)")
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: Path) -> Any:
    """Parse ``path``; OSError for an unreadable file, YamlRefused / yaml.YAMLError for refused content."""
    with path.open("rb") as f:
        raw = f.read(MAX_BYTES + 1)
    if len(raw) > MAX_BYTES:
        raise YamlRefused(f"larger than {MAX_BYTES // 1024} KiB: refused before parsing")
    if b"\x00" in raw:
        raise YamlRefused("binary content (a NUL byte): a profile is UTF-8 text")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise YamlRefused(f"not UTF-8 text (byte {exc.start}: {raw[exc.start:exc.start + 1]!r})") from None
    try:
        return yaml.load(text, Loader=_StrictLoader)   # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise YamlRefused(f"nested too deeply (more than {MAX_DEPTH} levels)") from None
