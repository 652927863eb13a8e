"""A node's shared-memory KV store: the same-node data path of KV transfers, no RPC per hand-off.

One directory per (application, Ray cluster) under a tmpfs root (``/dev/shm``)::

    ledger       config + byte accounting + counters (``shm_ledger``), the lock of every change
    completions  reserve-to-complete latencies (float64s) the KV-connector actor drains for metrics
    tmp/<name>   reserved transfers being written (header first, then the payload)
    data/<name>  committed transfers (``tmp`` renamed: the atomic commit; readers never see a
                 partial payload)
    spare/<size>-<uuid>  completed files kept for reuse (at most ``MAX_SPARE_FILES``, dropped
                 after a lease idle): rewriting pages tmpfs already holds costs about a third of
                 allocating fresh ones, which is most of a small hand-off
    owner        who created the store (the actor writes its cluster's GCS address there)

Lifecycle of a transfer, every step but the payload write and the read under the ledger lock:
``reserve`` (capacity checked, file created with its header; waits up to the put deadline while
full, then ``KVCapacityError``) -> payload written -> ``commit`` (rename into ``data/``) ->
``fetch`` (map the file read-only, zero-copy; takes a shared ``flock`` on the file and renews the
lease by touching its mtime) -> ``complete`` (freed: recycled into ``spare/`` when no other reader
holds the file's lock, else unlinked). A file whose mtime is older than the lease is expired by
any sweep (the actor's every second, a blocked producer's) and unlinked — never recycled, so a
slow reader's mapping stays intact. A process that dies mid-transfer leaves only files the
sweeper reclaims; each sweep recounts the ledger from the directory.

Pure stdlib + torch/numpy: producers and consumers may be Ray workers, vLLM children or tests.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import re
import shutil
import struct
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from accel.kv_transfer.payload import KVPayload
from accel.kv_transfer.shm_format import (
    PAGE_BYTES,
    PREFIX_BYTES,
    TransferHeader,
    decode_header,
    decode_prefix,
    file_name,
)
from accel.kv_transfer.shm_ledger import Ledger, LedgerState
from accel.kv_transfer.transport import KVCapacityError, KVTransferError

MAX_SPARE_FILES = 8
PRODUCER_SWEEP_PERIOD_S = 0.25  # a blocked producer sweeps expired leases at most this often
_MAX_JOURNAL_BYTES = 1 << 20  # latencies kept while no actor drains them (then dropped)
_LATENCY = struct.Struct("<d")


@dataclass(frozen=True)
class ShmStoreConfig:
    capacity_bytes: int  # payload bytes held at once on this node, spare files included
    lease_s: float
    max_payload_bytes: int  # larger payloads take the object-store path (the client decides)


def store_path(root: Path, app_name: str, cluster_tag: str) -> Path:
    """The store of ``app_name`` in the cluster ``cluster_tag`` (e.g. a hash of its GCS address,
    so two clusters on one machine never share a directory)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", app_name)[:48]
    return root / f"meshserve-kv-{safe}-{cluster_tag}"


