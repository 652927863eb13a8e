"""The one place where bookkeeping becomes tensors: ``StepPlan`` -> one ``MeshModel`` call.

Decode: every slot is on the wire (``B_wire = lanes * per_lane``, row == global slot); empty
rows carry token 0, position -1 and a zero page-table row. Prefill: only the scheduled rows,
front-packed in plan order, each with its full token row up to the chunk end. Exactly one mesh
dispatch per non-empty plan (``num_dispatches`` counts them).

Sampling happens inside the program when ``SamplingPolicy`` allows the whole batch, else the
program returns logits and ``host_sampler`` samples the rows that emit a token.

The step thread stages its inputs in numpy and hands the model torch views of them: a small
torch op on this thread gives up the GIL and can wait a whole switch interval to get it back
(``host_arrays``). A steady decode step releases it only to wait for the mesh.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from accel.contract import TokenLogprob
from accel.structured.constraint import LogitsConstraint
from accel.tt.config import TTEngineConfig
from accel.tt.decode_contract import DecodeContract
from accel.tt.device_sampling_args import device_sampling_params, penalty_histories
from accel.tt.host_arrays import host_array
from accel.tt.host_sampler import sample_on_host
from accel.tt.mesh_model import MeshModel, TTSamplingParams
from accel.tt.model_output import HostOutput, device_logprobs, finalize_decode, unpack_output
from accel.tt.multimodal import TEXT_ONLY, RopeDeltas, VisionTraits, prefill_image_kwargs, split_prefill_output
from accel.tt.sampling_policy import SamplingPolicy
from accel.tt.step_plan import PENDING_TOKEN, RowPlan, StepMode, StepPlan

NO_TOKEN = -1  # a row that samples nothing this step (intermediate prefill chunk)
NON_GREEDY_KEYWORD = "non_greedy_decoding_on_device"  # required by some tt-metal warmup revisions


@dataclass(frozen=True)
class StepResult:
    token_ids: tuple[int, ...]  # one per plan row (plan order); NO_TOKEN where nothing is sampled
    logprobs: tuple[TokenLogprob | None, ...] | None  # per plan row, when any row asked
    is_device_sampled: bool

    def tokens_by_row(self, plan: StepPlan) -> dict[int, int]:
        return {r.row: t for r, t in zip(plan.rows, self.token_ids)}


class PendingStep:
    """A submitted step. ``wait()`` blocks until the mesh is done (once) and returns the program
    output; ``finalize()`` turns it into a ``StepResult`` (host sampling happens here)."""

    def __init__(
        self,
        plan: StepPlan,
        wait_fn: Callable[[], Any],
        result_fn: Callable[[Any], StepResult],
        is_device_sampled: bool,
    ):
        self.plan = plan
        self.is_device_sampled = is_device_sampled
        self._wait_fn: Callable[[], Any] | None = wait_fn
        self._result_fn = result_fn
        self._output: Any = None
        self._result: StepResult | None = None

    def wait(self) -> Any:
        if self._wait_fn is not None:
            self._output, self._wait_fn = self._wait_fn(), None
        return self._output

    def finalize(self) -> StepResult:
        if self._result is None:
            self._result = self._result_fn(self.wait())
        return self._result

    def slot_tokens(self) -> Any | None:
        """Device-sampled decode: the token of every slot, int64 ``[B_wire]`` (waits); else None."""
        if not (self.plan.is_decode and self.is_device_sampled):
            return None
        output: HostOutput = self.wait()
        return output.values


@dataclass
class PreparedStep:
    """A step's inputs built before the previous step's tokens are known (off the critical path).
    Decode only fills ``tokens`` at ``pending_rows`` (int64 index) once those tokens exist."""

    plan: StepPlan
    use_device: bool
    decode_kwargs: dict[str, Any] | None = None  # decode: every decode_forward kwarg but tokens
    tokens: Any = None  # decode: numpy int64 [B_wire, 1] (fed tokens are written in place)
    pending_rows: Any = None  # decode: numpy int64 [k], rows fed by the previous step
    # decode with a changed batch: rows whose next decode must take the host's inputs (their
    # slots' device-side state is another request's; see MeshModel's ``use_host_inputs``)
    host_input_rows: tuple[int, ...] = ()


class MeshRunner:
    def __init__(
        self,
        model: MeshModel,
        kv_cache: Any,
        config: TTEngineConfig,
        policy: SamplingPolicy,
        eos_token_ids: frozenset[int],
        vocab_size: int,
        vision: VisionTraits = TEXT_ONLY,
    ):
        self.model = model
        self.vision = vision
        # mrope classes: each request's rotary delta (the engine core drops it when it ends)
        self.rope_deltas = RopeDeltas()
        self.kv_cache = kv_cache
        self.config = config
        self.policy = policy
        self.eos_token_ids = eos_token_ids
        self.vocab_size = vocab_size
        self.num_dispatches = 0
        # Set by AsyncDecodeQueue. False: the plugin's synchronous read-back, process_decode_output_host
        # straight on the device output (no read_decode_output).
        self.read_back_async = True
        # req id -> its logit masks, for constrained requests while they run (the engine core
        # registers and drops them); rows of these requests always sample on the host.
        self.constraints: dict[str, LogitsConstraint] = {}
        self._generator = torch.Generator()
        self._generator.manual_seed(config.seed)
        capacity = config.max_num_seqs_global
        width = config.max_num_blocks_per_req
        # Persistent host page table for decode (numpy: see the module docstring): rows change
        # only when a request gains a block; each step hands the model a copy.
        self._page_table = np.zeros((capacity, width), dtype=np.int32)
        self._row_blocks: list[tuple[int, ...]] = [()] * capacity
        self._last_decode_layout: tuple[tuple[int, str], ...] | None = None
        self._last_sampling: TTSamplingParams | None = None  # for that layout (params are per request)
        self._last_use_device = False  # the policy's decision for that layout
        # Optional model call (MeshModel): which slots take the host's inputs at a decode whose
        # batch changed (TtnnMeshModel.use_host_inputs: tt-metal's async-ahead keep;
        # TorchMeshModel's: its per-slot decode context).
        self._mark_host_inputs = getattr(model, "use_host_inputs", None)
        trace_mode = config.tt.trace_mode
        self._decode_trace = trace_mode in ("all", "decode_only")
        self._prefill_trace = trace_mode == "all"
        self.contract = DecodeContract(model, decode_trace=self._decode_trace, width=capacity)
        if self.contract.version >= 1:
            self._mark_host_inputs = None  # the commands say which inputs are authoritative

    # ---- warmup -------------------------------------------------------------------------
    def warmup(self) -> None:
        """Compile every shape, then capture traces (§7, the plugin's ``warmup_model``); prefill
        traces only with trace_mode=all. Always by keyword: real signatures take ``kv_cache``
        first. ``non_greedy_decoding_on_device`` goes to the tt-metal revisions that name it."""
        mode = self.config.tt.sample_on_device_mode
        prefill_kwargs: dict[str, Any] = {"kv_cache": self.kv_cache, "can_sample_on_device": mode == "all"}
        decode_kwargs: dict[str, Any] = {
            "kv_cache": self.kv_cache,
            "max_batch_size": self.config.max_num_seqs_global,
            "num_blocks": self.config.max_num_blocks_per_req,
            "can_sample_on_device": mode in ("all", "decode_only"),
        }
        for call, kwargs in (
            (self.model.warmup_model_prefill, prefill_kwargs),
            (self.model.warmup_model_decode, decode_kwargs),
        ):
            if accepts_keyword(call, NON_GREEDY_KEYWORD):
                kwargs[NON_GREEDY_KEYWORD] = bool(kwargs["can_sample_on_device"])
        self.model.warmup_model_prefill(enable_trace=False, **prefill_kwargs)
        self.model.warmup_model_decode(enable_trace=False, **decode_kwargs)
        if hasattr(self.model, "already_warmed_up_prefill"):
            self.model.already_warmed_up_prefill = False
        if self._prefill_trace:
            self.model.warmup_model_prefill(enable_trace=True, **prefill_kwargs)
        if self._decode_trace:
            self.model.warmup_model_decode(enable_trace=True, **decode_kwargs)

    # ---- execution ----------------------------------------------------------------------
    def submit(self, plan: StepPlan, fed_tokens: Mapping[int, int] | None = None) -> PendingStep:
        """``prepare`` + ``launch``; ``fed_tokens`` (row -> token) resolves ``PENDING_TOKEN``s."""
        return self.launch(self.prepare(plan), fed_tokens=fed_tokens)

    def prepare(self, plan: StepPlan) -> PreparedStep:
        """Everything of ``plan``'s mesh call that does not need the previous step's tokens."""
        assert plan.mode is not StepMode.EMPTY
        if not plan.is_decode:
            return PreparedStep(plan, self.policy.use_device(plan))
        capacity, rows = plan.capacity, plan.rows
        layout = plan.layout
        reset_batch = layout != self._last_decode_layout
        host_input_rows: tuple[int, ...] = ()
        if reset_batch:  # same requests in the same slots: same sampling decision as last step
            was_device = self._last_use_device
            self._last_use_device = self.policy.use_device(plan)
            host_input_rows = self._host_input_rows(layout, self._last_use_device and not was_device)
        use_device = self._last_use_device
        tokens = [0] * capacity
        positions = [-1] * capacity
        pending_rows = []
        for r in rows:
            token = r.input_token_ids[0]
            if token == PENDING_TOKEN:
                pending_rows.append(r.row)
            else:
                tokens[r.row] = token
            positions[r.row] = r.start_pos
        table_changed = self._update_page_table(rows)
        self._last_decode_layout = layout
        kwargs: dict[str, Any] = {
            "start_pos": torch.tensor(positions, dtype=torch.int32),
            "page_table": torch.from_numpy(self._page_table.copy()),
        }
        if use_device:
            if reset_batch or self._last_sampling is None:
                self._last_sampling = device_sampling_params(rows, capacity, self.vocab_size, by_slot=True)
            kwargs["sampling_params"] = self._last_sampling
        kwargs.update(
            self.contract.decode_kwargs(
                layout_changed=reset_batch, on_device=use_device, page_table_changed=table_changed
            )
        )
        if self.vision.uses_mrope:
            kwargs["rope_deltas_all_users"] = self.rope_deltas.by_slot(layout, capacity) if reset_batch else None
        tokens_host = np.array(tokens, dtype=np.int64).reshape(capacity, 1)
        return PreparedStep(
            plan,
            use_device,
            kwargs,
            tokens_host,
            np.array(pending_rows, dtype=np.int64) if pending_rows else None,
            host_input_rows,
        )

    def _host_input_rows(self, layout: tuple[tuple[int, str], ...], is_switch_to_device: bool) -> tuple[int, ...]:
        """Rows of a changed decode batch whose slots' device-side state says nothing about their
        requests: a new occupant's; every row's when sampling moves from the host to the device
        (the device's token buffers then hold the host-sampled steps' inputs)."""
        if is_switch_to_device or self._last_decode_layout is None:
            return tuple(row for row, _ in layout)
        before = frozenset(self._last_decode_layout)
        return tuple(row for row, req_id in layout if (row, req_id) not in before)

    def launch(
        self, prepared: PreparedStep, prev: PendingStep | None = None, fed_tokens: Mapping[int, int] | None = None
    ) -> PendingStep:
        """Dispatch a prepared step (decode: asynchronously). ``PENDING_TOKEN`` inputs come from
        ``prev`` (the in-flight step; the device's sampled tokens, no host round trip through a
        ``StepResult``) or ``fed_tokens``."""
        plan, rows = prepared.plan, prepared.plan.rows
        if any(r.history_token_ids is not None for r in rows) and (prev is not None or fed_tokens):
            fed = _fed_tokens(prev, fed_tokens)
            rows = tuple(_feed_history(r, fed) for r in rows)
        self.num_dispatches += 1
        if not plan.is_decode:
            return self._run_prefill(plan, rows, prepared.use_device)
        if prepared.pending_rows is not None:
            self._feed_tokens(prepared, prev, fed_tokens)
        return self._launch_decode(prepared, rows)

    def _feed_tokens(
        self, prepared: PreparedStep, prev: PendingStep | None, fed_tokens: Mapping[int, int] | None
    ) -> None:
        idx = prepared.pending_rows
        source = prev.slot_tokens() if prev is not None else None
        if source is not None:
            prepared.tokens[idx, 0] = host_array(source)[idx]
            return
        fed = _fed_tokens(prev, fed_tokens)
        prepared.tokens[idx, 0] = [fed[row] for row in idx.tolist()]

    def _launch_decode(self, prepared: PreparedStep, rows: Sequence[RowPlan]) -> PendingStep:
        use_device = prepared.use_device
        assert prepared.decode_kwargs is not None  # prepare() fills them for every decode step
        if prepared.host_input_rows and self._mark_host_inputs is not None:
            self._mark_host_inputs(prepared.host_input_rows)
        histories = penalty_histories(rows, prepared.plan.capacity) if use_device else None
        extra = {} if histories is None else {"prompt_tokens": histories[0], "output_tokens": histories[1]}
        out = self.model.decode_forward(
            tokens=torch.from_numpy(prepared.tokens),
            kv_cache=self.kv_cache,
            enable_trace=self._decode_trace,
            read_from_device=False,
            **prepared.decode_kwargs,
            **extra,
        )
        self.contract.accepted(use_device)
        events: Sequence[Any] = ()
        if self.read_back_async:
            out, events = self.model.read_decode_output(out, async_read=True)
        sampling = prepared.decode_kwargs.get("sampling_params")
        wants_logprobs = sampling is not None and any(sampling.enable_log_probs)
        capacity = prepared.plan.capacity

        def wait() -> HostOutput:
            return finalize_decode(
                self.model, out, events, is_tokens=use_device, wants_logprobs=wants_logprobs, num_rows=capacity
            )

        slots = [r.row for r in rows]
        return PendingStep(prepared.plan, wait, lambda host_out: self._result(rows, slots, host_out), use_device)

    def _run_prefill(self, plan: StepPlan, rows: Sequence[RowPlan], use_device: bool) -> PendingStep:
        n = len(rows)
        max_end = max(r.end_pos for r in rows)
        tokens_host = np.zeros((n, max_end), dtype=np.int64)
        table_host = np.zeros((n, self.config.max_num_blocks_per_req), dtype=np.int32)
        for i, r in enumerate(rows):
            tokens_host[i, : r.end_pos] = r.input_token_ids
            table_host[i, : len(r.block_ids)] = r.block_ids
        tokens, page_table = torch.from_numpy(tokens_host), torch.from_numpy(table_host)
        kwargs: dict[str, Any] = {}
        wants_logprobs = False
        if use_device:
            sampling = device_sampling_params(rows, n, self.vocab_size, by_slot=False)
            kwargs["sampling_params"] = sampling
            wants_logprobs = any(sampling.enable_log_probs)
        if self.vision.is_multimodal:
            kwargs.update(prefill_image_kwargs(rows))
        out = self.model.prefill_forward(
            tokens=tokens,
            page_table=page_table,
            kv_cache=self.kv_cache,
            prompt_lens=[r.end_pos for r in rows],
            start_pos=[r.start_pos for r in rows],
            empty_slots=[r.row for r in rows],
            enable_trace=self._prefill_trace,
            **kwargs,
        )
        self.contract.note_prefill()
        if self.vision.uses_mrope:
            out, deltas = split_prefill_output(out)
            self.rope_deltas.store(rows, deltas)
        host = unpack_output(out, is_tokens=use_device, wants_logprobs=wants_logprobs, num_rows=n)
        result = self._result(rows, list(range(n)), host)
        return PendingStep(plan, lambda: host, lambda _: result, use_device)

    # ---- helpers --------------------------------------------------------------------------
    def _result(self, rows: Sequence[RowPlan], out_index: list[int], out: HostOutput) -> StepResult:
        """Pick each row's token from the program output (``out_index``: row -> output index)."""
        if out.is_tokens:
            all_ids = out.values.tolist()
            device_ids = tuple(all_ids[j] if r.samples else NO_TOKEN for r, j in zip(rows, out_index))  # ints: tolist()
            return StepResult(device_ids, device_logprobs(rows, out_index, out), True)
        logits = out.values
        sampling_rows = [i for i, r in enumerate(rows) if r.samples]
        ids = [NO_TOKEN] * len(rows)
        lps: list[TokenLogprob | None] | None = None
        if sampling_rows:
            constraints = None
            if self.constraints:
                constraints = [self.constraints.get(rows[i].req_id) for i in sampling_rows]
            sample = sample_on_host(
                logits[[out_index[i] for i in sampling_rows]],
                [rows[i] for i in sampling_rows],
                self._generator,
                self.eos_token_ids,
                constraints if constraints is not None and any(constraints) else None,
            )
            for k, i in enumerate(sampling_rows):
                ids[i] = sample.token_ids[k]
            if sample.logprobs is not None:
                lps = [None] * len(rows)
                for k, i in enumerate(sampling_rows):
                    lps[i] = sample.logprobs[k]
        return StepResult(tuple(ids), None if lps is None else tuple(lps), False)

    def _update_page_table(self, rows: Sequence[RowPlan]) -> bool:
        """Bring the persistent decode page table to ``rows``; whether any row changed."""
        scheduled = {r.row for r in rows}
        table = self._page_table
        changed = False
        for row, blocks in enumerate(self._row_blocks):
            if blocks and row not in scheduled:
                table[row] = 0
                self._row_blocks[row] = ()
                changed = True
        for r in rows:
            if self._row_blocks[r.row] != r.block_ids:
                table[r.row] = 0
                table[r.row, : len(r.block_ids)] = r.block_ids
                self._row_blocks[r.row] = r.block_ids
                changed = True
        return changed


def accepts_keyword(fn: Callable[..., Any], name: str) -> bool:
    """Whether ``fn``'s signature names ``name`` (a ``**kwargs`` catch-all does not count: a
    keyword such a method never reads is better left out)."""
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _fed_tokens(prev: PendingStep | None, fed_tokens: Mapping[int, int] | None) -> Mapping[int, int]:
    """Row -> token that resolves a ``PENDING_TOKEN``: ``fed_tokens``, else the tokens of ``prev``
    (the in-flight step that samples them; waits for it)."""
    if fed_tokens is not None:
        return fed_tokens
    assert prev is not None, "a PENDING_TOKEN input needs the step that samples it"
    return prev.finalize().tokens_by_row(prev.plan)


def _feed_history(r: RowPlan, fed: Mapping[int, int]) -> RowPlan:
    """Resolve the PENDING_TOKEN in ``r``'s penalty history with the previous step's token."""
    if r.history_token_ids is None or PENDING_TOKEN not in r.history_token_ids:
        return r
    token = fed[r.row]
    return r._replace(history_token_ids=tuple(token if t == PENDING_TOKEN else t for t in r.history_token_ids))
