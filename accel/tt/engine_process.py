"""The TT engine process (``EngineProcessHost``'s child) and the messages on its pipe.

``engine_process_main`` builds the engine's parts (``build_engine_parts``: model, KV,
``EngineCore``), runs the same ``StepLoop`` as the in-process host on its main thread, and a
receiver thread feeds the loop's inbox and answers queries.

Wire (one ``multiprocessing`` pipe, pickled objects, a send lock per side):
- to the engine process: the inbox messages (``AddRequest`` — its grammar compiled here, by the
  receiver thread, off the step loop: compiled grammars do not pickle —, ``FinishRequest``,
  ``AbortRequest``), ``ProcessQuery`` (a ``Query``: ``SNAPSHOT``, the lanes' cached block hashes;
  ``HEALTH``, the loop's stall check and the device probe) and ``ProcessStop``;
- from the engine process: ``ProcessReady`` / ``ProcessFailed`` once at start, then one
  ``ProcessStep`` per loop iteration that changed something (the step's ``NewTokens`` /
  ``RequestFailed`` with the stats, step stats and KV events as of that iteration) and a
  ``QueryReply`` per query. A step's ``NewTokens`` travel as plain tuples (``outputs_to_wire`` /
  ``outputs_from_wire``).
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from multiprocessing.connection import Connection
from typing import Any

import torch

from accel.block_hash import BlockHash
from accel.contract import EngineStats, InvalidRequestError, PrefixCacheChange, TTEngineStats
from accel.tt.config import TTEngineConfig
from accel.tt.core_messages import AddRequest, NewTokens, OutboxMessage, RequestFailed
from accel.tt.engine_parts import build_engine_parts, lane_block_snapshot
from accel.tt.mesh_model import MeshModel
from accel.tt.multimodal import VisionTraits
from accel.tt.step_loop import StepLoop

# -- the wire ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcessReady:
    platform: str
    num_blocks_per_lane: int
    vision: VisionTraits
    torch_threads: int
    stats: EngineStats
    extra_stats: TTEngineStats


@dataclass(frozen=True)
class ProcessFailed:
    error: str


WireOutput = tuple[Any, ...] | RequestFailed  # a NewTokens as the plain tuple of its fields


def outputs_to_wire(outputs: Sequence[OutboxMessage]) -> list[WireOutput]:
    """Each ``NewTokens`` as a plain tuple. Why: pickle calls a NamedTuple's Python-level
    ``__getnewargs__`` once per instance (about 0.7 us here: ~90 us per 128-row step, on the step
    loop's thread), while a list of plain tuples pickles in C (~25 us with this conversion)."""
    return [tuple(out) if type(out) is NewTokens else out for out in outputs]


def outputs_from_wire(wire: Sequence[WireOutput]) -> list[OutboxMessage]:
    """``outputs_to_wire`` undone (same order; ``tuple.__new__`` skips NewTokens' Python ``__new__``)."""
    new = tuple.__new__
    return [new(NewTokens, out) if type(out) is tuple else out for out in wire]  # type: ignore[misc]


@dataclass(frozen=True)
class ProcessStep:
    outputs: list[WireOutput]  # outputs_to_wire(the iteration's outbox messages)
    stats: EngineStats
    extra_stats: TTEngineStats
    kv_events: list[PrefixCacheChange]
    num_busy_iterations: int
    host_busy_s: float


class Query(Enum):
    """What the front asks the engine process; the answer's type (``QueryReply.value``) after each."""

    SNAPSHOT = "snapshot"  # -> list[BlockHash]: lane_block_snapshot, the lanes' cached block hashes
    HEALTH = "health"  # -> str | None: StepLoop.health_problem (stall check, device probe)


@dataclass(frozen=True)
class ProcessQuery:
    seq: int  # matches the QueryReply
    what: Query


@dataclass(frozen=True)
class QueryReply:
    seq: int
    value: Any


@dataclass(frozen=True)
class ProcessStop:
    pass


# -- the engine process ----------------------------------------------------------------------------


def set_torch_threads_for_serving() -> None:
    """One torch intra-op thread in the engine process unless ``OMP_NUM_THREADS`` says otherwise:
    vLLM's rule for its own engine core (``vllm.utils.torch_utils.set_torch_threads_for_runtime``:
    OMP workers spin-waiting after each parallel region steal the step's serial code's cycles),
    so the engine has vLLM's thread budget. On the torch mesh program here one thread was not
    slower than two (3,704 and 3,273 tok/s against 3,268; docs/BENCHMARKS.md at dbf54f6)."""
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)


def engine_process_main(
    conn: Connection,
    config: TTEngineConfig,
    model_class: type[MeshModel] | None,
    step_timeout_s: float,
    accelerator: str,
) -> None:
    """The engine process: build, report ready, run the step loop on this (main) thread
    while a receiver thread feeds its inbox and answers queries."""
    set_torch_threads_for_serving()
    try:
        parts = build_engine_parts(
            config, model_class=model_class, step_timeout_s=step_timeout_s, accelerator=accelerator
        )
    except BaseException as exc:
        conn.send(ProcessFailed(f"{type(exc).__name__}: {exc}"))
        return
    send_lock = threading.Lock()

    def send(message: Any) -> None:
        with send_lock:
            conn.send(message)

    def step_message(outputs: Sequence[OutboxMessage], kv_events: list[PrefixCacheChange]) -> ProcessStep:
        counters = (loop.num_busy_iterations, loop.host_busy_s)
        return ProcessStep(outputs_to_wire(outputs), loop.stats, loop.extra_stats, kv_events, *counters)

    def publish(outputs: Sequence[OutboxMessage]) -> None:  # (the step loop's thread)
        send(step_message(outputs, loop.take_kv_events()))

    loop = StepLoop(parts.core, parts.grammars, parts.platform, publish)
    send(
        ProcessReady(
            parts.platform,
            parts.num_blocks_per_lane,
            parts.vision,
            torch.get_num_threads(),
            loop.stats,
            loop.extra_stats,
        )
    )

    def answer(query: ProcessQuery) -> list[BlockHash] | str | None:
        if query.what is Query.SNAPSHOT:
            return lane_block_snapshot(parts.core)
        return loop.health_problem(step_timeout_s, parts.device_probe)

    def receive() -> None:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):  # the parent is gone
                break
            if isinstance(message, ProcessStop):
                break
            if isinstance(message, ProcessQuery):
                send(QueryReply(message.seq, answer(message)))
            elif isinstance(message, AddRequest) and message.request.sampling.structured_outputs is not None:
                try:
                    grammar = parts.grammars.compile_sync(message.request.sampling.structured_outputs)
                except InvalidRequestError as exc:
                    # (KV events stay with the loop's thread, which sends them in order.)
                    send(step_message([RequestFailed(message.req_id, exc)], []))
                    continue
                loop.post(dataclasses.replace(message, grammar=grammar))
            else:
                loop.post(message)
        loop.stop()

    threading.Thread(target=receive, name="tt-engine-process-inbox", daemon=True).start()
    try:
        loop.run()
    finally:
        parts.close()
        try:
            publish([])  # the last stats
        except (OSError, ValueError):
            pass
        conn.close()
