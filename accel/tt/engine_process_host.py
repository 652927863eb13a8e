"""``EngineProcessHost``: the TT engine's step loop in a process of its own (the engine process,
``engine_process.py``), as vLLM runs ``EngineCore`` apart from ``AsyncLLM``.

Why: in one process the step loop (scheduling, the model's host code) and everything on the
asyncio side (detokenizing, the caller's streaming, HTTP when the engine sits in the ingress)
take turns on one GIL, so the engine gets at most one core for both. Here the engine process
builds the model, the KV cache and the ``EngineCore`` and runs the same ``StepLoop`` on its main
thread; this process keeps the tokenizer and the front's ``RequestStreams`` (the
``OutputBuilder`` per request), so detokenization and streaming overlap the next step. The
messages between the two are ``engine_process``'s.

Invariants: when the engine process dies every open stream ends with ``EngineUnhealthy`` and the
health check fails (the replica is then restarted). PD KV hooks run inside the step loop and call
Ray: a pool with them keeps the in-process host (``make_tt_engine``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import multiprocessing
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from accel.block_hash import BlockHash
from accel.contract import EngineStats, GenerateRequest, PrefixCacheChange, TTEngineStats
from accel.text.tokenizer import load_tokenizer
from accel.tt.config import TTEngineConfig
from accel.tt.core_messages import AbortRequest, FinishRequest, InboxMessage
from accel.tt.engine_process import (
    ProcessFailed,
    ProcessQuery,
    ProcessReady,
    ProcessStep,
    ProcessStop,
    Query,
    QueryReply,
    engine_process_main,
    outputs_from_wire,
)
from accel.tt.health import EngineUnhealthy
from accel.tt.mesh_model import MeshModel
from accel.tt.model_setup import load_hf_config, text_config
from accel.tt.request_streams import RequestStreams
from accel.tt.step_loop import drain

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 600.0  # model build + warm-up on a real mesh takes minutes
SHUT_DOWN = "the TT mesh engine is shut down"


@dataclass
class _ProcessView:
    """What the engine process last published (written by the receiver thread only)."""

    stats: EngineStats
    extra_stats: TTEngineStats
    num_busy_iterations: int = 0
    host_busy_s: float = 0.0
    kv_events: deque[PrefixCacheChange] = field(default_factory=deque)


class EngineProcessHost:
    """A ``StepLoopHost`` whose mesh, model and step loop live in the engine process this
    constructor starts (and waits for: a build error is raised here)."""

    def __init__(
        self,
        config: TTEngineConfig,
        *,
        model_class: type[MeshModel] | None,
        step_timeout_s: float,
        accelerator: str,
    ):
        self.step_timeout_s = step_timeout_s
        self.tokenizer = load_tokenizer(config.tokenizer_path)
        self.vocab_size = int(text_config(load_hf_config(config.model)).vocab_size)
        context = multiprocessing.get_context("spawn")  # (fork would copy threads and locks)
        self._conn, child_conn = context.Pipe()
        self._process = context.Process(
            target=engine_process_main,
            args=(child_conn, config, model_class, step_timeout_s, accelerator),
            name="tt-engine-process",
            daemon=True,
        )
        self._process.start()
        child_conn.close()
        ready = self._wait_ready()
        self.platform = ready.platform
        self.num_blocks_per_lane = ready.num_blocks_per_lane
        self.vision = ready.vision
        self._torch_threads = ready.torch_threads  # (set_torch_threads_for_serving)
        self._view = _ProcessView(ready.stats, ready.extra_stats)
        self._send_lock = threading.Lock()
        self._replies: dict[int, concurrent.futures.Future[Any]] = {}
        self._seq = itertools.count()
        self._dead: str | None = None  # why the engine process is gone
        self._stopping = False
        self._streams: RequestStreams | None = None
        self._receiver = threading.Thread(target=self._receive, name="tt-engine-process-reader", daemon=True)

    def _wait_ready(self) -> ProcessReady:
        if not self._conn.poll(START_TIMEOUT_S):
            self._process.kill()
            raise RuntimeError(f"the TT engine-core process did not start within {START_TIMEOUT_S:.0f} s")
        try:
            first = self._conn.recv()
        except EOFError:
            code = self._process.exitcode
            first = ProcessFailed(f"the TT engine-core process exited with code {code} while starting")
        if isinstance(first, ProcessFailed):
            self._process.join(timeout=10)
            raise RuntimeError(first.error)
        assert isinstance(first, ProcessReady)
        return first

    @property
    def can_transfer_kv(self) -> bool:
        return False  # PD KV hooks call Ray from the step loop: in-process only

    @property
    def pid(self) -> int | None:
        return self._process.pid

    @property
    def process(self) -> multiprocessing.process.BaseProcess:
        return self._process

    @property
    def torch_threads(self) -> int:
        return self._torch_threads

    @property
    def num_busy_iterations(self) -> int:
        return self._view.num_busy_iterations

    @property
    def host_busy_s(self) -> float:
        """As of the engine process's last step."""
        return self._view.host_busy_s

    def start(self, streams: RequestStreams) -> None:
        self._streams = streams
        self._receiver.start()

    async def admit(self, request: GenerateRequest) -> Any:
        """Nothing here: a structured-output grammar is compiled in the engine process (compiled
        grammars do not pickle), off its step loop."""
        return None

    def post(self, message: InboxMessage) -> None:
        self._send(message)

    def stats(self) -> EngineStats:
        return self._view.stats

    def extra_stats(self) -> TTEngineStats:
        return self._view.extra_stats

    def take_kv_events(self) -> list[PrefixCacheChange]:
        return drain(self._view.kv_events)

    def kv_block_snapshot(self) -> list[BlockHash]:
        """Asked of the engine process (blocks this thread for at most ``step_timeout_s``)."""
        hashes: list[BlockHash] = self._ask(Query.SNAPSHOT).result(timeout=self.step_timeout_s)
        return hashes

    async def health_problem(self) -> str | None:
        """The engine process is gone, or its answer (the step loop's stall check and the device
        probe) is a problem or does not come within ``step_timeout_s``."""
        if self._dead is not None or self._stopping:
            return self._dead or SHUT_DOWN
        try:
            future = asyncio.wrap_future(self._ask(Query.HEALTH))
            problem: str | None = await asyncio.wait_for(future, self.step_timeout_s)
        except asyncio.TimeoutError:
            return f"the TT engine-core process has not answered a health check for {self.step_timeout_s:g} s"
        return problem

    def stop(self) -> None:
        self._stopping = True
        try:
            self._send(ProcessStop())
        except (OSError, EngineUnhealthy):
            pass
        self._process.join(timeout=self.step_timeout_s)
        if self._process.is_alive():
            logger.error("TT engine-core process did not stop within %.0f s; killing it", self.step_timeout_s)
            self._process.kill()
            self._process.join(timeout=10)
        if self._receiver.is_alive():
            self._receiver.join(timeout=10)

    # ---- the pipe ------------------------------------------------------------------------------
    def _send(self, message: InboxMessage | ProcessQuery | ProcessStop) -> None:
        if self._dead is not None:
            if isinstance(message, (FinishRequest, AbortRequest)):
                return  # nothing left to free: the engine process and its KV are gone
            raise EngineUnhealthy(self._dead)
        with self._send_lock:
            self._conn.send(message)

    def _ask(self, what: Query) -> concurrent.futures.Future[Any]:
        seq = next(self._seq)
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._replies[seq] = future
        try:
            self._send(ProcessQuery(seq, what))
        except Exception as exc:
            self._replies.pop(seq, None)
            future.set_exception(exc)
        return future

    def _receive(self) -> None:
        """The receiver thread: apply each message of the engine process in order."""
        view, streams = self._view, self._streams
        assert streams is not None
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                break
            if isinstance(message, ProcessStep):
                view.stats, view.extra_stats = message.stats, message.extra_stats
                view.num_busy_iterations, view.host_busy_s = message.num_busy_iterations, message.host_busy_s
                view.kv_events.extend(message.kv_events)
                if message.outputs:
                    streams.deliver(outputs_from_wire(message.outputs))
            elif isinstance(message, QueryReply):
                future = self._replies.pop(message.seq, None)
                if future is not None:
                    future.set_result(message.value)
        self._on_exit(streams)

    def _on_exit(self, streams: RequestStreams) -> None:
        """The pipe closed: the engine process is gone. Every open stream and pending query
        fails with ``EngineUnhealthy``; new requests are refused."""
        code = self._process.exitcode
        self._dead = SHUT_DOWN if self._stopping else f"the TT engine-core process exited (code {code})"
        if not self._stopping:
            logger.error("%s; failing every open stream", self._dead)
        error = EngineUnhealthy(self._dead)
        streams.close(self._dead)
        streams.fail_all(error)
        for future in list(self._replies.values()):
            future.set_exception(error)
        self._replies.clear()
