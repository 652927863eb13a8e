"""How an engine hands a payload to the KV-connector actor and gets one back.

Engines (the TT engine's hooks, the vLLM connector) depend on ``KVTransport`` only. The
implementation over the Ray actor is the deployment layer's ``RayKVTransport`` (the
node's shared-memory store for same-node payloads, the object store otherwise); host tests
without Ray use a dict-backed one (``tests/accel/tt/test_tt_metal_contract.py``). Every call is
blocking with a deadline: engines call it from their step thread / worker, never from an event
loop.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol, runtime_checkable

from accel.kv_transfer.payload import KVPayload


class KVTransferError(RuntimeError):
    """A transfer could not be made or read. The consumer recomputes the prompt instead."""


class KVCapacityError(KVTransferError):
    """The actor stayed full past the put deadline (backpressure); the payload was not stored."""


class KVTransferNotFound(KVTransferError):
    """Unknown transfer id, or its lease expired and the payload was freed."""


@runtime_checkable
class KVTransport(Protocol):
    def put(self, transfer_id: str, payload: KVPayload, timeout_s: float) -> None:
        """Store ``payload`` under ``transfer_id``; waits for capacity up to ``timeout_s``.
        Raises ``KVCapacityError`` / ``KVTransferError``; on return the payload is leased."""
        ...

    def fetch(self, transfer_id: str, timeout_s: float) -> KVPayload:
        """The payload (possibly read-only shared memory). Raises ``KVTransferNotFound`` /
        ``KVTransferError``. The lease is renewed; call ``complete`` once copied."""
        ...

    def contains(self, transfer_id: str, timeout_s: float) -> bool:
        """Whether ``transfer_id`` is committed and unexpired (False when unknown or unreachable)."""
        ...

    def complete(self, transfer_id: str) -> None:
        """The consumer has copied the payload: free it now."""
        ...

    def report_recompute(self, reason: str) -> None:
        """Count a transfer the consumer gave up on and recomputed (metrics only)."""
        ...

    # The host-memory prefix tier (optional; best effort: failures return 0 / []).
    def offer_prefix(self, key: str, block_size: int, hashes: list[int], blocks: list[Any]) -> int:
        """Offer full blocks (``[L, 2, block_size, Hkv, D]`` each) under their chained hashes."""
        ...

    def match_prefix(self, key: str, block_size: int, hashes: list[int], dtype: Any, timeout_s: float) -> list[Any]:
        """The blocks of the longest leading run of ``hashes`` the tier holds."""
        ...


def make_transport(path: str, **kwargs: Any) -> KVTransport:
    """The transport class at ``path`` (``"module:Class"``), built with ``kwargs``. Engine-side code
    (the vLLM connector in vLLM's child processes) gets the path from its config, which the
    deployment layer fills in, so accel never names a deployment module."""
    module_name, _, class_name = path.partition(":")
    if not module_name or not class_name:
        raise ValueError(f"KV transport {path!r}: expected 'module:Class'")
    transport: KVTransport = getattr(importlib.import_module(module_name), class_name)(**kwargs)
    return transport


def failure_reason(exc: BaseException) -> str:
    """A short metric label for why a transfer failed: our own exception class when there is one
    (Ray wraps remote errors as ``RayTaskError(<ours>)``), else the exception's class name."""
    for cls in type(exc).__mro__:
        if cls.__module__.startswith("accel."):
            return cls.__name__
    return type(exc).__name__
