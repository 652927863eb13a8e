"""The KV-connector actor's bookkeeping, without Ray: transfers, leases, capacity.

A transfer lives through ``reserve`` (bytes set aside; waits while the store is full) ->
``commit`` (payload attached, lease starts) -> ``claim`` (consumer reads; lease renewed) ->
``complete`` (freed). Every state holds a lease of ``lease_s`` from its last touch; an expired
transfer is freed, whatever its state, so a producer or consumer that dies never pins memory.
Invariant: ``num_bytes_used`` == sum of the bytes of every live (reserved or committed) transfer
<= ``capacity_bytes``. A put that does not fit waits up to its deadline, then fails with
``KVCapacityError``: nothing is dropped silently, the caller always learns the outcome.

The payload is opaque here (the actor stores Ray ``ObjectRef``s it owns); dropping the entry
drops the last reference, which frees the object.

Params-only entries (``put_params`` -> ``claim_params``): for engines whose own KV connector moves
the KV (TPU backends accept only ``TPUConnector``), the registry holds just the connector's
``kv_transfer_params`` dict under our transfer id, with the same lease: the decode side claims it
once (which removes it); unclaimed, it expires and the decode side recomputes. No bytes counted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from accel.kv_transfer.payload import KVDescriptor
from accel.kv_transfer.transport import KVCapacityError, KVTransferError, KVTransferNotFound

Clock = Callable[[], float]


class KVMetricsSink(Protocol):
    def on_commit(self, num_bytes: int) -> None: ...
    def on_complete(self, num_bytes: int, latency_s: float) -> None: ...
    def on_expire(self, num_bytes: int) -> None: ...
    def on_reject(self, reason: str) -> None: ...
    def on_recompute(self, reason: str) -> None: ...
    def on_usage(self, num_bytes_used: int, num_transfers: int) -> None: ...


class NullMetrics:
    def on_commit(self, num_bytes: int) -> None:
        pass

    def on_complete(self, num_bytes: int, latency_s: float) -> None:
        pass

    def on_expire(self, num_bytes: int) -> None:
        pass

    def on_reject(self, reason: str) -> None:
        pass

    def on_recompute(self, reason: str) -> None:
        pass

    def on_usage(self, num_bytes_used: int, num_transfers: int) -> None:
        pass


@dataclass
class _Transfer:
    num_bytes: int
    created_s: float
    expires_s: float
    descriptor: KVDescriptor | None = None  # None while only reserved
    payload: Any = None
    num_claims: int = 0


@dataclass(frozen=True)
class RegistryStats:
    num_transfers: int
    num_bytes_used: int
    capacity_bytes: int
    num_expired: int
    num_rejected: int
    num_completed: int
    recomputes: dict[str, int]  # reason -> prompts the consumer recomputed
    num_params: int = 0  # params-only entries held (engine-native connectors)
    num_params_claimed: int = 0


@dataclass
class KVRegistry:
    capacity_bytes: int
    lease_s: float = 30.0
    clock: Clock = time.monotonic
    metrics: KVMetricsSink = field(default_factory=NullMetrics)

    def __post_init__(self) -> None:
        if self.capacity_bytes <= 0 or self.lease_s <= 0:
            raise ValueError("capacity_bytes and lease_s must be positive")
        self._transfers: dict[str, _Transfer] = {}
        self._num_bytes_used = 0
        self._space_freed = asyncio.Event()
        self._num_expired = self._num_rejected = self._num_completed = 0
        self._recomputes: dict[str, int] = {}
        self._params: dict[str, tuple[dict[str, Any], float, float]] = {}  # -> (params, created, expires)
        self._num_params_claimed = 0

    # -- producer ---------------------------------------------------------------------------

    async def reserve(self, transfer_id: str, num_bytes: int, timeout_s: float) -> None:
        """Set ``num_bytes`` aside for ``transfer_id``, waiting up to ``timeout_s`` for space."""
        if transfer_id in self._transfers:
            raise KVTransferError(f"transfer {transfer_id!r} already exists")
        if num_bytes > self.capacity_bytes:
            self._reject("too_large")
            raise KVCapacityError(
                f"transfer {transfer_id!r} needs {num_bytes} bytes, more than the "
                f"KV connector's whole capacity ({self.capacity_bytes} bytes)"
            )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._num_bytes_used + num_bytes > self.capacity_bytes:
            self.expire()
            if self._num_bytes_used + num_bytes <= self.capacity_bytes:
                break
            remaining = deadline - loop.time()
            if remaining <= 0:
                self._reject("capacity")
                raise KVCapacityError(
                    f"KV connector full: {self._num_bytes_used}/{self.capacity_bytes} bytes used, "
                    f"transfer {transfer_id!r} ({num_bytes} bytes) waited {timeout_s:.1f}s"
                )
            self._space_freed.clear()
            try:
                await asyncio.wait_for(self._space_freed.wait(), min(remaining, self.lease_s / 4))
            except asyncio.TimeoutError:
                pass
        now = self.clock()
        self._transfers[transfer_id] = _Transfer(num_bytes, now, now + self.lease_s)
        self._num_bytes_used += num_bytes
        self._report_usage()

    def commit(self, transfer_id: str, descriptor: KVDescriptor, payload: Any) -> float:
        """Attach the payload to a reservation; returns the lease's expiry (clock seconds)."""
        t = self._live(transfer_id)
        if t.descriptor is not None:
            raise KVTransferError(f"transfer {transfer_id!r} already committed")
        if descriptor.num_bytes > t.num_bytes:
            raise KVTransferError(
                f"transfer {transfer_id!r}: payload of {descriptor.num_bytes} bytes "
                f"exceeds its reservation of {t.num_bytes}"
            )
        t.descriptor, t.payload = descriptor, payload
        t.expires_s = self.clock() + self.lease_s
        self.metrics.on_commit(t.num_bytes)
        return t.expires_s

    def cancel(self, transfer_id: str) -> None:
        """The producer gave up (e.g. its put failed): free the reservation."""
        if transfer_id in self._transfers:
            self._free(transfer_id)

    # -- consumer ---------------------------------------------------------------------------

    def claim(self, transfer_id: str) -> tuple[KVDescriptor, Any]:
        """The descriptor and payload of a committed transfer; renews its lease."""
        t = self._live(transfer_id)
        if t.descriptor is None:
            raise KVTransferNotFound(f"transfer {transfer_id!r} is reserved but not committed yet")
        t.num_claims += 1
        t.expires_s = self.clock() + self.lease_s
        return t.descriptor, t.payload

    def complete(self, transfer_id: str) -> None:
        t = self._transfers.get(transfer_id)
        if t is None:
            return
        self._num_completed += 1
        self.metrics.on_complete(t.num_bytes, self.clock() - t.created_s)
        self._free(transfer_id)

    def report_recompute(self, reason: str) -> None:
        self._recomputes[reason] = self._recomputes.get(reason, 0) + 1
        self.metrics.on_recompute(reason)

    # -- params-only entries (an engine's own connector moves the KV) ------------------------

    def put_params(self, transfer_id: str, params: Mapping[str, Any]) -> float:
        """Hold ``params`` (opaque) for the decode side; returns the lease's expiry."""
        if transfer_id in self._params or transfer_id in self._transfers:
            raise KVTransferError(f"transfer {transfer_id!r} already exists")
        now = self.clock()
        self._params[transfer_id] = (dict(params), now, now + self.lease_s)
        self.metrics.on_commit(0)
        return now + self.lease_s

    def claim_params(self, transfer_id: str) -> dict[str, Any]:
        """The params, removed (one decode per prefill). ``KVTransferNotFound`` if unknown,
        already claimed or expired."""
        self.expire()
        entry = self._params.pop(transfer_id, None)
        if entry is None:
            raise KVTransferNotFound(f"no KV params {transfer_id!r} (unknown, claimed or lease expired)")
        self._num_params_claimed += 1
        self.metrics.on_complete(0, self.clock() - entry[1])
        return entry[0]

    def contains(self, transfer_id: str) -> bool:
        self.expire()
        t = self._transfers.get(transfer_id)
        return t is not None and t.descriptor is not None

    # -- housekeeping -----------------------------------------------------------------------

    def expire(self) -> list[str]:
        """Free every transfer whose lease ran out; returns their ids."""
        now = self.clock()
        expired = [tid for tid, t in self._transfers.items() if t.expires_s <= now]
        for tid in expired:
            self._num_expired += 1
            self.metrics.on_expire(self._transfers[tid].num_bytes)
            self._free(tid)
        expired_params = [tid for tid, (_, _, expires_s) in self._params.items() if expires_s <= now]
        for tid in expired_params:
            del self._params[tid]
            self._num_expired += 1
            self.metrics.on_expire(0)
        return expired + expired_params

    def stats(self) -> RegistryStats:
        return RegistryStats(
            len(self._transfers),
            self._num_bytes_used,
            self.capacity_bytes,
            self._num_expired,
            self._num_rejected,
            self._num_completed,
            dict(self._recomputes),
            len(self._params),
            self._num_params_claimed,
        )

    def _live(self, transfer_id: str) -> _Transfer:
        self.expire()
        t = self._transfers.get(transfer_id)
        if t is None:
            raise KVTransferNotFound(f"no KV transfer {transfer_id!r} (unknown, completed or lease expired)")
        return t

    def _free(self, transfer_id: str) -> None:
        t = self._transfers.pop(transfer_id)
        self._num_bytes_used -= t.num_bytes
        t.payload = None
        self._space_freed.set()
        self._report_usage()

    def _reject(self, reason: str) -> None:
        self._num_rejected += 1
        self.metrics.on_reject(reason)

    def _report_usage(self) -> None:
        self.metrics.on_usage(self._num_bytes_used, len(self._transfers))
