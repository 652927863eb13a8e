"""Follow one vLLM engine's KV cache events (ZMQ) in the router's hash space.

vLLM's engine core publishes ``KVEventBatch`` messages (msgpack; ``vllm.distributed.kv_events``)
on a ZMQ PUB socket as multipart ``(topic, seq: 8-byte big-endian, payload)`` when its
``kv_events_config`` enables them. A vLLM replica binds that socket on its own ``ipc://`` path
(``new_ipc_endpoint``), and this subscriber, in a daemon thread of the replica process, decodes
each batch, rekeys it with ``VLLMEventTranslator`` (vLLM hash -> ``accel.block_hash``) and keeps:

- ``take_events()``: the translated events since the previous call (the router poll's
  ``kv_events``), in publication order;
- ``snapshot()``: the blocks the engine holds now, as this subscriber has seen them (stored
  minus removed, oldest first), and ``snapshot_tiers()`` those held only off the device. vLLM
  has no snapshot call, so this accumulated view is what a restarted router resyncs from.

Invariant: the snapshot equals the fold of every event ever returned by ``take_events`` (both are
updated under one lock from the same translated batch), so snapshot-then-events never loses or
double-counts a block. Blocks vLLM stored before we connected, or in a batch ZMQ dropped (a
sequence gap) are fetched from the publisher's replay socket (it keeps the last
``buffer_steps`` batches); what replay cannot return is counted in ``num_missed_batches`` and is
missing from both until evicted / stored again.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import uuid
from typing import Any

from accel.block_hash import BlockHash
from deployments.messages.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent, Tier
from deployments.replicas.vllm_kv_events import VLLMEventTranslator

logger = logging.getLogger(__name__)

POLL_TIMEOUT_MS = 100  # how often the thread checks for close()
REPLAY_TIMEOUT_MS = 1000  # the publisher answers a replay request from its own thread loop


def new_ipc_endpoint() -> str:
    """A fresh ``ipc://`` path for one engine's publisher (unique per replica and process)."""
    return f"ipc://{os.path.join(tempfile.gettempdir(), f'meshserve-kv-{uuid.uuid4().hex[:12]}.sock')}"


def replay_endpoint(endpoint: str) -> str:
    """The publisher's replay (ROUTER) socket next to its PUB ``endpoint``."""
    return endpoint.removesuffix(".sock") + "-replay.sock"


def kv_events_config(endpoint: str, topic: str = "kv") -> dict[str, Any]:
    """vLLM's ``kv_events_config`` (``vllm.config.kv_events.KVEventsConfig``) publishing on
    ``endpoint``, with a replay socket so that batches missed while connecting are fetched."""
    return {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": endpoint,
        "replay_endpoint": replay_endpoint(endpoint),
        "topic": topic,
    }


class VllmKVEventSubscriber:
    """SUB socket on ``endpoint`` + translator at the engine's ``block_size``; ``close()`` to stop."""

    def __init__(self, endpoint: str, block_size: int, topic: str = "kv") -> None:
        import zmq

        self.endpoint = endpoint
        self.block_size = block_size
        self._translator = VLLMEventTranslator(block_size)
        self._lock = threading.Lock()
        self._pending: list[KVEvent] = []
        # the router's fold of our events, each block's fastest tier; insertion order = age
        self._held: dict[BlockHash, Tier] = {}
        self._last_seq: int | None = None
        self.num_batches = 0
        self.num_missed_batches = 0
        self._ctx = zmq.Context()
        self._replay_endpoint = replay_endpoint(endpoint)
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self._sock.connect(endpoint)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vllm-kv-events", daemon=True)
        self._thread.start()

    @property
    def num_skipped_blocks(self) -> int:
        return self._translator.num_skipped_blocks

    def take_events(self) -> tuple[KVEvent, ...]:
        with self._lock:
            events, self._pending = tuple(self._pending), []
        return events

    def snapshot(self) -> tuple[BlockHash, ...]:
        with self._lock:
            return tuple(self._held)

    def snapshot_tiers(self) -> tuple[tuple[BlockHash, Tier], ...]:
        """The blocks of ``snapshot`` held only off the device, with their fastest tier."""
        with self._lock:
            return tuple((h, tier) for h, tier in self._held.items() if tier != "device")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)
        self._sock.close(linger=0)
        self._ctx.term()
        for endpoint in (self.endpoint, self._replay_endpoint):
            if endpoint.startswith("ipc://"):
                try:
                    os.unlink(endpoint[len("ipc://") :])
                except OSError:
                    pass

    # -- thread -----------------------------------------------------------------------------------

    def _run(self) -> None:
        import msgspec
        from vllm.distributed.kv_events import KVEventBatch

        decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        while not self._stop.is_set():
            try:
                if not self._sock.poll(POLL_TIMEOUT_MS):
                    continue
                _topic, seq_bytes, payload = self._sock.recv_multipart()
                self._on_message(int.from_bytes(seq_bytes, "big"), payload, decoder)
            except Exception:
                if self._stop.is_set():
                    return
                logger.exception("vLLM KV event batch dropped")

    def _on_message(self, seq: int, payload: bytes, decoder: Any) -> None:
        expected = 0 if self._last_seq is None else self._last_seq + 1
        if seq < expected:
            return  # already applied (replayed)
        if seq > expected:
            for replayed_seq, replayed in self._replay(expected):
                if expected <= replayed_seq < seq:
                    self._on_batch(replayed_seq, decoder.decode(replayed).events)
            expected = 0 if self._last_seq is None else self._last_seq + 1
            if seq > expected:
                self.num_missed_batches += seq - expected
                logger.warning("vLLM KV events: %d batch(es) before seq %d lost", seq - expected, seq)
        self._on_batch(seq, decoder.decode(payload).events)

    def _replay(self, start_seq: int) -> list[tuple[int, bytes]]:
        """Batches from ``start_seq`` on, from the publisher's replay buffer ([] if it does not answer)."""
        import zmq

        sock = self._ctx.socket(zmq.DEALER)
        try:
            sock.connect(self._replay_endpoint)
            sock.send_multipart((b"", start_seq.to_bytes(8, "big")))
            out: list[tuple[int, bytes]] = []
            while sock.poll(REPLAY_TIMEOUT_MS):
                _empty, _topic, seq_bytes, payload = sock.recv_multipart()
                seq = int.from_bytes(seq_bytes, "big", signed=True)
                if seq < 0:  # the publisher's END_SEQ
                    return out
                out.append((seq, payload))
            logger.warning("vLLM KV events: no replay answer from %s", self._replay_endpoint)
            return out
        finally:
            sock.close(linger=0)

    def _on_batch(self, seq: int, vllm_events: list[Any]) -> None:
        self._last_seq = seq
        with self._lock:
            events = self._translator.translate(vllm_events)
            for event in events:
                self._fold(event)
            self._pending.extend(events)
            self.num_batches += 1

    def _fold(self, event: KVEvent) -> None:
        if isinstance(event, BlockStored):
            for h in event.block_hashes:
                self._held[h] = event.tier
        elif isinstance(event, BlockRemoved):
            for h in event.block_hashes:
                self._held.pop(h, None)
        elif isinstance(event, AllBlocksCleared):
            self._held.clear()
