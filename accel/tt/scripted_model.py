"""``ScriptedMeshModel``: a ``MeshModel`` whose forward is a cheap deterministic function of the
context, read back through the paged KV — for engine tests and the engine benchmark.

It keeps the contract's shapes and semantics (full-width decode with -1 empty slots, lane-local
page tables, ``tokens[start_pos:prompt_lens]`` prefill, device sampling, asynchronous decode
read-back on a one-worker "device" thread, optional fixed device time per step), so scheduling,
paging, prefix caching, preemption and async overlap are checked exactly without a neural net:

    h(-1) = 0;  h(p) = (h(p-1) * 31 + token_p + 1) mod 1_000_003;  next token = 3 + h(p) mod (V - 3)

Each lane's paged cells (lane-local ``(block, offset)`` -> ``(token, h)``) stand in for the K/V
tensors (allocated with the contract's shape, but kept in a dict so the "device" thread barely
holds the GIL), so a wrong page table, a stale prefix-cache block or a lost KV write changes
every later token.
Tokens 0-2 (bos/eos/pad of the tiny checkpoints) are never produced. ``expected_tokens`` is the
reference continuation.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from accel.tt.host_arrays import host_copy
from accel.tt.mesh_model import (
    SUPPORTS_ASYNC_DECODE,
    SUPPORTS_CHUNKED_PREFILL,
    SUPPORTS_DATA_PARALLEL_LANES,
    SUPPORTS_DEVICE_PENALTIES,
    SUPPORTS_PREFIX_CACHING,
    SUPPORTS_SAMPLE_ON_DEVICE,
    TTSamplingParams,
)
from accel.tt.torch_model.device_queue import FutureEvent

_MOD = 1_000_003
_FIRST_TOKEN = 3


def _advance(h: int, token: int) -> int:
    return (h * 31 + token + 1) % _MOD


def expected_tokens(prompt: Sequence[int], num_new: int, vocab_size: int) -> list[int]:
    """The greedy continuation ``ScriptedMeshModel`` must produce for ``prompt``."""
    h, out = 0, []
    for t in prompt:
        h = _advance(h, t)
    for _ in range(num_new):
        token = _FIRST_TOKEN + h % (vocab_size - _FIRST_TOKEN)
        out.append(token)
        h = _advance(h, token)
    return out


@dataclass(frozen=True)
class _TimedOutput:
    """A decode result that the virtual device finishes at ``ready_at`` (perf_counter seconds);
    also its own ``DeviceEvent``."""

    value: Any
    ready_at: float

    def synchronize(self) -> None:
        _sleep_until(self.ready_at)

    def result(self) -> Any:
        self.synchronize()
        return self.value


class ScriptedMeshModel:
    model_capabilities: ClassVar[dict[str, Any]] = {
        SUPPORTS_PREFIX_CACHING: True,
        SUPPORTS_ASYNC_DECODE: True,
        SUPPORTS_SAMPLE_ON_DEVICE: True,
        SUPPORTS_DEVICE_PENALTIES: False,  # no token-history inputs: penalties sample on the host
        SUPPORTS_CHUNKED_PREFILL: True,
        SUPPORTS_DATA_PARALLEL_LANES: True,
    }
    decode_time_s: ClassVar[float] = 0.0  # fixed device time per decode step (benchmark)
    prefill_time_s: ClassVar[float] = 0.0
    # False: decode skips the scripted function, returns token 3 for every row and runs on a
    # virtual device clock (step N+1 starts when both it is submitted and step N is done, and
    # takes decode_time_s) instead of a worker thread: a device that never holds the GIL or
    # waits for a thread wake-up, for benchmarks of host overhead.
    computes_decode: ClassVar[bool] = True

    def __init__(self, vocab_size: int, max_batch_size: int, num_lanes: int, max_seq_len: int):
        self.vocab_size = vocab_size
        self.max_batch_size = max_batch_size
        self.num_lanes = num_lanes
        self.per_lane = max_batch_size // num_lanes
        self.max_seq_len = max_seq_len
        self.kv: list[list[list[torch.Tensor]]] | None = None
        self._cells: list[dict[tuple[int, int], tuple[int, int]]] = [{} for _ in range(num_lanes)]
        self.block_size = 0
        self.num_prefill_calls = 0
        self.num_decode_calls = 0
        self.warmup_calls: list[tuple[str, bool]] = []
        self.device = torch.device("cpu")
        self._device_free_at = 0.0  # virtual device clock (computes_decode=False)
        self._fixed_tokens = torch.full((max_batch_size,), _FIRST_TOKEN)  # its sampled output
        self._device = ThreadPoolExecutor(max_workers=1, thread_name_prefix="scripted-mesh")

    @classmethod
    def initialize_vllm_model(
        cls,
        hf_config: Any,
        mesh_device: Any,
        max_batch_size: int,
        max_seq_len: int = 2048,
        n_layers: int | None = None,
        tt_data_parallel: int = 1,
        optimizations: str | None = None,
    ) -> ScriptedMeshModel:
        return cls(int(hf_config.vocab_size), max_batch_size, tt_data_parallel, max_seq_len)

    def close(self) -> None:
        self._device.shutdown(wait=True)

    def device_ping(self) -> None:
        """Returns once the "device" thread has run everything submitted before it."""
        self._device.submit(lambda: None).result()

    def allocate_kv_cache(
        self, kv_cache_shape: tuple[int, int, int, int], dtype: Any, num_layers: int
    ) -> list[list[list[torch.Tensor]]]:
        self.block_size = kv_cache_shape[2]
        shape = (kv_cache_shape[0], 1, 1, 1)  # the cells hold the data; see the module docstring
        self.kv = [[[torch.zeros(shape), torch.zeros(shape)] for _ in range(num_layers)] for _ in range(self.num_lanes)]
        return self.kv

    # ---- forward ------------------------------------------------------------------------
    def prefill_forward(
        self,
        tokens: Any,
        page_table: Any,
        kv_cache: Any,
        prompt_lens: Sequence[int],
        start_pos: Sequence[int],
        empty_slots: Sequence[int],
        sampling_params: TTSamplingParams | None = None,
        enable_trace: bool = False,
        **kwargs: Any,
    ) -> Any:
        assert kv_cache is self.kv
        tokens = torch.as_tensor(tokens)
        n = tokens.shape[0]
        assert len(prompt_lens) == len(start_pos) == len(empty_slots) == n == page_table.shape[0]
        assert tokens.shape[1] >= max(prompt_lens)
        self.num_prefill_calls += 1
        started = time.perf_counter()
        hashes = []
        table = torch.as_tensor(page_table).tolist()
        token_rows = tokens.tolist()
        for i in range(n):
            lane = int(empty_slots[i]) // self.per_lane
            h = self._read_hash(lane, table[i], int(start_pos[i]) - 1)
            for p in range(int(start_pos[i]), int(prompt_lens[i])):
                h = _advance(h, token_rows[i][p])
                self._write(lane, table[i], p, token_rows[i][p], h)
            hashes.append(h)
        out = self._output(hashes, sampling_params, list(prompt_lens))
        _sleep_until(started + self.prefill_time_s)
        return out

    def decode_forward(
        self,
        tokens: Any,
        start_pos: Any,
        page_table: Any,
        kv_cache: Any,
        enable_trace: bool = True,
        read_from_device: bool = True,
        sampling_params: TTSamplingParams | None = None,
        reset_batch: bool = False,
        **kwargs: Any,
    ) -> Any:
        assert kv_cache is self.kv
        # Snapshots in numpy, as TorchMeshModel takes them (``accel.tt.host_arrays``).
        tokens = host_copy(tokens, np.int64)
        start_pos = host_copy(start_pos, np.int64)
        page_table = host_copy(page_table, np.int64)
        b = self.max_batch_size
        assert tokens.shape == (b, 1) and start_pos.shape == (b,) and page_table.shape[0] == b, (
            "decode must carry every slot"
        )
        self.num_decode_calls += 1

        if not self.computes_decode:
            ready_at = max(time.perf_counter(), self._device_free_at) + self.decode_time_s
            self._device_free_at = ready_at
            out = (
                self._fixed_tokens  # (read-only downstream; built once: torch.full gives up the GIL)
                if sampling_params is not None
                else self._logits(torch.full((b,), _FIRST_TOKEN))[:, None, :]
            )
            timed = _TimedOutput(out, ready_at)
            return timed.result() if read_from_device else timed

        def program() -> Any:
            started = time.perf_counter()
            hashes = []
            positions, token_list = start_pos.tolist(), tokens[:, 0].tolist()  # numpy snapshots
            table = page_table.tolist()
            for row in range(b):
                pos = positions[row]
                if pos < 0:
                    hashes.append(0)  # empty slot: no KV write, output ignored
                    continue
                lane = row // self.per_lane
                h = _advance(self._read_hash(lane, table[row], pos - 1), token_list[row])
                self._write(lane, table[row], pos, token_list[row], h)
                hashes.append(h)
            out = self._output(hashes, sampling_params, (start_pos + 1).tolist())
            _sleep_until(started + self.decode_time_s)
            return out

        future = self._device.submit(program)
        return future.result() if read_from_device else future

    def read_decode_output(self, tt_out: Any, async_read: bool = False) -> Any:
        """tt-metal's: ``(tt_out, events)`` when ``async_read``, else the host output."""
        if async_read:
            if isinstance(tt_out, (Future, _TimedOutput)):
                return tt_out, [FutureEvent(tt_out) if isinstance(tt_out, Future) else tt_out]
            return tt_out, []
        return tt_out.result() if isinstance(tt_out, (Future, _TimedOutput)) else tt_out

    def process_decode_output_host(self, tt_out: Any, is_tokens: bool = False) -> Any:
        result = tt_out.result() if isinstance(tt_out, (Future, _TimedOutput)) else tt_out
        assert is_tokens == (result.dim() == 1), "is_tokens must say whether the decode sampled"
        return result

    def warmup_model_prefill(self, kv_cache: Any, enable_trace: bool, can_sample_on_device: bool) -> None:
        self.warmup_calls.append(("prefill", enable_trace))

    def warmup_model_decode(
        self, kv_cache: Any, enable_trace: bool, max_batch_size: int, num_blocks: int, can_sample_on_device: bool
    ) -> None:
        assert max_batch_size == self.max_batch_size
        self.warmup_calls.append(("decode", enable_trace))

    # ---- internals ----------------------------------------------------------------------
    def _cell(self, table_row: list[int], pos: int) -> tuple[int, int]:
        return table_row[pos // self.block_size], pos % self.block_size

    def _read_hash(self, lane: int, table_row: list[int], pos: int) -> int:
        if pos < 0:
            return 0
        # A never-written cell reads as garbage (-1), like uninitialized device memory would.
        return self._cells[lane].get(self._cell(table_row, pos), (0, -1))[1]

    def _write(self, lane: int, table_row: list[int], pos: int, token: int, h: int) -> None:
        self._cells[lane][self._cell(table_row, pos)] = (token, h)

    def _output(self, hashes: list[int], params: TTSamplingParams | None, positions: list[int]) -> Any:
        v = self.vocab_size
        nxt = [_FIRST_TOKEN + h % (v - _FIRST_TOKEN) for h in hashes]
        if params is None:
            return self._logits(torch.tensor(nxt))[:, None, :]
        ids = list(nxt)
        for i, (temp, top_k, seed) in enumerate(zip(params.temperature, params.top_k, params.seed)):
            if temp <= 0 or top_k == 1:
                continue  # greedy: the scripted token
            gen = torch.Generator()
            gen.manual_seed(
                (int(seed) * 1_000_003 + positions[i]) % (2**63)
                if seed is not None
                else int(torch.randint(0, 2**62, ()).item())
            )
            probs = torch.softmax(self._logits(torch.tensor([nxt[i]]))[0] / temp, dim=-1)
            if 0 < top_k < v:
                kth = probs.topk(int(top_k)).values[-1]
                probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
            ids[i] = int(torch.multinomial(probs, 1, generator=gen)[0])
        tokens = torch.tensor(ids)
        if not any(params.enable_log_probs):
            return tokens
        logprobs = self._logits(torch.tensor(nxt)).log_softmax(-1).gather(1, tokens[:, None]).squeeze(1)
        return tokens, logprobs

    def _logits(self, nxt: torch.Tensor) -> torch.Tensor:
        """The scripted token on top, a smooth ramp below it (so sampling has choices)."""
        v = self.vocab_size
        dist = (torch.arange(v)[None, :] - nxt[:, None]) % v
        logits = -0.05 * dist.float()
        logits[:, :_FIRST_TOKEN] = -1e4
        return logits


def _sleep_until(deadline: float) -> None:
    remaining = deadline - time.perf_counter()
    if remaining > 0:
        time.sleep(remaining)
