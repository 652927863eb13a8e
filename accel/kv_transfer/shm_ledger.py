"""The ledger of a node's shared-memory KV store: config, byte accounting and outcome counters in
one small file, read and rewritten only under an exclusive ``flock`` on it.

Every critical section opens its own descriptor: ``flock`` locks belong to an open file
description, so separate descriptors exclude each other across processes AND across threads of
one process (one shared descriptor would let two threads in at once), and a forked child never
inherits a held lock.

Invariant (restored by every sweep, which recounts the directory): ``num_live``/``bytes_live`` ==
the files under ``tmp/`` and ``data/`` and their payload bytes; ``num_spare``/``bytes_spare`` ==
the recycled files under ``spare/`` and their sizes; ``bytes_live + bytes_spare <=
capacity_bytes``. Counters only grow; readers (the KV-connector actor's metrics) take deltas.
"""

from __future__ import annotations

import fcntl
import os
import struct
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path

_MAGIC = b"MSKVLDG1"


@dataclass
class LedgerState:
    """Mutable only inside ``Ledger.locked``; everything else gets a copy."""

    capacity_bytes: int
    lease_ms: int
    max_payload_bytes: int  # larger payloads take the object-store path
    num_live: int = 0  # reserved (tmp/) + committed (data/) transfers
    bytes_live: int = 0  # their payload bytes (header pages are not charged)
    num_spare: int = 0  # completed files kept for reuse (spare/)
    bytes_spare: int = 0  # their file sizes
    last_sweep_ms: int = 0  # unix ms of the last lease sweep
    num_committed: int = 0
    bytes_committed: int = 0
    num_completed: int = 0
    num_expired: int = 0
    num_rejected_capacity: int = 0
    num_rejected_too_large: int = 0
    num_cancelled: int = 0

    @property
    def lease_s(self) -> float:
        return self.lease_ms / 1e3

    @property
    def bytes_free(self) -> int:
        return self.capacity_bytes - self.bytes_live - self.bytes_spare


_NAMES = tuple(f.name for f in fields(LedgerState))
_STRUCT = struct.Struct("<8s" + "q" * len(_NAMES))


def _pack(state: LedgerState) -> bytes:
    return _STRUCT.pack(_MAGIC, *(getattr(state, name) for name in _NAMES))


def _unpack(raw: bytes) -> LedgerState:
    if len(raw) != _STRUCT.size or raw[:8] != _MAGIC:
        raise OSError(f"not a KV store ledger ({len(raw)} bytes)")
    return LedgerState(*_STRUCT.unpack(raw)[1:])


class Ledger:
    def __init__(self, path: Path):
        self.path = path

    @staticmethod
    def create(path: Path, state: LedgerState) -> bool:
        """Write a new ledger unless one exists (atomic: fully written, then hard-linked into
        place, so no reader ever sees a partial file). Returns whether this call created it."""
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
        tmp.write_bytes(_pack(state))
        try:
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink()

    @contextmanager
    def locked(self) -> Iterator[LedgerState]:
        """The state under an exclusive lock; written back if the body returns normally and
        changed it (a body that raises must not have changed the directory)."""
        fd = os.open(self.path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            raw = os.pread(fd, _STRUCT.size, 0)
            state = _unpack(raw)
            yield state
            new = _pack(state)
            if new != raw:
                os.pwrite(fd, new, 0)
        finally:
            os.close(fd)  # releases the lock

    def read(self) -> LedgerState:
        fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            return _unpack(os.pread(fd, _STRUCT.size, 0))
        finally:
            os.close(fd)
