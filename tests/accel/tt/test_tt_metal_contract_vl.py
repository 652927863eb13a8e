"""Images through the engine against tt-metal's Qwen2.5-VL generator contract (the double in
``tests/doubles/tt_metal_contract/tt_qwen25_vl``: its signatures at tt-metal b589652d, HF's
numbers), registered through ``EXTRA_MODELS_DIR`` and driven on the ttnn stub: per-row
``pixel_values`` / ``image_grid_thw`` to ``prefill_forward``, its ``rope_deltas`` kept per request
and handed to every decode as ``rope_deltas_all_users``, and each upstream gate (no prefix caching,
one image per request, text-only and image rows in separate prefill steps)."""

from __future__ import annotations

import asyncio

import pytest

from accel.contract import ConfigError, GenerateRequest, InvalidRequestError
from accel.tt.backend import open_backend
from accel.tt.config import TTEngineConfig
from accel.tt.engine import TTMeshEngine
from accel.tt.mesh_device import MeshDeviceConfig
from accel.tt.multimodal import UPSTREAM_VISION_TRAITS
from accel.tt.registry import build_registry

from .conftest import CONTRACT_MODELS_DIR
from .engine_harness import greedy, tokens_of
from .vl_checkpoint import hf_greedy_vl, image, image_prompt

pytestmark = pytest.mark.slow

NUM_NEW = 6


def vl_engine(ttnn, ckpt, **engine_args):
    ttnn._stub_simulate(8, ttnn.cluster.ClusterType.T3K)
    registry = build_registry(extra_models_dir=str(CONTRACT_MODELS_DIR), include_builtins=True)
    backend = open_backend("ttnn", MeshDeviceConfig(grid=(1, 8), dispatch_core_axis="row"), registry=registry)
    args = dict(
        model=str(ckpt),
        max_num_seqs=4,
        block_size=16,
        max_model_len=128,
        max_num_batched_tokens=128,
        additional_config={"tt": {"enable_model_warmup": False}},
    )
    return TTMeshEngine(TTEngineConfig.from_engine_args(args | engine_args), backend=backend)


def run(engine, items, stagger_s=0.02):
    """``items``: (request, images) pairs, started ``stagger_s`` apart; their deltas by id."""

    async def one(i, request, images):
        await asyncio.sleep(i * stagger_s)
        return [d async for d in engine.generate(request, images)]

    async def main():
        outs = await asyncio.gather(*[one(i, r, imgs) for i, (r, imgs) in enumerate(items)])
        return {r.request_id: o for (r, _), o in zip(items, outs)}

    return asyncio.run(main())


def test_image_requests_equal_hf_greedy_with_text_rows_in_their_own_prefills(ttnn_stub, tiny_qwen25_vl):
    a, b = image(1), image(2, (1, 4, 8))
    prompts = {
        "img-a": (image_prompt(tiny_qwen25_vl, [40, 41, 42], a, [43, 44, 45]), a),
        "text": ((50, 51, 52, 53, 54, 55), None),
        "img-b": (image_prompt(tiny_qwen25_vl, [60], b, [61, 62]), b),
    }
    engine = vl_engine(ttnn_stub, tiny_qwen25_vl)
    try:
        model = engine.model._model
        assert type(model).__name__ == "Qwen2_5_VLForConditionalGeneration"
        assert engine.host.vision == UPSTREAM_VISION_TRAITS["Qwen2_5_VLForConditionalGeneration"]
        items = [
            (GenerateRequest(k, p, greedy(NUM_NEW)), () if img is None else (img,)) for k, (p, img) in prompts.items()
        ]
        out = run(engine, items)
        for req_id, (prompt, img) in prompts.items():
            assert tokens_of(out[req_id]) == hf_greedy_vl(tiny_qwen25_vl, prompt, img, NUM_NEW), req_id
        prefills = [kw["has_images"] for name, kw in model.calls if name == "prefill"]
        assert all(len(set(rows)) == 1 for rows in prefills)  # never mixed (the double asserts it too)
        assert {rows[0] for rows in prefills} == {True, False}
        deltas = [kw["rope_deltas_all_users"] for name, kw in model.calls if name == "decode"]
        sent = [d for d in deltas if d is not None]
        assert sent and all(len(d) == engine.config.max_num_seqs for d in sent)  # one per slot
        assert any(d != 0 for d in sent[-1])  # the image rows' deltas, not zeros
        assert None in deltas  # a steady batch keeps what it was given
    finally:
        engine.close()


def test_a_vision_class_gets_no_prefix_hits(ttnn_stub, tiny_qwen25_vl):
    img = image(3)
    prompt = image_prompt(tiny_qwen25_vl, list(range(20, 60)), img, [61, 62])
    engine = vl_engine(ttnn_stub, tiny_qwen25_vl)
    try:
        first = run(engine, [(GenerateRequest("one", prompt, greedy(3)), (img,))])["one"]
        again = run(engine, [(GenerateRequest("two", prompt, greedy(3)), (img,))])["two"]
        assert tokens_of(first) == tokens_of(again)
        assert again[-1].num_cached_tokens == 0
        starts = [kw["start_pos"] for name, kw in engine.model._model.calls if name == "prefill"]
        assert all(all(s == 0 for s in st) for st in starts)
    finally:
        engine.close()
    with pytest.raises(ConfigError, match="enable_prefix_caching"):
        vl_engine(ttnn_stub, tiny_qwen25_vl, enable_prefix_caching=True)


def test_more_images_than_the_class_takes_is_refused_naming_the_field(ttnn_stub, tiny_qwen25_vl):
    a, b = image(4), image(5)
    prompt = (*image_prompt(tiny_qwen25_vl, [40], a, [41]), *image_prompt(tiny_qwen25_vl, [], b, [42]))
    engine = vl_engine(ttnn_stub, tiny_qwen25_vl)
    try:
        with pytest.raises(InvalidRequestError) as err:
            run(engine, [(GenerateRequest("two-images", prompt, greedy(2)), (a, b))])
        assert err.value.field == "images" and "at most 1 image" in str(err.value)
    finally:
        engine.close()
