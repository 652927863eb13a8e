"""The torch mesh program's forward pass: a Llama/Qwen3 decoder over paged, lane-local KV.

One call runs ``n`` rows of ``L`` tokens (decode: the full slot batch, ``L == 1``; prefill: the
chunks of one bucket, padded to it), writes the KV of the positions marked ``is_written`` and
returns the logits of each row's ``last_index`` token.
"""

from __future__ import annotations

import torch

from accel.tt.torch_model.config import DecoderConfig
from accel.tt.torch_model.decode_mirror import DecodeMirror, MirrorStep
from accel.tt.torch_model.layers import RotaryTables, project_qkv, rms_norm, swiglu_mlp
from accel.tt.torch_model.paged_attention import (
    AttentionMetadata,
    PagedKVStore,
    mirrored_decode_attention,
    paged_attention,
    write_kv,
)
from accel.tt.torch_model.weights import ModelWeights


@torch.inference_mode()
def decoder_forward(
    config: DecoderConfig,
    weights: ModelWeights,
    rope: RotaryTables,
    device: torch.device,
    store: PagedKVStore,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    is_written: torch.Tensor,
    lanes: torch.Tensor,
    page_table: torch.Tensor,
    num_ctx_blocks: int,
    last_index: torch.Tensor,
    num_ctx_tokens: int | None = None,
    mirror: tuple[DecodeMirror, MirrorStep] | None = None,
    embeds: torch.Tensor | None = None,
    cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """``tokens``/``positions``/``is_written`` ``[n, L]`` -> logits ``[n, vocab]`` at ``last_index``;
    attention reads ``num_ctx_tokens`` keys per row (default: every gathered block's). ``mirror``
    (decode of every slot, ``n == B_wire``): attention reads each slot's contiguous context there
    instead of gathering pages (``decode_mirror``). A multimodal program passes ``embeds`` (the
    input embeddings ``[n * L, hidden]``, image features in place) and ``cos_sin`` (rotary
    tables ``[n * L, 1, D]`` as ``RotaryTables.at_rolled`` gives them, for its own positions); the
    KV positions stay ``positions``."""
    dev = device
    tokens, positions, is_written = tokens.to(dev), positions.to(dev), is_written.to(dev)
    n, length = tokens.shape
    cfg, w = config, weights
    meta = AttentionMetadata.build(
        store,
        page_table.to(dev),
        lanes.to(dev),
        positions,
        is_written,
        num_ctx_blocks,
        cfg.num_queries_per_kv,
        dtype=store.keys[0].dtype,
        num_ctx_tokens=num_ctx_tokens,
    )
    if cos_sin is None:
        cos_sin = rope.at_rolled(positions.reshape(-1))
    scale = cfg.head_dim**-0.5
    h = w.embed[tokens.reshape(-1)] if embeds is None else embeds.to(dev)  # [n * L, hidden]
    kv_dtype = store.keys[0].dtype
    is_cast = kv_dtype != h.dtype  # casts only where KV and model dtypes differ (fewer ops per layer)
    # Prefill: only each row's last token leaves the program, and the last layer's K/V come from
    # its input; so that layer's o_proj and MLP run on those n tokens, not all n * L.
    last_rows = None if length == 1 else torch.arange(n, device=dev) * length + last_index.to(dev)
    num_layers = len(w.layers)
    for i, layer in enumerate(w.layers):
        x = rms_norm(h, layer.input_norm, cfg.rms_norm_eps)
        q, k, v = project_qkv(x, layer, cfg, cos_sin)
        if is_cast:
            q, k, v = q.to(kv_dtype), k.to(kv_dtype), v.to(kv_dtype)
        write_kv(store, i, meta, k, v)
        q = q.view(n, length, cfg.num_heads, cfg.head_dim)
        if mirror is not None:
            context, step = mirror
            context.refill(i, step, store.keys[i], store.values[i])
            context.append(i, positions[:, 0], k, v)
            attn = mirrored_decode_attention(context.keys[i], context.values[i], meta, q, scale)
        else:
            attn = paged_attention(store, i, meta, q, scale)
        attn = attn.view(n * length, -1)
        if last_rows is not None and i == num_layers - 1:
            h, attn = h.index_select(0, last_rows), attn.index_select(0, last_rows)
        h = h + layer.o_proj(attn.to(h.dtype) if is_cast else attn)
        h = h + swiglu_mlp(rms_norm(h, layer.post_attention_norm, cfg.rms_norm_eps), layer)
    # h is [n, hidden] now: decode rows' only token, or prefill rows' last one.
    return w.lm_head(rms_norm(h, w.final_norm, cfg.rms_norm_eps))
