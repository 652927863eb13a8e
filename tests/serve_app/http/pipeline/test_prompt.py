"""The prompt stage's block hashes for a chat with images: keyed by the images' content hashes
from the first image's block on (accel.block_hash), the text before it shared with text prompts."""

from __future__ import annotations

import asyncio
import base64
import io

import numpy as np

from accel.block_hash import ImageSlot, hash_prompt_blocks
from accel.text.tokenizer import load_tokenizer
from deployments.config.load import load_app_config
from serve_app.http.pipeline.endpoints import CHAT
from serve_app.http.pipeline.parse import Parsed, ResolvedModel
from serve_app.http.pipeline.prompt import prompt

BS = 32
TEXT = "Look closely at the picture below and describe its colours and shapes in detail. " * 2


def _url(seed: int) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _prompts(tiny_idefics3, *content: dict):
    config = load_app_config(
        {
            "models": [{"name": "vl", "path": str(tiny_idefics3)}],
            "pools": [
                {
                    "name": "v",
                    "engine": "vllm",
                    "accelerator": "cpu",
                    "model": "vl",
                    "replicas": 1,
                    "engine_args": {"max_model_len": 256},
                }
            ],
        },
        "t",
    )
    target = ResolvedModel(config.models[0], load_tokenizer(str(tiny_idefics3)))
    body = {"model": "vl", "messages": [{"role": "user", "content": list(content)}]}
    parsed = Parsed(CHAT.for_model(CHAT.read(body), target.tok), target, None, None, None, None)
    out = asyncio.run(prompt(parsed, BS))
    [ids] = out.token_ids
    return ids, out.hashes[ids], out.images


def test_chat_image_blocks_are_keyed_by_the_image(tiny_idefics3):
    text = {"type": "text", "text": TEXT}
    image_a, image_b = ({"type": "image_url", "image_url": {"url": _url(s)}} for s in (1, 2))
    ids, a, [encoded] = _prompts(tiny_idefics3, text, image_a)
    ids_b, b, _ = _prompts(tiny_idefics3, text, image_b)
    position = ids.index(4)  # tiny-idefics3's <image> (config.json image_token_id)
    assert ids == ids_b and position >= BS
    assert a == tuple(hash_prompt_blocks(ids, BS, images=[ImageSlot(position, encoded.content_hash)]))
    num_text = position // BS
    assert a[:num_text] == b[:num_text] == tuple(hash_prompt_blocks(ids, BS)[:num_text])
    assert not set(a[num_text:]) & set(b[num_text:])
    assert _prompts(tiny_idefics3, text, image_a)[1] == a  # the same image: the same hashes
