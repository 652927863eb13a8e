"""The on-disk form of one transfer in the shared-memory KV store.

A transfer file is ``[header, padded to whole 4 KiB pages][payload bytes]``: the payload starts
page-aligned, so a consumer maps the file and views the payload in place (``torch.frombuffer``
needs no copy and no alignment fix-up). Header: a fixed prefix (magic, sizes, creation time), the
transfer id (UTF-8; the file name is only its hash) and the pickled ``KVDescriptor``.
File names are the first 40 hex digits of the id's SHA-256: any id is a safe, fixed-length name.
"""

from __future__ import annotations

import hashlib
import pickle
import struct
from dataclasses import dataclass

from accel.kv_transfer.payload import KVDescriptor

PAGE_BYTES = 4096
_MAGIC = b"MSKVXFR1"
# magic, header_bytes, num_bytes (payload), created (unix s), len(transfer id), len(descriptor)
_PREFIX = struct.Struct("<8sIqdII")
PREFIX_BYTES = _PREFIX.size


@dataclass(frozen=True)
class TransferHeader:
    transfer_id: str
    descriptor: KVDescriptor
    created_unix_s: float  # reserve time, for the reserve-to-complete latency metric

    @property
    def num_bytes(self) -> int:
        return self.descriptor.num_bytes

    def encode(self) -> bytes:
        """The whole header, padded to ``header_bytes(...)``."""
        tid, desc = self.transfer_id.encode(), pickle.dumps(self.descriptor, protocol=pickle.HIGHEST_PROTOCOL)
        body_len = PREFIX_BYTES + len(tid) + len(desc)
        size = -(-body_len // PAGE_BYTES) * PAGE_BYTES
        prefix = _PREFIX.pack(_MAGIC, size, self.num_bytes, self.created_unix_s, len(tid), len(desc))
        return prefix + tid + desc + bytes(size - body_len)


@dataclass(frozen=True)
class HeaderPrefix:
    header_bytes: int  # the payload's offset in the file
    num_bytes: int  # payload bytes (what the ledger charges)
    created_unix_s: float
    transfer_id_len: int
    descriptor_len: int


def decode_prefix(raw: bytes) -> HeaderPrefix:
    if len(raw) < PREFIX_BYTES or raw[:8] != _MAGIC:
        raise ValueError("not a KV transfer file")
    return HeaderPrefix(*_PREFIX.unpack_from(raw)[1:])


def decode_header(raw: bytes) -> tuple[HeaderPrefix, TransferHeader]:
    """``raw``: at least the whole header."""
    p = decode_prefix(raw)
    tid_end = PREFIX_BYTES + p.transfer_id_len
    transfer_id = raw[PREFIX_BYTES:tid_end].decode()
    descriptor = pickle.loads(raw[tid_end : tid_end + p.descriptor_len])
    return p, TransferHeader(transfer_id, descriptor, p.created_unix_s)


def file_name(transfer_id: str) -> str:
    return hashlib.sha256(transfer_id.encode()).hexdigest()[:40]
