"""One pod watch for the box's two watchers (the process kubelet and the test session): the API server's own JSON,
each stream resuming from the last version seen.

A watch started without a version begins with every pod that still exists: one restarted every few seconds that
way re-listed the whole namespace each time (a session kept a copy of every pod per restart, gigabytes in an hour;
the kubelet deserialised each into client models, more CPU than the box's control plane). With
``timeout_seconds`` set, the client raises on an ERROR event (410: version compacted) instead of retrying, and
no bookmarks are asked for, so every event yielded is ADDED, MODIFIED or DELETED; after an error the next stream
starts over without a version.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["pod_events"]


def pod_events(list_pods: Callable[..., Any], *args: Any, stop: threading.Event, timeout_s: int,
               on_error: Callable[[Exception], None], **kwargs: Any) -> Iterator[dict[str, Any]]:
    """Watch events of ``list_pods(*args)`` until ``stop`` is set, each ``{"type", "object"}`` with the object as
    the API's JSON. ``on_error`` gets each failed stream's exception (and may wait) before the next starts."""
    from kubernetes import watch

    since: str | None = None
    while not stop.is_set():
        try:
            kw = {"resource_version": since} if since else {}
            for ev in watch.Watch().stream(list_pods, *args, timeout_seconds=timeout_s, deserialize=False,
                                           **kw, **kwargs):
                since = ev["object"]["metadata"].get("resourceVersion") or since
                yield ev
                if stop.is_set():
                    return
        except Exception as exc:  # noqa: BLE001 - a watcher must outlive a restarting API server
            since = None
            if not stop.is_set():
                on_error(exc)
