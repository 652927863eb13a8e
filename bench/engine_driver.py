"""An engine driven in this process with the load ``vllm bench serve`` puts on a server
(``bench/serve_overhead.py --mode tt``): C concurrent requests of random prompts of the same
lengths, ignore_eos, figures under the client's own keys (TTFT, TPOT, ITL, output tokens/s).
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from typing import Any


async def drive_engine(engine, concurrency: int, num_prompts: int, opts, seed: int) -> dict[str, Any]:
    """``num_prompts`` requests, ``concurrency`` at a time, straight into the engine."""
    from accel.contract import GenerateRequest, SamplingParams
    from accel.text.tokenizer import load_tokenizer

    rng = random.Random(seed)
    vocab_size = load_tokenizer(opts.tokenizer).vocab_size
    prompts = [tuple(rng.randrange(3, vocab_size) for _ in range(opts.input_len)) for _ in range(num_prompts)]
    sampling = SamplingParams(temperature=1.0, max_tokens=opts.output_len, ignore_eos=True)
    ttfts: list[float] = []
    itls: list[float] = []
    tpots: list[float] = []  # per request: (end - first token) / (tokens - 1), as vLLM's client
    num_tokens = 0
    queue = list(enumerate(prompts))

    async def worker() -> None:
        nonlocal num_tokens
        while queue:
            i, prompt = queue.pop()
            req = GenerateRequest(request_id=f"bench-{seed}-{i}", prompt_token_ids=prompt, sampling=sampling)
            start = last = time.perf_counter()
            first_at, n = None, 0
            async for delta in engine.generate(req):
                if not delta.new_token_ids:
                    continue
                now = time.perf_counter()
                n += len(delta.new_token_ids)
                (ttfts if first_at is None else itls).append(now - (start if first_at is None else last))
                first_at, last = first_at or now, now
            num_tokens += n
            if first_at is not None and n > 1:
                tpots.append((last - first_at) / (n - 1))

    start = time.perf_counter()
    await asyncio.gather(*[worker() for _ in range(concurrency)])
    duration = time.perf_counter() - start
    itls.sort()
    return {
        "completed": num_prompts,
        "total_output_tokens": num_tokens,
        "duration": duration,
        "output_throughput": num_tokens / duration,
        "median_ttft_ms": 1000 * statistics.median(ttfts),
        "p99_ttft_ms": 1000 * sorted(ttfts)[int(0.99 * (len(ttfts) - 1))],
        "median_tpot_ms": 1000 * statistics.median(tpots),
        "median_itl_ms": 1000 * statistics.median(itls),
        "p99_itl_ms": 1000 * itls[int(0.99 * (len(itls) - 1))],
    }