class ShmKVStore:
    def __init__(self, path: Path):
        self.path = path
        self.ledger = Ledger(path / "ledger")
        # Plain strings: pathlib costs more than the syscalls on this path.
        self._tmp, self._data, self._spare = (f"{path}/{sub}/" for sub in ("tmp", "data", "spare"))
        self._journal_path = f"{path}/completions"
        self.max_payload_bytes = self.ledger.read().max_payload_bytes

    # -- lifecycle ---------------------------------------------------------------------------

    @staticmethod
    def create(path: Path, config: ShmStoreConfig) -> ShmKVStore:
        """Create the store, or adopt an existing one (a restarted actor keeps its transfers) and
        apply ``config`` to it. Idempotent and safe against concurrent creators."""
        for sub in ("", "tmp", "data", "spare"):
            (path / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
        state = LedgerState(config.capacity_bytes, round(config.lease_s * 1e3), config.max_payload_bytes)
        if not Ledger.create(path / "ledger", state):
            with Ledger(path / "ledger").locked() as s:
                s.capacity_bytes, s.lease_ms, s.max_payload_bytes = (
                    state.capacity_bytes,
                    state.lease_ms,
                    state.max_payload_bytes,
                )
        return ShmKVStore(path)

    @staticmethod
    def open(path: Path) -> ShmKVStore | None:
        try:
            return ShmKVStore(path)
        except (FileNotFoundError, OSError):
            return None

    def destroy(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    # -- producer ----------------------------------------------------------------------------

    def put(self, transfer_id: str, payload: KVPayload, timeout_s: float) -> None:
        """Reserve (waiting up to ``timeout_s`` for capacity), write, commit."""
        header = TransferHeader(transfer_id, payload.descriptor, time.time())
        encoded = header.encode()
        fd = self._reserve(transfer_id, header.num_bytes, encoded, timeout_s)
        try:
            try:
                _write_all(fd, payload.to_wire().reshape(-1).view(np.uint8), len(encoded))
            finally:
                os.close(fd)
        except OSError as e:  # e.g. ENOSPC: the tmpfs is smaller than the configured capacity
            self.cancel(transfer_id)
            raise KVTransferError(f"KV transfer {transfer_id!r}: writing the payload failed: {e}") from e
        self._commit(transfer_id, header.num_bytes)

    def _reserve(self, transfer_id: str, num_bytes: int, header: bytes, timeout_s: float) -> int:
        name = file_name(transfer_id)
        deadline = time.monotonic() + timeout_s
        delay_s = 0.001
        while True:
            fd, rejected = None, None
            with self.ledger.locked() as s:
                if os.path.exists(self._tmp + name) or os.path.exists(self._data + name):
                    raise KVTransferError(f"transfer {transfer_id!r} already exists")
                if num_bytes > s.capacity_bytes:
                    s.num_rejected_too_large += 1
                    rejected = (
                        f"transfer {transfer_id!r} needs {num_bytes} bytes, more than the KV "
                        f"connector's whole capacity ({s.capacity_bytes} bytes)"
                    )
                else:
                    if (
                        s.bytes_live + num_bytes > s.capacity_bytes
                        and time.time() * 1e3 - s.last_sweep_ms > PRODUCER_SWEEP_PERIOD_S * 1e3
                    ):
                        self._sweep_locked(s)
                    fd = self._create_locked(s, name, num_bytes, header)
                    if fd is None and time.monotonic() >= deadline:
                        s.num_rejected_capacity += 1
                        rejected = (
                            f"KV connector full: {s.bytes_live}/{s.capacity_bytes} bytes used, "
                            f"transfer {transfer_id!r} ({num_bytes} bytes) waited {timeout_s:.1f}s"
                        )
            if rejected:
                raise KVCapacityError(rejected)
            if fd is not None:
                return fd
            time.sleep(max(0.0, min(delay_s, deadline - time.monotonic())))
            delay_s = min(delay_s * 2, 0.05)

    def _create_locked(self, s: LedgerState, name: str, num_bytes: int, header: bytes) -> int | None:
        """The reserved file, opened for writing, with its header; None while it does not fit.
        Reuses a spare file nobody maps any more (best fit), evicting other spares for room."""
        if s.bytes_live + num_bytes > s.capacity_bytes:
            return None
        file_bytes = len(header) + num_bytes
        spares = sorted(self._spare_sizes())
        fd = None
        for i in sorted(range(len(spares)), key=lambda i: (spares[i][0] < file_bytes, abs(spares[i][0] - file_bytes))):
            fd = _open_unmapped(self._spare + spares[i][1])
            if fd is not None:
                size, spare_name = spares.pop(i)
                os.rename(self._spare + spare_name, self._tmp + name)
                s.num_spare, s.bytes_spare = s.num_spare - 1, s.bytes_spare - size
                break
        while s.bytes_live + num_bytes + s.bytes_spare > s.capacity_bytes and spares:
            size, spare_name = spares.pop()  # unlinking is safe even while mapped
            _unlink(self._spare + spare_name)
            s.num_spare, s.bytes_spare = s.num_spare - 1, s.bytes_spare - size
        if fd is None:
            fd = os.open(self._tmp + name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.ftruncate(fd, file_bytes)
        os.pwrite(fd, header, 0)  # also stamps the mtime: the lease starts now
        s.num_live, s.bytes_live = s.num_live + 1, s.bytes_live + num_bytes
        return fd

    def _commit(self, transfer_id: str, num_bytes: int) -> None:
        name = file_name(transfer_id)
        with self.ledger.locked() as s:
            try:
                os.rename(self._tmp + name, self._data + name)
            except FileNotFoundError:
                raise KVTransferError(f"transfer {transfer_id!r}: lease expired before commit") from None
            s.num_committed, s.bytes_committed = s.num_committed + 1, s.bytes_committed + num_bytes

    def cancel(self, transfer_id: str) -> None:
        """Free a reservation that will not be committed."""
        path = self._tmp + file_name(transfer_id)
        with self.ledger.locked() as s:
            num_bytes = _charge(path)
            if num_bytes is not None and _unlink(path):
                s.num_live, s.bytes_live = s.num_live - 1, s.bytes_live - num_bytes
                s.num_cancelled += 1

    # -- consumer ----------------------------------------------------------------------------

    def fetch(self, transfer_id: str) -> KVPayload | None:
        """The committed payload, mapped read-only; None if this node's store does not hold it.
        The mapping holds a shared ``flock`` on the file for as long as the payload lives
        (Python's mmap keeps a duplicate of the descriptor), so the file is never reused under a
        reader, even one that outlives ``complete``."""
        path = self._data + file_name(transfer_id)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            if os.fstat(fd).st_ino != os.stat(path).st_ino:
                return None  # completed and recycled between our open and lock
            raw = os.pread(fd, PAGE_BYTES, 0)
            prefix = decode_prefix(raw)
            if prefix.header_bytes > len(raw):
                raw = os.pread(fd, prefix.header_bytes, 0)
            prefix, header = decode_header(raw)
            if header.transfer_id != transfer_id:
                raise KVTransferError(f"transfer file {path} holds {header.transfer_id!r}, not {transfer_id!r}")
            os.utime(fd)  # renews the lease
            mapped = mmap.mmap(fd, prefix.header_bytes + prefix.num_bytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
            array = np.frombuffer(mapped, dtype=np.uint8, count=prefix.num_bytes, offset=prefix.header_bytes)
            return KVPayload.from_wire(header.descriptor, array)
        except FileNotFoundError:
            return None
        finally:
            os.close(fd)  # the mapping keeps its own descriptor (and the lock)

    def contains(self, transfer_id: str) -> bool:
        return os.path.exists(self._data + file_name(transfer_id))

    def complete(self, transfer_id: str) -> bool:
        """Free a committed transfer (the consumer copied it); False if this store lacks it.
        The file goes to ``spare/`` for reuse (a producer takes it only once no mapping of it
        is left), or is unlinked when the spares are full."""
        path = self._data + file_name(transfer_id)
        with self.ledger.locked() as s:
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                return False
            try:
                prefix = decode_prefix(os.pread(fd, PREFIX_BYTES, 0))
                size = os.fstat(fd).st_size
            finally:
                os.close(fd)
            fits = s.bytes_live - prefix.num_bytes + s.bytes_spare + size <= s.capacity_bytes
            try:
                if fits and s.num_spare < MAX_SPARE_FILES:
                    os.rename(path, f"{self._spare}{size:016d}-{uuid.uuid4().hex}")
                    s.num_spare, s.bytes_spare = s.num_spare + 1, s.bytes_spare + size
                else:
                    os.unlink(path)
            except FileNotFoundError:
                return False
            s.num_live, s.bytes_live = s.num_live - 1, s.bytes_live - prefix.num_bytes
            s.num_completed += 1
            self._journal(time.time() - prefix.created_unix_s)
        return True

    # -- housekeeping ------------------------------------------------------------------------

    def sweep(self) -> int:
        """Expire leases and recount the ledger from the directory; returns the number expired."""
        with self.ledger.locked() as s:
            return self._sweep_locked(s)

    def snapshot(self) -> LedgerState:
        return self.ledger.read()

    def drain_latencies(self) -> list[float]:
        """Reserve-to-complete seconds of the transfers completed since the last drain."""
        path = self._journal_path
        with self.ledger.locked():
            try:
                with open(path, "rb") as f:
                    raw = f.read()
            except FileNotFoundError:
                return []
            os.truncate(path, 0)
        return [v for (v,) in _LATENCY.iter_unpack(raw[: len(raw) - len(raw) % _LATENCY.size])]

    def _sweep_locked(self, s: LedgerState) -> int:
        now = time.time()
        num_live = bytes_live = num_expired = 0
        for directory in (self._tmp, self._data):
            for entry in os.scandir(directory):
                try:
                    is_expired = now - entry.stat().st_mtime > s.lease_s
                    num_bytes = _charge(entry.path)
                except FileNotFoundError:
                    continue
                if is_expired or num_bytes is None:  # None: not ours / corrupt: reclaim it too
                    num_expired += _unlink(entry.path)
                else:
                    num_live, bytes_live = num_live + 1, bytes_live + num_bytes
        spares = []
        for size, name in self._spare_sizes():  # idle past a lease: give the memory back
            try:
                is_idle = now - os.stat(self._spare + name).st_mtime > s.lease_s
            except FileNotFoundError:
                continue
            if not (is_idle and _unlink(self._spare + name)):
                spares.append((size, name))
        s.num_live, s.bytes_live = num_live, bytes_live
        s.num_spare, s.bytes_spare = len(spares), sum(size for size, _ in spares)
        s.num_expired += num_expired
        s.last_sweep_ms = int(now * 1e3)
        return num_expired

    def _spare_sizes(self) -> list[tuple[int, str]]:
        out = []
        for name in os.listdir(self._spare):
            size, _, _ = name.partition("-")
            if size.isdigit():
                out.append((int(size), name))
        return out

    def _journal(self, latency_s: float) -> None:
        fd = os.open(self._journal_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < _MAX_JOURNAL_BYTES:
                os.write(fd, _LATENCY.pack(latency_s))
        finally:
            os.close(fd)


def _write_all(fd: int, data: np.ndarray, offset: int) -> None:
    """``data``: a 1-D uint8 array, written whole at ``offset``."""
    view = data.data
    while len(view):
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _charge(path: str) -> int | None:
    """The payload bytes a transfer file is charged; None if it is not a transfer file."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        return decode_prefix(os.pread(fd, PREFIX_BYTES, 0)).num_bytes
    except ValueError:
        return None
    finally:
        os.close(fd)


def _unlink(path: str) -> bool:
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False


def _open_unmapped(path: str) -> int | None:
    """``path`` opened for writing if no process maps it (nobody holds a lock on it), else None."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return None
        raise
    # Keep the lock until close: a straggler that opened the file under its old name before it
    # was recycled then fails its inode check instead of mapping bytes being rewritten.
    return fd
