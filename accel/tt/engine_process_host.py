"""``TTMeshEngineProcess``: the TT mesh engine with its step loop in a process of its own (the
engine core, ``core_process.py``), as vLLM runs ``EngineCore`` apart from ``AsyncLLM``.

Why: in one process the step loop (scheduling, the model's host code) and everything on the
asyncio side (detokenizing, the caller's streaming, HTTP when the engine sits in the ingress)
take turns on one GIL, so the engine gets at most one core for both. Here the core process builds
the model, the KV cache and the ``EngineCore`` and runs the same ``StepLoop`` on its main thread;
this process keeps the tokenizer and the ``RequestStreams`` (the ``OutputBuilder`` per request),
so detokenization and streaming overlap the next step. The messages between the two are
``core_process``'s.

Invariants: every request this process streams is in ``RequestStreams`` until its stream ends;
when the core process dies every open stream ends with ``EngineUnhealthy`` and the health check
fails (the replica is then restarted). PD KV hooks run inside the step loop and call Ray: a pool
with them keeps the in-process engine (``make_tt_engine``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import multiprocessing
import threading
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from accel.block_hash import BlockHash
from accel.contract import (
    EmbeddingResult,
    EmbedRequest,
    EngineStats,
    GenerateRequest,
    OutputDelta,
    PrefixCacheChange,
    TTEngineStats,
)
from accel.text.tokenizer import load_tokenizer
from accel.tt.config import TTEngineConfig
from accel.tt.core_messages import AbortRequest, FinishRequest, InboxMessage
from accel.tt.core_process import (
    CoreFailed,
    CoreQuery,
    CoreReady,
    CoreReply,
    CoreStep,
    CoreStop,
    core_main,
    outputs_from_wire,
)
from accel.tt.health import DEFAULT_STEP_TIMEOUT_S, EngineUnhealthy
from accel.tt.mesh_model import MeshModel
from accel.tt.model_setup import load_hf_config
from accel.tt.pooling import refuse_pooling
from accel.tt.request_checks import check_request
from accel.tt.request_streams import RequestStreams
from accel.tt.step_loop import drain

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 600.0  # model build + warm-up on a real mesh takes minutes


# -- this process's side -----------------------------------------------------------------------


@dataclass
class _CoreView:
    """What the core process last published (written by the receiver thread only)."""

    stats: EngineStats
    extra_stats: TTEngineStats
    num_busy_iterations: int = 0
    host_busy_s: float = 0.0
    kv_events: deque[PrefixCacheChange] = field(default_factory=deque)


class TTMeshEngineProcess:
    """Implements ``accel.contract.Engine``; the mesh, model and step loop live in the core
    process this constructor starts (and waits for: a build error is raised here)."""

    def __init__(
        self,
        config: TTEngineConfig,
        *,
        model_class: type[MeshModel] | None = None,
        step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S,
        accelerator: str = "cpu",
    ):
        self.config = config
        self.step_timeout_s = step_timeout_s
        self.tokenizer = load_tokenizer(config.tokenizer_path)
        self.vocab_size = int(load_hf_config(config.model).vocab_size)
        context = multiprocessing.get_context("spawn")  # (fork would copy threads and locks)
        self._conn, child_conn = context.Pipe()
        self._process = context.Process(
            target=core_main,
            args=(child_conn, config, model_class, step_timeout_s, accelerator),
            name="tt-engine-core",
            daemon=True,
        )
        self._process.start()
        child_conn.close()
        if not self._conn.poll(START_TIMEOUT_S):
            self._process.kill()
            raise RuntimeError(f"the TT engine-core process did not start within {START_TIMEOUT_S:.0f} s")
        try:
            first = self._conn.recv()
        except EOFError:
            first = CoreFailed(f"the TT engine-core process exited with code {self._process.exitcode} while starting")
        if isinstance(first, CoreFailed):
            self._process.join(timeout=10)
            raise RuntimeError(first.error)
        assert isinstance(first, CoreReady)
        self.platform = first.platform
        self.num_blocks_per_lane = first.num_blocks_per_lane
        self.torch_threads = first.torch_threads  # the core's intra-op threads (set_torch_threads_for_serving)
        self._view = _CoreView(first.stats, first.extra_stats)
        self._send_lock = threading.Lock()
        self._replies: dict[int, concurrent.futures.Future[Any]] = {}
        self._seq = itertools.count()
        self._dead: str | None = None  # why the core process is gone
        self._stopping = False
        self._streams = RequestStreams(self.tokenizer, config.max_model_len, self._send)
        self._receiver = threading.Thread(target=self._receive, name="tt-engine-core-reader", daemon=True)
        self._receiver.start()

    # ---- Engine contract ---------------------------------------------------------------------
    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def max_model_len(self) -> int:
        return self.config.max_model_len

    @property
    def core_pid(self) -> int | None:
        """The engine-core process's pid (for CPU accounting)."""
        return self._process.pid

    @property
    def num_busy_iterations(self) -> int:
        return self._view.num_busy_iterations

    @property
    def host_busy_s(self) -> float:
        """The core's step-loop CPU seconds in iterations that ran a step (as of its last step)."""
        return self._view.host_busy_s

    async def generate(self, request: GenerateRequest) -> AsyncIterator[OutputDelta]:
        """As ``TTMeshEngine.generate``; the grammar of a structured-output request is compiled in
        the core process (compiled grammars do not pickle), off its step loop."""
        check_request(request, vocab_size=self.vocab_size, max_model_len=self.max_model_len, can_transfer_kv=False)
        async for delta in self._streams.stream(request):
            yield delta

    async def abort(self, request_id: str) -> None:
        self._send(AbortRequest(request_id))

    async def embed(self, request: EmbedRequest) -> EmbeddingResult:
        refuse_pooling(request)  # generative models only

    def stats(self) -> EngineStats:
        return self._view.stats

    def extra_stats(self) -> TTEngineStats:
        return self._view.extra_stats

    def take_kv_events(self) -> list[PrefixCacheChange]:
        return drain(self._view.kv_events)

    def kv_block_snapshot(self) -> list[BlockHash]:
        """``TTMeshEngine.kv_block_snapshot``, asked of the core process (blocks this thread for
        at most ``step_timeout_s``)."""
        hashes: list[BlockHash] = self._ask("snapshot").result(timeout=self.step_timeout_s)
        return hashes

    async def check_health(self) -> None:
        """Unhealthy when the core process is gone, or its answer (the step loop's stall check and
        the device probe, ``TTMeshEngine.check_health``) is a problem or does not come within
        ``step_timeout_s``."""
        if self._dead is not None or self._stopping:
            raise EngineUnhealthy(self._dead or "the TT mesh engine is shut down")
        try:
            problem = await asyncio.wait_for(asyncio.wrap_future(self._ask("health")), self.step_timeout_s)
        except asyncio.TimeoutError:
            raise EngineUnhealthy(
                f"the TT engine-core process has not answered a health check for {self.step_timeout_s:g} s"
            ) from None
        if problem is not None:
            raise EngineUnhealthy(problem)

    async def shutdown(self) -> None:
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        """Stop the step loop (what it still holds is aborted), then the process."""
        if self._stopping:
            return
        self._stopping = True
        self._streams.close("the TT mesh engine is shut down")
        try:
            self._send(CoreStop())
        except (OSError, EngineUnhealthy):
            pass
        self._process.join(timeout=self.step_timeout_s)
        if self._process.is_alive():
            logger.error("TT engine-core process did not stop within %.0f s; killing it", self.step_timeout_s)
            self._process.kill()
            self._process.join(timeout=10)
        self._receiver.join(timeout=10)

    # ---- the pipe ------------------------------------------------------------------------------
    def _send(self, message: InboxMessage | CoreQuery | CoreStop) -> None:
        if self._dead is not None:
            if isinstance(message, (FinishRequest, AbortRequest)):
                return  # nothing left to free: the core process and its KV are gone
            raise EngineUnhealthy(self._dead)
        with self._send_lock:
            self._conn.send(message)

    def _ask(self, what: str) -> concurrent.futures.Future[Any]:
        seq = next(self._seq)
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._replies[seq] = future
        try:
            self._send(CoreQuery(seq, what))
        except Exception as exc:
            self._replies.pop(seq, None)
            future.set_exception(exc)
        return future

    def _receive(self) -> None:
        """The receiver thread: apply each message of the core process in order."""
        view = self._view
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                break
            if isinstance(message, CoreStep):
                view.stats, view.extra_stats = message.stats, message.extra_stats
                view.num_busy_iterations, view.host_busy_s = message.num_busy_iterations, message.host_busy_s
                view.kv_events.extend(message.kv_events)
                if message.outputs:
                    self._streams.deliver(outputs_from_wire(message.outputs))
            elif isinstance(message, CoreReply):
                future = self._replies.pop(message.seq, None)
                if future is not None:
                    future.set_result(message.value)
        code = self._process.exitcode
        self._dead = (
            "the TT mesh engine is shut down"
            if self._stopping
            else (f"the TT engine-core process exited (code {code})")
        )
        if not self._stopping:
            logger.error("%s; failing every open stream", self._dead)
        error = EngineUnhealthy(self._dead)
        self._streams.close(self._dead)
        self._streams.fail_all(error)
        for future in list(self._replies.values()):
            future.set_exception(error)
        self._replies.clear()
