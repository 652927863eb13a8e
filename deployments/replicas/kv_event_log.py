"""A bounded, sequence-numbered log of one engine replica's KV events, read by cursor.

Several router replicas poll the same engine replica; each must see every KV event (stored /
removed / cleared) to keep an identical precise prefix index. The engine hands its events out
once (``take_kv_events`` drains), so the replica appends each drain here and every router reads
from its own cursor: the events after the cursor while the log still holds them, else the reader
must resync from the engine's full block snapshot (``read`` answers None).

Invariants:
- Event ``n`` (1-based, per log) has ``seq == n``; ``head_seq`` is the last appended. The log
  keeps the newest ``capacity_events`` events: ``first_seq .. head_seq``.
- A cursor names the log it came from (``log_id``, fresh per log object): a cursor from another
  log — a restarted engine replica, or a replica that took over the id — never reads events here.
- Reading never changes the log, so a lost answer is re-read from the same cursor.

Pure logic (no Ray, no torch); thread-safe (Serve runs sync replica methods on a thread pool).
"""

from __future__ import annotations

import itertools
import threading
import uuid
from collections import deque
from collections.abc import Iterable

from deployments.config.router import RouterConfig
from deployments.messages.kv_events import KVCursor, KVEvent

DEFAULT_CAPACITY_EVENTS = RouterConfig.kv_event_log_size  # the one default of router.kv_event_log_size


class KVEventLog:
    def __init__(self, capacity_events: int = DEFAULT_CAPACITY_EVENTS, log_id: str | None = None):
        if capacity_events < 1:
            raise ValueError(f"capacity_events must be >= 1, got {capacity_events}")
        self.log_id = log_id or uuid.uuid4().hex
        self._events: deque[KVEvent] = deque(maxlen=capacity_events)
        self._head_seq = 0  # seq of the newest event (0 = none yet)
        self._lock = threading.Lock()

    @property
    def head(self) -> KVCursor:
        """The cursor of a reader that has applied everything logged so far."""
        return KVCursor(self.log_id, self._head_seq)

    @property
    def first_seq(self) -> int:
        """Seq of the oldest event still held (``head_seq + 1`` when empty)."""
        return self._head_seq - len(self._events) + 1

    def append(self, events: Iterable[KVEvent]) -> KVCursor:
        """Log events in publication order; returns the new head."""
        with self._lock:
            for event in events:
                self._events.append(event)  # the deque drops the oldest past capacity
                self._head_seq += 1
            return KVCursor(self.log_id, self._head_seq)

    def read(self, cursor: KVCursor | None) -> tuple[KVEvent, ...] | None:
        """Events after ``cursor`` (oldest first; empty when it is at the head), or None when the
        reader must resync from a full snapshot: no cursor, a cursor of another log, one whose
        next event fell off the ring, or one ahead of this log's head."""
        with self._lock:
            if cursor is None or cursor.log_id != self.log_id or cursor.seq > self._head_seq:
                return None
            skip = cursor.seq + 1 - self.first_seq
            if skip < 0:
                return None
            return tuple(itertools.islice(self._events, skip, None))
