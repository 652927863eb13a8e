"""In-process news of an engine deployment's running replicas, pushed by Serve.

Serve's controller pushes every change of a deployment's running replicas (started, stopped,
found dead by its health check) to each handle's request router by long poll, at once. Our
request router on engine deployments (``deployments.handle_routing.pinned``) publishes each new set here;
the router deployment, which holds handles to every pool, subscribes so it adds and removes
engine replicas when Serve knows of the change instead of at its next poll.

Publishers run on Serve's router event loop (its own thread); subscribers are called on that
thread and must hand the news to their own loop (``loop.call_soon_threadsafe``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)

# (app name, deployment name) -> the running replica ids (``ReplicaID.unique_id``)
Listener = Callable[[frozenset[str]], None]

_lock = threading.Lock()
_listeners: dict[tuple[str, str], list[Listener]] = {}
_latest: dict[tuple[str, str], frozenset[str]] = {}


def subscribe(app_name: str, deployment_name: str, listener: Listener) -> Callable[[], None]:
    """Call ``listener`` with each new running set (and now, with the latest one if known).
    Returns a function that unsubscribes."""
    key = (app_name, deployment_name)
    with _lock:
        _listeners.setdefault(key, []).append(listener)
        latest = _latest.get(key)
    if latest is not None:
        _call(listener, latest)

    def unsubscribe() -> None:
        with _lock:
            if listener in _listeners.get(key, []):
                _listeners[key].remove(listener)

    return unsubscribe


def latest(app_name: str, deployment_name: str) -> frozenset[str] | None:
    """The deployment's running replicas as last published in this process (None: not yet)."""
    with _lock:
        return _latest.get((app_name, deployment_name))


def publish(app_name: str, deployment_name: str, replica_ids: frozenset[str]) -> None:
    """The deployment's running replicas are now ``replica_ids``; repeated sets are not re-sent."""
    key = (app_name, deployment_name)
    with _lock:
        if _latest.get(key) == replica_ids:
            return
        _latest[key] = replica_ids
        listeners = list(_listeners.get(key, ()))
    for listener in listeners:
        _call(listener, replica_ids)


def _call(listener: Listener, replica_ids: frozenset[str]) -> None:
    try:
        listener(replica_ids)
    except Exception:  # a subscriber's bug must not break Serve's routing loop
        logger.exception("replica membership listener failed")
