"""Structured outputs on the TT engine: ``python bench/structured_outputs.py --json``.

Prints ONE JSON object:
- ``decode``: output tokens/s of the TT engine (``TorchMeshModel`` on tiny-llama, 4 lanes x 8
  seqs, 32 concurrent requests, 64 prompt / 64 output tokens, greedy) with 0 %, 10 % (3 of 32)
  and 100 % of the rows constrained by a grammar, plus ``host_0pct``: no constrained row but
  every batch forced onto the host sampler (``always_compat_sampling``), which separates the
  cost of leaving device sampling from the grammar's own. ``vs_0pct`` ratios are per round
  against the 0 % run of the same round (rounds alternate modes; median of ``--repeats``).
  The constrained rows' grammar is the regex ``[a-z ]{200}``: it admits no stop token within 64
  tokens, so constrained and free rows emit the same number of tokens.
- ``grammar_cost``: per-token host cost of a grammar (fill the next-token bitmask, apply it to a
  float32 logits row, accept the sampled token), and the compile time of the spec (cold, then a
  cache hit), for the tiny checkpoint's 1024-token vocabulary and for a synthetic
  128 000-token vocabulary (a Llama-3-sized vocab; no large tokenizer is available offline, so
  its tokens are random byte strings: the mask cost scales with the vocab, the figure is a
  ballpark), for a JSON schema and for a regex.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import xgrammar as xgr  # noqa: E402

from accel.contract import GenerateRequest, SamplingParams, StructuredOutputSpec  # noqa: E402
from accel.envs import ENVS  # noqa: E402
from accel.models.tiny import ensure_checkpoints  # noqa: E402
from accel.structured.grammar import GrammarCompiler  # noqa: E402
from accel.text.tokenizer import load_tokenizer  # noqa: E402
from accel.tt.config import TTEngineConfig  # noqa: E402
from accel.tt.engine import TTMeshEngine  # noqa: E402

N, LANES, PROMPT_LEN, MAX_TOKENS = 32, 4, 64, 64
FILLER = StructuredOutputSpec(regex="[a-z ]{200}")
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "score": {"type": "number"},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "tags", "score", "ok"],
}
COST_SPECS = {"json_schema": StructuredOutputSpec(json=SCHEMA), "regex": StructuredOutputSpec(regex="[a-z ]{200}")}
MODES = {"0pct": 0, "10pct": 3, "100pct": N}


def _engine(ckpt: Path, always_host: bool) -> TTMeshEngine:
    from accel.tt.backend import open_backend

    tt = {"sample_on_device_mode": "all", "always_compat_sampling": always_host}
    config = TTEngineConfig.from_engine_args(
        dict(
            model=str(ckpt),
            max_num_seqs=N // LANES,
            data_parallel_size=LANES,
            block_size=64,
            max_model_len=512,
            max_num_batched_tokens=2048,
            async_scheduling=True,
            additional_config={"tt": tt},
        )
    )
    return TTMeshEngine(config, backend=open_backend("torch"))


def _requests(tag: str, num_constrained: int, seed: int) -> list[GenerateRequest]:
    rng = random.Random(seed)
    out = []
    for i in range(N):
        prompt = tuple(rng.randrange(3, 1000) for _ in range(PROMPT_LEN))
        spec = FILLER if i < num_constrained else None
        sp = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, structured_outputs=spec)
        out.append(GenerateRequest(f"{tag}-{i}", prompt, sp))
    return out


async def _output_tokens(engine: TTMeshEngine, reqs: list[GenerateRequest]) -> int:
    async def one(r: GenerateRequest) -> int:
        count = 0
        async for d in engine.generate(r):
            count += len(d.new_token_ids)
        return count

    return sum(await asyncio.gather(*(one(r) for r in reqs)))


def decode_throughput(ckpt: Path, repeats: int) -> dict:
    device, host = _engine(ckpt, always_host=False), _engine(ckpt, always_host=True)
    runs = {**{m: (device, k) for m, k in MODES.items()}, "host_0pct": (host, 0)}
    tok_s: dict[str, list[float]] = {m: [] for m in runs}

    async def run_all() -> None:
        for mode, (eng, k) in runs.items():  # warm every path (and compile the grammar) once
            await _output_tokens(eng, _requests(f"warm-{mode}", k, seed=0)[:4])
        for round_id in range(repeats):
            for mode, (eng, k) in runs.items():
                reqs = _requests(f"{mode}-{round_id}", k, seed=100 + round_id)
                start = time.perf_counter()
                tokens = await _output_tokens(eng, reqs)
                assert tokens == N * MAX_TOKENS, (mode, tokens)
                tok_s[mode].append(tokens / (time.perf_counter() - start))

    try:
        asyncio.run(run_all())
        host_sampled = device.core.num_host_sampled_tokens
        device_sampled = device.core.num_device_sampled_tokens
    finally:
        device.close()
        host.close()
    result: dict = {"rows": N, "lanes": LANES, "prompt_tokens": PROMPT_LEN, "output_tokens": MAX_TOKENS}
    for mode, values in tok_s.items():
        ratios = [v / z for v, z in zip(values, tok_s["0pct"])]
        result[mode] = {
            "tok_s": round(statistics.median(values), 1),
            "vs_0pct": round(statistics.median(ratios), 3),
            "vs_0pct_rounds": [round(r, 3) for r in ratios],
        }
    result["device_engine_sampled_tokens"] = {"device": device_sampled, "host": host_sampled}
    return result


def _synthetic_tokenizer_info(vocab_size: int, seed: int = 0) -> xgr.TokenizerInfo:
    rng = random.Random(seed)
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 _-.,:;\"'{}[]()\n"
    vocab = [chr(c) for c in range(32, 127)] + ["\n", "\t"]
    seen = set(vocab)
    while len(vocab) < vocab_size - 1:
        tok = "".join(rng.choice(alphabet) for _ in range(rng.randint(2, 9)))
        if tok not in seen:
            seen.add(tok)
            vocab.append(tok)
    vocab.append("</s>")
    return xgr.TokenizerInfo(
        vocab, vocab_type=xgr.VocabType.RAW, vocab_size=vocab_size, stop_token_ids=[vocab_size - 1]
    )


def _grammar_cost(info: xgr.TokenizerInfo, compile_spec, spec: StructuredOutputSpec, tokens: int) -> dict:
    t0 = time.perf_counter()
    compiled = compile_spec(spec)
    cold_ms = 1000 * (time.perf_counter() - t0)
    t0 = time.perf_counter()
    compile_spec(spec)
    cached_ms = 1000 * (time.perf_counter() - t0)
    vocab = info.vocab_size
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(64, vocab, generator=gen)
    matcher = xgr.GrammarMatcher(compiled, override_stop_tokens=list(info.stop_token_ids))
    bitmask = xgr.allocate_token_bitmask(1, vocab)
    fill_s = apply_s = accept_s = 0.0
    n = 0
    while n < tokens:
        if matcher.is_terminated():
            matcher.reset()
        row = logits[n % 64 : n % 64 + 1].clone()
        t0 = time.perf_counter()
        matcher.fill_next_token_bitmask(bitmask, 0)
        t1 = time.perf_counter()
        xgr.apply_token_bitmask_inplace(row, bitmask, vocab_size=vocab)
        token = int(row.argmax())
        t2 = time.perf_counter()
        assert matcher.accept_token(token)
        t3 = time.perf_counter()
        fill_s, apply_s, accept_s, n = fill_s + t1 - t0, apply_s + t2 - t1, accept_s + t3 - t2, n + 1
    return {
        "us_per_token": round(1e6 * (fill_s + apply_s + accept_s) / n, 1),
        "fill_us": round(1e6 * fill_s / n, 1),
        "apply_argmax_us": round(1e6 * apply_s / n, 1),
        "accept_us": round(1e6 * accept_s / n, 1),
        "compile_cold_ms": round(cold_ms, 2),
        "compile_cached_ms": round(cached_ms, 3),
    }


def grammar_cost(ckpt: Path, tokens: int) -> dict:
    tok = load_tokenizer(str(ckpt))
    tiny = GrammarCompiler(tok.hf, 1024)
    big_info = _synthetic_tokenizer_info(128_000)
    big = xgr.GrammarCompiler(big_info, max_threads=8, cache_enabled=True)

    def big_compile(spec: StructuredOutputSpec) -> xgr.CompiledGrammar:
        if spec.json is not None:
            return big.compile_json_schema(spec.json)
        assert spec.regex is not None
        return big.compile_regex(spec.regex)

    out: dict = {}
    for name, spec in COST_SPECS.items():
        out[f"vocab_1024_{name}"] = _grammar_cost(tiny.tokenizer_info, tiny.compile, spec, tokens)
        out[f"vocab_128000_synthetic_{name}"] = _grammar_cost(big_info, big_compile, spec, tokens)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON object")
    parser.add_argument("--repeats", type=int, default=3, help="rounds per figure (median reported)")
    parser.add_argument("--cost-tokens", type=int, default=1000, help="tokens per grammar-cost figure")
    parser.add_argument("--skip-decode", action="store_true", help="only the grammar cost")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING if args.json else logging.INFO)
    ensure_checkpoints(ENVS.checkpoint_dir)
    ckpt = ENVS.checkpoint_dir / "tiny-llama"
    result: dict = {"torch_threads": torch.get_num_threads(), "repeats": args.repeats}
    result["grammar_cost"] = grammar_cost(ckpt, args.cost_tokens)
    if not args.skip_decode:
        result["decode"] = decode_throughput(ckpt, args.repeats)
    result["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
