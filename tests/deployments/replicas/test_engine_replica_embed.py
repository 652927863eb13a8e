"""``EngineReplica.embed``: the engine's vector comes back as is, counted in flight while it runs;
an engine's refusal (``InvalidRequestError`` naming ``model``) reaches the caller unchanged; a
cancelled call cancels the engine's."""

from __future__ import annotations

import asyncio

import pytest

from accel.contract import EmbeddingResult, EmbedRequest, InvalidRequestError
from deployments.replicas.engine_replica import EngineReplica
from tests.doubles.app_configs import pool_config
from tests.doubles.hf_replay_engine import HFReplayEngine


class HFPoolingEngine(HFReplayEngine):
    """HF's last-token hidden state, L2-normalized (vLLM's embed conversion of a causal LM)."""

    def __init__(self, model_dir: str, gate: asyncio.Event | None = None):
        super().__init__(model_dir, 512, block_size=16)
        self.model_dir, self.gate, self.cancelled = model_dir, gate, False

    async def embed(self, request: EmbedRequest) -> EmbeddingResult:
        import torch
        from transformers import AutoModel

        try:
            if self.gate is not None:
                await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        model = AutoModel.from_pretrained(self.model_dir, dtype=torch.float32).eval()
        with torch.no_grad():
            hidden = model(input_ids=torch.tensor([list(request.prompt_token_ids)])).last_hidden_state[0, -1]
        values = torch.nn.functional.normalize(hidden, dim=-1).tolist()
        return EmbeddingResult(request.request_id, tuple(values), request.num_prompt_tokens)


class GenerateOnlyEngine(HFReplayEngine):
    async def embed(self, request: EmbedRequest) -> EmbeddingResult:
        raise InvalidRequestError("model", "no pooling here")


def test_embed_returns_the_engines_vector(tiny_llama):
    async def run():
        gate = asyncio.Event()
        replica = EngineReplica(pool_config("emb", "m", "vllm"), lambda p: HFPoolingEngine(str(tiny_llama), gate))
        call = asyncio.ensure_future(replica.embed(EmbedRequest("e1", (0, 5, 6)), replica_hint="ignored"))
        await asyncio.sleep(0.01)
        assert replica.routing_snapshot().num_inflight == 1
        gate.set()
        result = await call
        assert replica.routing_snapshot().num_inflight == 0
        assert (result.request_id, result.num_prompt_tokens, len(result.embedding)) == ("e1", 3, 256)
        assert sum(v * v for v in result.embedding) == pytest.approx(1.0, abs=1e-5)
        await replica.shutdown()

    asyncio.run(run())


def test_refusal_reaches_the_caller_and_cancel_reaches_the_engine(tiny_llama):
    async def run():
        engine = GenerateOnlyEngine(str(tiny_llama), 512, block_size=16)
        refusing = EngineReplica(pool_config("tt", "m"), lambda p: engine)
        with pytest.raises(InvalidRequestError) as err:
            await refusing.embed(EmbedRequest("e2", (0, 5)))
        assert err.value.field == "model"
        await refusing.shutdown()
        gate = asyncio.Event()
        engine = HFPoolingEngine(str(tiny_llama), gate)
        replica = EngineReplica(pool_config("emb", "m", "vllm"), lambda p: engine)
        call = asyncio.ensure_future(replica.embed(EmbedRequest("e3", (0, 5))))
        await asyncio.sleep(0.01)
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
        assert engine.cancelled and replica.routing_snapshot().num_inflight == 0
        await replica.shutdown()

    asyncio.run(run())
