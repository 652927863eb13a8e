"""TEST DOUBLE: an ``accel.contract.Engine`` that runs the tiny checkpoint with HF transformers.

Used only to unit-test the HTTP/ingress layer without the real engines' start-up cost. It is
honest about what it does: one request at a time per step (no batching, no paging), the same
``OutputBuilder`` as the real engines (so stops, eos, max_tokens and text behave identically),
greedy or seeded multinomial sampling. ``step_delay_s`` slows it so tests can disconnect
mid-stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from accel.contract import (
    EmbeddingResult,
    EmbedRequest,
    EngineStats,
    FinishReason,
    GenerateRequest,
    InvalidRequestError,
    OutputDelta,
    TokenLogprob,
)
from accel.text.output_builder import OutputBuilder
from accel.text.tokenizer import load_tokenizer


class HFReplayEngine:
    """``block_size``: what it reports as its KV block size (the pool's; it has no paged KV and
    no prefix cache, so it publishes no KV events and has no block snapshot)."""

    def __init__(self, model_dir: str, max_model_len: int, step_delay_s: float = 0.0, *, block_size: int):
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(1)
        self._torch = torch
        self._model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self._tok = load_tokenizer(model_dir)
        self._max_model_len = max_model_len
        self._delay_s = step_delay_s
        self.block_size = block_size
        self.is_shut_down = False
        self._aborted: set[str] = set()
        self._running: set[str] = set()

    async def generate(self, request: GenerateRequest) -> AsyncIterator[OutputDelta]:
        torch = self._torch
        sp = request.sampling
        if sp.logprobs is not None and sp.logprobs > 20:
            raise InvalidRequestError("logprobs", "at most 20")
        builder = OutputBuilder(request, self._tok.fast, self._tok.eos_token_ids, self._max_model_len)
        gen = torch.Generator().manual_seed(sp.seed) if sp.seed is not None else None
        rid = request.request_id
        self._running.add(rid)
        try:
            ids = torch.tensor([list(request.prompt_token_ids)])
            past = None
            while True:
                if rid in self._aborted:
                    yield builder.finish(FinishReason.ABORT)
                    return
                with torch.no_grad():
                    out = self._model(input_ids=ids, past_key_values=past, use_cache=True)
                past = out.past_key_values
                logits = out.logits[0, -1].float()
                for tid, bias in sp.logit_bias:
                    logits[tid] += bias
                logp = torch.log_softmax(logits, -1)
                if sp.is_greedy:
                    token = int(logits.argmax())
                else:
                    probs = torch.softmax(logits / sp.temperature, -1)
                    token = int(torch.multinomial(probs, 1, generator=gen))
                lps = None
                if sp.logprobs is not None:
                    top = torch.topk(logp, max(sp.logprobs, 1))
                    lps = [
                        TokenLogprob(
                            token,
                            float(logp[token]),
                            tuple((int(i), float(v)) for v, i in zip(top.values, top.indices))[: sp.logprobs],
                        )
                    ]
                delta = builder.add_tokens([token], lps)
                yield delta
                if delta.finished:
                    return
                ids = torch.tensor([[token]])
                await asyncio.sleep(self._delay_s)
        finally:
            self._running.discard(rid)
            self._aborted.discard(rid)

    async def abort(self, request_id: str) -> None:
        if request_id in self._running:
            self._aborted.add(request_id)

    def stats(self) -> EngineStats:
        return EngineStats(
            num_waiting=0,
            num_running=len(self._running),
            num_kv_blocks_total=0,
            num_kv_blocks_free=0,
            platform="hf-test-double",
        )

    async def embed(self, request: EmbedRequest) -> EmbeddingResult:
        """A generative double: it has no pooling runner, so it refuses as a generate-only
        engine does (``model`` named)."""
        del request
        raise InvalidRequestError("model", "the HF replay engine runs no pooling (embeddings)")

    def extra_stats(self) -> None:
        return None

    def take_kv_events(self) -> None:
        return None

    def kv_block_snapshot(self) -> None:
        return None

    async def check_health(self) -> None:
        if self.is_shut_down:
            raise RuntimeError("the HF replay engine is shut down")

    async def shutdown(self) -> None:
        self._running.clear()
        self.is_shut_down = True


def make_hf_replay_engine(pool) -> HFReplayEngine:
    """Engine factory for ``build_from_config(..., engine_factories=...)``."""
    return HFReplayEngine(str(pool.model_path), pool.max_model_len, step_delay_s=0.005, block_size=pool.block_size)
