"""End to end: chats with images on a TT pool through the official ``openai`` client (issue 40).

A TT pool serves the tiny Qwen2.5-VL (``accel/models/tiny_vl.py``) with the torch program
``TorchQwen25VLMeshModel``; the ingress fetches the image (a data: URL), renders the chat with one
placeholder per image and pins the request to that pool, whose engine runs the checkpoint's HF
image processor. Its greedy tokens equal HF's ``Qwen2_5_VLForConditionalGeneration`` on the HF
processor's inputs, streamed and not; two different images give different answers. The TT pool
takes no local files (its engine config has no ``allowed_local_media_path``): a ``file://`` URL
is a 400 naming ``messages``.
"""

from __future__ import annotations

import base64
import io

import httpx
import openai
import pytest
from PIL import Image

from tests.doubles.deployed_app import deployed_app
from tests.hf_reference import hf_vl_greedy

pytestmark = pytest.mark.slow

APP = "meshserve-e2e-images-tt"
NUM_NEW = 6
TEXT = "describe"


def _picture(color: tuple[int, int, int], size: tuple[int, int] = (64, 48)) -> Image.Image:
    img = Image.new("RGB", size, color)
    img.putpixel((3, 5), (255 - color[0], 7, 99))
    return img


PICTURES = {"red": _picture((220, 10, 10)), "blue": _picture((10, 10, 220), (96, 64))}


def _data_url(img: Image.Image) -> str:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _chat(*urls: str) -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": TEXT}]}]


@pytest.fixture(scope="module")
def ours(serve_session, tiny_qwen25_vl):
    args = {
        "config_file": "tests/e2e/test_images_tt.py",
        "models": [{"name": "tiny-vl", "path": str(tiny_qwen25_vl)}],
        "pools": [
            {
                "name": "tt-vl",
                "engine": "tt",
                "accelerator": "cpu",
                "model": "tiny-vl",
                "replicas": 1,
                "resources": {"num_cpus": 0},
                "engine_args": {
                    "max_model_len": 256,
                    "max_num_seqs": 2,
                    "block_size": 16,
                    "max_num_batched_tokens": 256,
                },
            }
        ],
        "ingress": {"replicas": 1},
    }
    with deployed_app(serve_session, APP, args, "/e2e-images-tt") as url:
        yield url


def test_images_on_a_tt_pool_equal_hf(ours, tiny_qwen25_vl):
    client = openai.OpenAI(base_url=f"{ours}/v1", api_key="unused", max_retries=0, timeout=300)
    extra = {"ignore_eos": True, "return_token_ids": True}
    greedy = {"max_tokens": NUM_NEW, "temperature": 0}
    got = {}
    for name, img in PICTURES.items():
        messages = _chat(_data_url(img))
        r = client.chat.completions.create(model="tiny-vl", messages=messages, extra_body=extra, **greedy)
        want = hf_vl_greedy(
            tiny_qwen25_vl,
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": TEXT}]}],
            [img],
            NUM_NEW,
        )
        assert r.choices[0].token_ids == want, name
        stream = client.chat.completions.create(
            model="tiny-vl", messages=messages, stream=True, extra_body=extra, **greedy
        )
        streamed = [t for chunk in stream for c in chunk.choices for t in (getattr(c, "token_ids", None) or [])]
        assert streamed == want, name
        got[name] = want
    assert got["red"] != got["blue"]  # different images, different answers


def test_a_local_file_is_refused_on_a_tt_pool(ours, tmp_path):
    """A TT pool's engine config has no allowed_local_media_path: file:// URLs are a 400."""
    path = tmp_path / "red.png"
    PICTURES["red"].save(path)
    body = {"model": "tiny-vl", "messages": _chat(f"file://{path}"), "max_tokens": 2}
    r = httpx.post(f"{ours}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text
