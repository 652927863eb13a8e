"""LoRA adapters in the router: which adapters each replica holds and runs, and what that means
for placing an adapter request. Pure logic (no Ray, no torch).

A vLLM replica runs at most ``max_loras`` distinct adapters in one batch (its LoRA slots); a
request with another adapter waits in the engine's queue until a slot frees, and an adapter not
yet loaded costs a load from disk first. So, for a request with adapter ``a``:

1. **Slots** (``placeable``): among the replicas that run adapters at all (``max_loras > 0``), a
   replica whose slots are all taken by *other* adapters with requests in flight is left out
   while some replica has ``a`` in flight or a free slot. When none has, every adapter-capable
   replica stays a candidate (the request queues in an engine, as vLLM queues it).
2. **Affinity** (``credit``): a replica holding ``a`` (in flight there, or among the last
   ``max_loras`` adapters routed there: the engine keeps recently used adapters loaded) is
   credited ``ADAPTER_HIT_BLOCKS`` more cached blocks in the policy's cost, so it is preferred
   the way a prefix hit is and, like one, never over an overloaded replica (the load window).

Prefix blocks of adapter requests are keyed by the adapter (``accel.block_hash.salted_root``), so
the prefix index already never matches a prompt across adapters.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping

# Blocks of prefill a loaded adapter is worth: loading one (disk -> slot) costs about a block's
# prefill at the small ranks served here; enough to break load ties toward the holder.
ADAPTER_HIT_BLOCKS = 1


class AdapterTable:
    """Per replica: its ``max_loras``, the adapters in flight there, and the recently routed ones."""

    def __init__(self) -> None:
        self._max_loras: dict[str, int] = {}
        self._running: dict[str, Counter[str]] = {}  # replica -> adapter -> requests in flight
        self._resident: dict[str, OrderedDict[str, None]] = {}  # replica -> adapters, LRU first
        self._of_request: dict[str, tuple[str, tuple[str, ...]]] = {}  # request -> (adapter, replicas)

    def add_replica(self, replica_id: str, max_loras: int) -> None:
        """(Re-)register a replica; re-adding keeps what it holds."""
        self._max_loras[replica_id] = max_loras
        self._running.setdefault(replica_id, Counter())
        self._resident.setdefault(replica_id, OrderedDict())

    def remove_replica(self, replica_id: str) -> None:
        self._max_loras.pop(replica_id, None)
        self._running.pop(replica_id, None)
        self._resident.pop(replica_id, None)

    def can_run(self, replica_id: str) -> bool:
        return self._max_loras.get(replica_id, 0) > 0

    def placeable(self, adapter: str, candidates: Iterable[str]) -> frozenset[str]:
        """The ``candidates`` that run adapters and, if any has, those with ``adapter`` in flight
        or a free slot (rule 1 above)."""
        capable = [r for r in candidates if self.can_run(r)]
        free = [r for r in capable if self._has_slot_for(r, adapter)]
        return frozenset(free or capable)

    def credit(self, adapter: str, matched_blocks: Mapping[str, float], candidates: Iterable[str]) -> dict[str, float]:
        """``matched_blocks`` plus ``ADAPTER_HIT_BLOCKS`` on each candidate holding ``adapter``."""
        credited = dict(matched_blocks)
        for replica_id in candidates:
            if self.holds(replica_id, adapter):
                credited[replica_id] = credited.get(replica_id, 0) + ADAPTER_HIT_BLOCKS
        return credited

    def holds(self, replica_id: str, adapter: str) -> bool:
        return adapter in self._resident.get(replica_id, ()) or self._running.get(replica_id, Counter())[adapter] > 0

    def on_dispatched(self, request_id: str, adapter: str, replica_ids: Iterable[str]) -> None:
        """A request with ``adapter`` was sent to ``replica_ids``: count it there, mark it loaded."""
        live = tuple(r for r in replica_ids if r in self._max_loras)
        for replica_id in live:
            self._running[replica_id][adapter] += 1
            resident = self._resident[replica_id]
            resident[adapter] = None
            resident.move_to_end(adapter)
            while len(resident) > max(self._max_loras[replica_id], 1):
                resident.popitem(last=False)
        self._of_request[request_id] = (adapter, live)

    def on_finished(self, request_id: str) -> None:
        """The request ended (any way); unknown ids are ignored."""
        adapter, replica_ids = self._of_request.pop(request_id, ("", ()))
        for replica_id in replica_ids:
            running = self._running.get(replica_id)
            if running is not None and running[adapter] > 0:
                running[adapter] -= 1
                if not running[adapter]:
                    del running[adapter]

    def num_running(self, replica_id: str) -> int:
        """Distinct adapters with requests in flight on the replica."""
        return len(self._running.get(replica_id, ()))

    def _has_slot_for(self, replica_id: str, adapter: str) -> bool:
        running = self._running[replica_id]
        return running[adapter] > 0 or len(running) < self._max_loras[replica_id]
