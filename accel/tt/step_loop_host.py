"""Where a TT mesh engine's step loop runs, as the one front (``TTMeshEngine``) sees it.

Two hosts implement it: ``StepThreadHost`` (a thread of the front's own process) and
``EngineProcessHost`` (a spawned engine process, as vLLM runs ``EngineCore`` apart from
``AsyncLLM``). The front owns the tokenizer side (``RequestStreams``: detokenizing, stop strings,
the per-request queues); the host owns the model, the KV and the ``EngineCore``, takes inbox
messages (``post``) and hands each step's outbox messages to the streams given to ``start``.
"""

from __future__ import annotations

from typing import Any, Protocol

from accel.block_hash import BlockHash
from accel.contract import EngineStats, GenerateRequest, PrefixCacheChange, TTEngineStats
from accel.text.tokenizer import TextTokenizer
from accel.tt.core_messages import InboxMessage
from accel.tt.multimodal import VisionTraits
from accel.tt.request_streams import RequestStreams


class StepLoopHost(Protocol):
    """Built ready (model built and warmed up, or the engine process reported ready: a build error
    is raised by the constructor); ``start`` then runs the loop. Every method but ``admit``,
    ``health_problem`` and ``stop`` is safe from any thread and never blocks past
    ``step_timeout_s``."""

    tokenizer: TextTokenizer
    vocab_size: int
    vision: VisionTraits
    platform: str
    num_blocks_per_lane: int

    @property
    def can_transfer_kv(self) -> bool:
        """Whether PD KV hooks run inside the loop (requests with ``kv_transfer`` are refused
        otherwise)."""
        ...

    @property
    def pid(self) -> int | None:
        """The engine process's pid (CPU accounting); None when the loop runs in this process."""
        ...

    @property
    def torch_threads(self) -> int:
        """Torch intra-op threads where the model runs."""
        ...

    @property
    def num_busy_iterations(self) -> int: ...

    @property
    def host_busy_s(self) -> float:
        """Step-loop CPU seconds in iterations that ran a step."""
        ...

    def start(self, streams: RequestStreams) -> None:
        """Run the loop; each iteration's outbox messages go to ``streams.deliver`` (called on the
        loop's thread, or this process's receiver thread). When the loop dies on its own (the
        engine process exited) the host closes and fails ``streams``."""
        ...

    async def admit(self, request: GenerateRequest) -> Any:
        """Work done before the request is posted, off the step loop: the compiled
        structured-output grammar to post with it (None: none, or compiled by the host itself),
        a KV import's prefetch."""
        ...

    def post(self, message: InboxMessage) -> None: ...

    def stats(self) -> EngineStats: ...

    def extra_stats(self) -> TTEngineStats: ...

    def take_kv_events(self) -> list[PrefixCacheChange]: ...

    def kv_block_snapshot(self) -> list[BlockHash]: ...

    async def health_problem(self) -> str | None:
        """Why the loop is not healthy (gone, hung, device queue not answering), None if it is."""
        ...

    def stop(self) -> None:
        """Stop the loop (what it still holds is aborted) and release the model and device.
        Called once, after the front refused new requests."""
        ...
