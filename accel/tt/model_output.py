"""What a mesh model's forward returns, unpacked the way vllm-tt-plugin's runner unpacks it.

tt-metal's generators return host logits ``[rows, 1, vocab]`` (sometimes as a ``(logits,
log_probs)`` tuple), or, when sampling ran on the device, tokens ``[rows]`` (``[rows, 1]`` from
some decode paths, ``[rows, 1, 1]`` from others) or a ``(tokens, log_probs)`` tuple when any row
enabled log probs, where ``log_probs`` is one per row or a top-k pair ``([rows, 32], [rows, 32])``. Decode
outputs come back in two steps: ``read_decode_output(out, async_read=True)`` gives ``(host_out,
events)``; once every event is synchronized, ``process_decode_output_host`` turns ``host_out``
into torch tensors unless it already is (plugin ``async_decode.finalize_decode``).

Anything else is a contract violation and raises ``TypeError`` naming what came back: a model
class that returns our own types instead of tt-metal's must fail loudly, not sample garbage.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from accel.contract import TokenLogprob
from accel.tt.mesh_model import DeviceEvent


@dataclass(frozen=True)
class HostOutput:
    """One forward's output on the host. ``values``: logits float ``[rows, vocab]`` (the last
    position, as the plugin's ``tt_out[rows, -1, :]``) or device-sampled tokens int64 ``[rows]``;
    ``logprobs``: float ``[rows]`` of the sampled tokens, when the device returned them."""

    values: torch.Tensor
    logprobs: torch.Tensor | None
    is_tokens: bool
    top_logprobs: tuple[torch.Tensor, torch.Tensor] | None = None  # device top-k: (values, ids) [rows, K]


def is_host_output(out: Any) -> bool:
    """A torch tensor, or a tuple of torch tensors / None / such tuples (a top-k log-prob pair)
    (plugin ``_is_host_decode_output``)."""
    if isinstance(out, torch.Tensor):
        return True
    return isinstance(out, tuple) and all(t is None or is_host_output(t) for t in out)


def unpack_output(out: Any, *, is_tokens: bool, wants_logprobs: bool, num_rows: int) -> HostOutput:
    """``out`` (host tensors, tt-metal conventions) -> ``HostOutput`` of ``num_rows`` rows."""
    logprobs = None
    if is_tokens and wants_logprobs:
        if not (isinstance(out, tuple) and len(out) == 2):
            raise TypeError(
                f"device sampling with log probs must return a (tokens, logprobs) tuple, got {_describe(out)}"
            )
        out, logprobs = out
    elif isinstance(out, tuple):
        if len(out) != 2:
            raise TypeError(f"a model output tuple must be (values, log_probs), got {_describe(out)}")
        out = out[0]
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"expected host torch tensors from the model, got {_describe(out)}")
    if is_tokens:
        # [rows], or any [rows, 1, ...] (the plugin reshapes decode tokens to [rows, 1]; some
        # generators hand back [rows, 1, 1])
        if out.dim() not in (1, 2, 3) or any(d != 1 for d in out.shape[1:]) or out.shape[0] < num_rows:
            raise TypeError(f"device-sampled tokens must be [rows] or [rows, 1(, 1)], got shape {tuple(out.shape)}")
        values = out.reshape(out.shape[0])[:num_rows].to(torch.int64)
        top = None
        if isinstance(logprobs, tuple):
            top = (logprobs[0][:num_rows].float(), logprobs[1][:num_rows].to(torch.int64))
        if logprobs is not None:
            logprobs = _sampled_logprobs(logprobs, values, num_rows)
        return HostOutput(values, logprobs, True, top)
    if out.dim() != 3 or out.shape[0] < num_rows:
        raise TypeError(f"host logits must be [rows, 1 (or S), vocab], got shape {tuple(out.shape)}")
    return HostOutput(out[:num_rows, -1, :].float(), None, False)


def finalize_decode(
    model: Any,
    host_out: Any,
    events: Sequence[DeviceEvent],
    *,
    is_tokens: bool,
    wants_logprobs: bool,
    num_rows: int,
) -> HostOutput:
    """Wait for the read-back, convert with ``process_decode_output_host`` when needed, unpack."""
    for event in events:
        event.synchronize()
    if not is_host_output(host_out):
        host_out = model.process_decode_output_host(host_out, is_tokens=is_tokens)
    return unpack_output(host_out, is_tokens=is_tokens, wants_logprobs=wants_logprobs, num_rows=num_rows)


def device_logprobs(
    rows: Sequence[Any], out_index: Sequence[int], out: HostOutput
) -> tuple[TokenLogprob | None, ...] | None:
    """Per plan row (``RowPlan``s; ``out_index``: row -> output index), the device sampler's log
    probs of the rows that asked for them: the sampled token's, and the best ``logprobs`` of
    the top-k pair when the sampler returned one. None when the device returned none."""
    if out.logprobs is None:
        return None
    result: list[TokenLogprob | None] = []
    for r, j in zip(rows, out_index):
        num_top = r.sampling.logprobs
        if num_top is None or not r.samples:
            result.append(None)
            continue
        top: tuple[tuple[int, float], ...] = ()
        if num_top > 0 and out.top_logprobs is not None:
            values, ids = out.top_logprobs
            order = values[j].argsort(descending=True)[:num_top]
            top = tuple((int(ids[j, k]), float(values[j, k])) for k in order.tolist())
        result.append(TokenLogprob(int(out.values[j]), float(out.logprobs[j]), top))
    return tuple(result)


def _sampled_logprobs(logprobs: Any, tokens: torch.Tensor, num_rows: int) -> torch.Tensor:
    """The sampled tokens' log probs, float ``[num_rows]``, from what tt-metal's sampler returns:
    one per row (``[rows]`` / ``[rows, 1]``), or a top-k pair ``(values [rows, K], indices [rows,
    K])`` (K = 32 on tt-metal's device sampler), where the sampled token's entry is the one whose
    index is the token (NaN if the token is not among the K: then nothing is claimed)."""
    if isinstance(logprobs, tuple):
        if len(logprobs) != 2 or not all(isinstance(t, torch.Tensor) and t.dim() == 2 for t in logprobs):
            raise TypeError(f"top-k log probs must be a ([rows, K], [rows, K]) pair, got {_describe(logprobs)}")
        values, indices = (t[:num_rows] for t in logprobs)
        hit = indices.to(torch.int64) == tokens[:, None]  # [rows, K]
        picked = values.float().gather(1, hit.to(torch.int64).argmax(dim=1, keepdim=True)).squeeze(1)
        return torch.where(hit.any(dim=1), picked, torch.full_like(picked, float("nan")))
    return torch.as_tensor(logprobs).reshape(-1)[:num_rows].float()


def _describe(out: Any) -> str:
    if isinstance(out, torch.Tensor):
        return f"tensor {tuple(out.shape)}"
    if isinstance(out, tuple):
        return "(" + ", ".join(_describe(o) for o in out) + ")"
    return type(out).__name__
