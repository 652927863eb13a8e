import json

import numpy as np
import pytest


def image(seed: int, width: int = 64, height: int = 48):
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


CHAT = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]}]


def test_config_is_qwen25_vl_with_vision_tokens(tiny_qwen25_vl):
    from transformers import AutoTokenizer

    config = json.loads((tiny_qwen25_vl / "config.json").read_text())
    assert config["architectures"] == ["Qwen2_5_VLForConditionalGeneration"]
    tok = AutoTokenizer.from_pretrained(str(tiny_qwen25_vl))
    for name, key in (("<|image_pad|>", "image_token_id"), ("<|vision_start|>", "vision_start_token_id")):
        assert tok.convert_tokens_to_ids(name) == config[key]
    assert config["text_config"]["rope_parameters"]["mrope_section"] == [4, 6, 6]
    processor = json.loads((tiny_qwen25_vl / "preprocessor_config.json").read_text())
    assert processor["processor_class"] == "Qwen2_5_VLProcessor"


def test_chat_template_renders_image_parts(tiny_qwen25_vl):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_qwen25_vl))
    text = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What is this?<|im_end|>\n<|im_start|>assistant\n"
    )
    plain = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert plain == "<|im_start|>user\nhi<|im_end|>\n"


def test_image_sizes_give_4_to_16_image_tokens(tiny_qwen25_vl):
    from tests.hf_reference import qwen25_vl_inputs

    pad = json.loads((tiny_qwen25_vl / "config.json").read_text())["image_token_id"]
    small = qwen25_vl_inputs(tiny_qwen25_vl, CHAT, [image(1, 10, 10)])["input_ids"]
    large = qwen25_vl_inputs(tiny_qwen25_vl, CHAT, [image(1, 640, 640)])["input_ids"]
    assert int((small == pad).sum()) == 4 and int((large == pad).sum()) == 16


@pytest.mark.parametrize("seeds", [(1, 2)])
def test_hf_greedy_depends_on_the_image(tiny_qwen25_vl, seeds):
    from tests.hf_reference import hf_vl_greedy

    a, b = (hf_vl_greedy(tiny_qwen25_vl, CHAT, [image(s)], 8) for s in seeds)
    assert len(a) == 8 and a != b
    assert hf_vl_greedy(tiny_qwen25_vl, CHAT, [image(seeds[0])], 8) == a
