"""The torch mesh program for Qwen2.5-VL (``TorchQwen25VLMeshModel``) through the engine: image
requests and a text request in one batch, greedy token for token equal to HF's own generation;
its multimodal rotary tables equal HF's."""

from __future__ import annotations

import asyncio

import pytest
import torch

from accel.contract import GenerateRequest
from accel.tt.config import TTEngineConfig
from accel.tt.engine import TTMeshEngine
from accel.tt.torch_model.layers import RotaryTables
from accel.tt.torch_model.vl_model import TorchQwen25VLMeshModel, mrope_tables

from ..engine_harness import greedy, tokens_of
from ..vl_checkpoint import hf_greedy_vl, image, image_prompt

NUM_NEW = 8


def test_mrope_tables_equal_hf_rotary_embedding(tiny_qwen25_vl):
    from transformers import AutoConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLRotaryEmbedding

    from accel.tt.torch_model.config import DecoderConfig

    hf_config = AutoConfig.from_pretrained(tiny_qwen25_vl)
    text = hf_config.get_text_config()
    rope = RotaryTables.build(DecoderConfig.from_hf(hf_config), 64, torch.device("cpu"), torch.float32)
    positions = torch.stack([torch.arange(10), torch.arange(10) // 3, torch.arange(10) % 4])  # [3, L]
    cos, signed_sin = mrope_tables(rope, positions, text.rope_parameters["mrope_section"])
    hf_cos, hf_sin = Qwen2_5_VLRotaryEmbedding(text)(torch.zeros(1), positions[:, None, :])
    half = cos.shape[-1] // 2
    torch.testing.assert_close(cos[:, 0], hf_cos[0], rtol=0, atol=0)
    torch.testing.assert_close(signed_sin[:, 0, half:], hf_sin[0, :, half:], rtol=0, atol=0)
    torch.testing.assert_close(-signed_sin[:, 0, :half], hf_sin[0, :, :half], rtol=0, atol=0)


@pytest.mark.slow
@pytest.mark.parametrize("async_scheduling", [True, False])
def test_image_and_text_requests_equal_hf_greedy(tiny_qwen25_vl, async_scheduling):
    a, b = image(11), image(12, (1, 8, 4))
    prompts = {
        "img-a": (image_prompt(tiny_qwen25_vl, [40, 41, 42], a, [43, 44, 45]), a),
        "text": ((50, 51, 52, 53, 54, 55), None),
        "img-b": (image_prompt(tiny_qwen25_vl, [60, 61], b, [62]), b),
    }
    config = TTEngineConfig.from_engine_args(
        dict(
            model=str(tiny_qwen25_vl),
            max_num_seqs=4,
            block_size=16,
            max_model_len=128,
            max_num_batched_tokens=128,
            async_scheduling=async_scheduling,
            additional_config={"tt": {"sample_on_device_mode": None}},
        )
    )
    engine = TTMeshEngine(config, keep_step_log=True)
    try:
        assert isinstance(engine.model, TorchQwen25VLMeshModel)

        async def main():
            async def one(i, req_id):
                await asyncio.sleep(0.01 * i)
                prompt, img = prompts[req_id]
                request = GenerateRequest(req_id, prompt, greedy(NUM_NEW))
                return [d async for d in engine.generate(request, () if img is None else (img,))]

            return dict(zip(prompts, await asyncio.gather(*[one(i, k) for i, k in enumerate(prompts)])))

        out = asyncio.run(main())
        for req_id, (prompt, img) in prompts.items():
            assert tokens_of(out[req_id]) == hf_greedy_vl(tiny_qwen25_vl, prompt, img, NUM_NEW), req_id
    finally:
        engine.close()


@pytest.mark.slow
def test_an_image_request_through_the_engine_process(tiny_qwen25_vl):
    """The images cross to the engine process with the request; the class's traits come back."""
    img = image(13)
    prompt = image_prompt(tiny_qwen25_vl, [40, 41], img, [42, 43])
    config = TTEngineConfig.from_engine_args(
        dict(model=str(tiny_qwen25_vl), max_num_seqs=2, block_size=16, max_model_len=128, max_num_batched_tokens=128)
    )
    engine = TTMeshEngine.in_engine_process(config)
    try:
        assert engine.host.vision.uses_mrope

        async def main():
            return [d async for d in engine.generate(GenerateRequest("r", prompt, greedy(NUM_NEW)), (img,))]

        assert tokens_of(asyncio.run(main())) == hf_greedy_vl(tiny_qwen25_vl, prompt, img, NUM_NEW)
    finally:
        engine.close()


@pytest.mark.slow
def test_a_preempted_image_request_resumes_with_its_image(tiny_qwen25_vl):
    """KV for two requests' worth only: the youngest image request is preempted and recomputed
    (prompt + outputs, its image passed again, its rope delta recomputed), still HF's tokens."""
    num_new = 40
    prompts = {
        f"img-{i}": (image_prompt(tiny_qwen25_vl, [40 + i, 41], img, [42, 43 + i]), img)
        for i, img in enumerate([image(21), image(22, (1, 4, 8)), image(23)])
    }
    config = TTEngineConfig.from_engine_args(
        dict(
            model=str(tiny_qwen25_vl),
            max_num_seqs=4,
            block_size=16,
            max_model_len=128,
            max_num_batched_tokens=128,
            num_gpu_blocks_override=8,
            additional_config={"tt": {"enable_model_warmup": False}},
        )
    )
    engine = TTMeshEngine(config, keep_step_log=True)
    try:

        async def main():
            async def one(req_id):
                prompt, img = prompts[req_id]
                request = GenerateRequest(req_id, prompt, greedy(num_new))
                return [d async for d in engine.generate(request, (img,))]

            return dict(zip(prompts, await asyncio.gather(*[one(k) for k in prompts])))

        out = asyncio.run(main())
        assert any(rec.preempted_req_ids for rec in engine.step_log), "nothing was preempted"
        for req_id, (prompt, img) in prompts.items():
            assert tokens_of(out[req_id]) == hf_greedy_vl(tiny_qwen25_vl, prompt, img, num_new), req_id
    finally:
        engine.close()
