import base64
import io

import numpy as np
import pytest

from serve_app.http.protocol.chat_images import MediaSettings, fetch_images, split_images
from serve_app.http.protocol.errors import APIError


def png_bytes(seed: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def test_split_images_keeps_order_and_leaves_text_messages_alone():
    messages = [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": "data:a"}},
                {"type": "text", "text": "and"},
                {"type": "image_url", "image_url": "data:b"},
                {"type": "input_image", "image_url": "data:c"},
            ],
        },
    ]
    out, urls = split_images(messages)
    assert urls == ("data:a", "data:b", "data:c")
    assert out[0] == messages[0]
    assert out[1]["content"] == [
        {"type": "image"},
        {"type": "text", "text": "and"},
        {"type": "image"},
        {"type": "image"},
    ]


@pytest.mark.parametrize(
    "part",
    [
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
        {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}},
        {"type": "image_url", "image_url": {}},
        {"type": "image"},
    ],
)
def test_other_modalities_and_missing_urls_are_400s_naming_messages(part):
    with pytest.raises(APIError) as err:
        split_images([{"role": "user", "content": [part]}])
    assert err.value.status == 400 and err.value.param == "messages"


def test_data_url_bytes_arrive_as_sent():
    a, b = png_bytes(1), png_bytes(2)
    images = fetch_images([data_url(a), data_url(b)], MediaSettings())
    assert [i.data for i in images] == [a, b] and [i.mime for i in images] == ["image/png"] * 2
    assert images[0].content_hash != images[1].content_hash


def test_local_files_only_under_allowed_local_media_path(tmp_path):
    allowed = tmp_path / "media"
    allowed.mkdir()
    (allowed / "a.png").write_bytes(png_bytes(1))
    (tmp_path / "b.png").write_bytes(png_bytes(2))
    settings = MediaSettings(allowed_local_media_path=str(allowed))
    assert fetch_images([f"file://{allowed / 'a.png'}"], settings)[0].data == png_bytes(1)
    for url, settings_ in (
        (f"file://{tmp_path / 'b.png'}", settings),
        (f"file://{allowed / 'a.png'}", MediaSettings()),
    ):
        with pytest.raises(APIError) as err:
            fetch_images([url], settings_)
        assert err.value.status == 400 and err.value.param == "messages"


def test_undecodable_image_is_a_400():
    with pytest.raises(APIError) as err:
        fetch_images([data_url(b"not an image")], MediaSettings())
    assert err.value.status == 400 and err.value.param == "messages"


def test_template_renders_image_parts(tiny_idefics3):
    from accel.text.tokenizer import load_tokenizer
    from serve_app.http.protocol.conversion import render_chat

    tok = load_tokenizer(str(tiny_idefics3))
    messages, _ = split_images(
        [
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": "hi"}],
            }
        ]
    )
    ids = render_chat(
        messages,
        tok,
        add_generation_prompt=True,
        continue_final_message=False,
        chat_template=None,
        add_special_tokens=False,
    )
    text = tok.decode(list(ids), skip_special_tokens=False)
    assert text == "<|im_start|>user\n<image>hi<|im_end|>\n<|im_start|>assistant\n"


def test_responses_input_image_becomes_a_chat_image_part():
    from serve_app.http.protocol.responses_api import _chat_message

    url = data_url(png_bytes(1))
    message = {"role": "user", "content": [{"type": "input_image", "image_url": url, "detail": "auto"}]}
    assert _chat_message(message)["content"] == [{"type": "image_url", "image_url": {"url": url}}]
    with pytest.raises(APIError) as err:
        _chat_message({"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]})
    assert err.value.param == "input"


def _pool(name: str, engine: str, model: str, **engine_args) -> dict:
    args = {"max_model_len": 128, **engine_args}
    return {"name": name, "engine": engine, "accelerator": "cpu", "model": model, "replicas": 1, "engine_args": args}


def test_image_requests_go_to_a_pool_whose_engine_takes_them(tiny_llama, tiny_qwen25_vl, tmp_path):
    from deployments.config.load import load_app_config
    from serve_app.http.protocol.chat_images import image_pool, media_settings

    media = {"allowed_local_media_path": str(tmp_path)}
    config = load_app_config(
        {
            "models": [
                {"name": "text", "path": str(tiny_llama)},
                {"name": "vl", "path": str(tiny_qwen25_vl)},
                {"name": "text-tt", "path": str(tiny_llama)},
                {"name": "no-images", "path": str(tiny_qwen25_vl)},
            ],
            "pools": [
                _pool("tt", "tt", "text"),
                _pool("v", "vllm", "text", **media),
                _pool("tt-vl", "tt", "vl"),
                _pool("tt-text", "tt", "text-tt"),
                _pool("v-none", "vllm", "no-images", limit_mm_per_prompt={"image": 0}),
            ],
        }
    )
    text, vl, text_tt, no_images = config.models
    # tiny-llama's TT class is text-only: the vLLM pool (whose engine refuses a text checkpoint itself)
    assert image_pool(text, None).name == image_pool(text, "v").name == "v"
    assert media_settings(image_pool(text, None)) == MediaSettings(allowed_local_media_path=str(tmp_path))
    # the tiny Qwen2.5-VL on a TT pool: TorchQwen25VLMeshModel takes images; data: and http only
    assert image_pool(vl, None).name == "tt-vl"
    assert media_settings(image_pool(vl, None)) == MediaSettings()
    for model, pinned, why in (
        (text, "tt", "text-only"),
        (text_tt, None, "text-only"),
        (no_images, None, "limit_mm_per_prompt"),
    ):
        with pytest.raises(APIError, match=why) as err:
            image_pool(model, pinned)
        assert err.value.status == 400 and err.value.param == "messages"


def test_image_data_is_not_prompt_text():
    from serve_app.http.limits import prompt_chars

    url = data_url(png_bytes(1))
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, "x"]}]
    text_only = [{"role": "user", "content": ["x"]}]
    assert prompt_chars({"messages": messages}, is_chat=True) == prompt_chars({"messages": text_only}, is_chat=True)
