"""An engine driven in this process with the load ``vllm bench serve`` puts on a server
(``bench/serve_overhead.py --mode tt``): the very prompts the client sends for the same seed
(vLLM's own random dataset), as the token ids our ``/v1/completions`` makes of them, C at a
time, ignore_eos; figures under the client's own keys (TTFT, TPOT, ITL, output tokens/s).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any


def client_prompts(opts, num_prompts: int, seed: int) -> list[tuple[int, ...]]:
    """The prompts ``vllm bench serve`` sends with these options and ``seed`` (its random dataset
    decodes random ids to text and re-encodes them, so ~1 in 6 comes out at input_len + 1 or + 2
    tokens), tokenized as our completions endpoint tokenizes a text prompt."""
    from vllm.benchmarks.datasets import get_samples
    from vllm.tokenizers import get_tokenizer

    from accel.text.tokenizer import load_tokenizer
    from bench.serving_rounds import client_args
    from bench.serving_servers import SERVED_MODEL
    from serve_app.http.protocol.completions import CompletionRequest
    from serve_app.http.protocol.conversion import completion_prompts

    samples = get_samples(client_args("http://127.0.0.1:0", opts, 1, num_prompts, seed), get_tokenizer(opts.tokenizer))
    tokenizer = load_tokenizer(opts.tokenizer)
    return [completion_prompts(CompletionRequest(model=SERVED_MODEL, prompt=s.prompt), tokenizer)[0] for s in samples]


async def drive_engine(engine, concurrency: int, num_prompts: int, opts, seed: int) -> dict[str, Any]:
    """``num_prompts`` requests, ``concurrency`` at a time, straight into the engine."""
    from accel.contract import GenerateRequest, SamplingParams

    prompts = client_prompts(opts, num_prompts, seed)
    sampling = SamplingParams(temperature=1.0, max_tokens=opts.output_len, ignore_eos=True)
    ttfts: list[float] = []
    itls: list[float] = []
    tpots: list[float] = []  # per request: (end - first token) / (tokens - 1), as vLLM's client
    num_tokens = 0
    queue = list(enumerate(prompts))[::-1]  # popped from the end: sent in the client's order

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
