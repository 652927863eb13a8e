"""End to end: chats with images through the official ``openai`` client against our stack (a vLLM
pool on ``tiny-idefics3``, a TT pool on the text-only ``tiny-llama``) and a bare vLLM 0.32 server
on the same checkpoint with the same engine args.

Equal: the greedy token ids (``return_token_ids``) and prompt token counts for one image (two
different images: different answers), two images, text only on the VLM, streamed and not, and the
Responses API's ``input_image``; the cached prompt tokens of a long system prompt and an image
(the same image again: cached past the image; another image: only the text blocks before it);
the statuses of the refusals (more images than
``limit_mm_per_prompt``, an undecodable image, an audio part); a local file without
``allowed_local_media_path``: a 400 here, vLLM 0.32's 500 there. Ours only (bare vLLM has no TT pool): images to
the model only a TT pool serves are a 400 naming ``messages``.
"""

from __future__ import annotations

import base64
import io
import json

import httpx
import numpy as np
import openai
import pytest

from tests.doubles.deployed_app import deployed_app
from tests.e2e.bare_vllm import bare_vllm_server

pytestmark = pytest.mark.slow

APP = "meshserve-e2e-images"
VL_ARGS = {
    "max_model_len": 256,
    "max_num_seqs": 4,
    "dtype": "float32",
    "enforce_eager": True,
    "block_size": 32,
    "limit_mm_per_prompt": {"image": 2},
}


def _data_url(seed: int) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _image(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def _chat(*parts: dict) -> list[dict]:
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "What is this?"}]}]


CHATS = [
    _chat(_image(_data_url(1))),
    _chat(_image(_data_url(2))),
    _chat(_image(_data_url(1)), _image(_data_url(2))),
    [{"role": "user", "content": "What is this?"}],
]
GREEDY = {"max_tokens": 8, "temperature": 0}
EXTRA = {"ignore_eos": True, "return_token_ids": True}
REFUSALS = [
    _chat(*(_image(_data_url(s)) for s in range(3))),  # over limit_mm_per_prompt
    _chat(_image("data:image/png;base64," + base64.b64encode(b"not an image").decode())),
    _chat({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}),
    _chat(_image("file:///etc/hostname")),
]


SYSTEM = "You describe pictures carefully, naming every colour and every shape that you can see. "
QUESTION = "What is this? Describe it in three short sentences: its colours, its shapes and its mood."


def _cached_tokens(client: openai.OpenAI, model: str) -> list[int]:
    """Cached prompt tokens of one chat sent with image 5, again, then with image 6 (the image
    sits in block 1 of 32 tokens, the expanded prompt fills 3 blocks)."""
    counts = []
    for seed in (5, 5, 6):
        user = {"role": "user", "content": [_image(_data_url(seed)), {"type": "text", "text": QUESTION}]}
        r = client.chat.completions.create(
            model=model, messages=[{"role": "system", "content": SYSTEM}, user], **GREEDY
        )
        counts.append(r.usage.prompt_tokens_details.cached_tokens)
    return counts


def _answers(base_url: str, model: str) -> dict:
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=120)
    tokens = []
    for messages in CHATS:
        r = client.chat.completions.create(model=model, messages=messages, extra_body=EXTRA, **GREEDY)
        tokens.append((r.choices[0].token_ids, r.usage.prompt_tokens))
    stream = client.chat.completions.create(model=model, messages=CHATS[0], stream=True, extra_body=EXTRA, **GREEDY)
    streamed = [t for chunk in stream for c in chunk.choices for t in (getattr(c, "token_ids", None) or [])]
    response = client.responses.create(
        model=model,
        input=[{"role": "user", "content": [{"type": "input_image", "image_url": _data_url(1), "detail": "auto"}]}],
        max_output_tokens=8,
        temperature=0,
    )
    statuses = [
        httpx.post(
            f"{base_url}/v1/chat/completions", json={"model": model, "messages": m, **GREEDY}, timeout=60
        ).status_code
        for m in REFUSALS
    ]
    cached = _cached_tokens(client, model)
    return {
        "tokens": tokens,
        "streamed": streamed,
        "responses_text": response.output_text,
        "statuses": statuses,
        "cached": cached,
    }


@pytest.fixture(scope="module")
def reference(tiny_idefics3, tmp_path_factory) -> dict:
    logs = tmp_path_factory.mktemp("bare")
    cli_args = {**VL_ARGS, "limit_mm_per_prompt": json.dumps(VL_ARGS["limit_mm_per_prompt"])}
    cli_args["enable_prompt_tokens_details"] = True  # (meshserve always reports cached tokens)
    with bare_vllm_server(tiny_idefics3, "tiny-vl", cli_args, logs / "vl.log") as url:
        return _answers(url, "tiny-vl")


@pytest.fixture(scope="module")
def ours(serve_session, reference, tiny_idefics3, tiny_llama):
    args = {
        "config_file": "tests/e2e/test_images.py",
        "models": [{"name": "tiny-vl", "path": str(tiny_idefics3)}, {"name": "tiny-llama", "path": str(tiny_llama)}],
        "pools": [
            {
                "name": "vl",
                "engine": "vllm",
                "accelerator": "cpu",
                "model": "tiny-vl",
                "replicas": 1,
                "resources": {"num_cpus": 0},
                "engine_args": VL_ARGS,
            },
            {
                "name": "tt",
                "engine": "tt",
                "accelerator": "cpu",
                "model": "tiny-llama",
                "replicas": 1,
                "resources": {"num_cpus": 0},
                "engine_args": {"max_model_len": 256, "max_num_seqs": 4},
            },
        ],
        "ingress": {"replicas": 1},
    }
    with deployed_app(serve_session, APP, args, "/e2e-images") as url:
        yield url


def test_images_equal_bare_vllm(reference, ours):
    mine = _answers(ours, "tiny-vl")
    assert reference["tokens"][0] != reference["tokens"][1]  # the image matters
    assert mine["tokens"] == reference["tokens"]
    assert mine["streamed"] == reference["streamed"] == reference["tokens"][0][0]
    assert mine["responses_text"] == reference["responses_text"]
    # vLLM 0.32 answers a local file without --allowed-local-media-path with a 500 (the
    # RuntimeError of MediaConnector._load_file_url); ours is a 400 naming messages.
    assert reference["statuses"] == [400, 400, 400, 500]
    assert mine["statuses"] == [400] * len(REFUSALS)


def test_images_to_a_tt_only_model_are_refused(ours):
    body = {"model": "tiny-llama", "messages": CHATS[0], **GREEDY}
    r = httpx.post(f"{ours}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
