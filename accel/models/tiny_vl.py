"""The tiny vision-language checkpoint: ``OUT_DIR/tiny-qwen25-vl`` (built by ``accel.models.tiny``).

A Qwen2.5-VL architecture (``Qwen2_5_VLForConditionalGeneration``: a 2-block vision tower with
window attention and the 2x2 patch merger, a 4-layer Qwen2 text model with multimodal rotary
positions) with seeded random weights, and its HF processor (``Qwen2_5_VLProcessor``: the
``Qwen2VLImageProcessor`` config and a byte-level BPE tokenizer carrying the vision tokens
``<|vision_start|>``, ``<|image_pad|>``, ``<|vision_end|>``, ``<|video_pad|>``), so both HF
transformers and vLLM load it offline. Images are resized to between 2x2 and 4x4 merged patches
(``min_pixels`` / ``max_pixels``), so one image costs 4 to 16 prompt tokens.

Like the text checkpoints: fixed seed, fixed parameter order, weights with a large spread (peaked
logits, so greedy comparisons are token-exact), sorted JSON, byte-identical reruns.
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

VL_VOCAB_SIZE = 1024
EOS, PAD = "<|endoftext|>", "<|endoftext|>"
VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"
VL_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)

# Qwen2-VL's template, trimmed: a string content renders as is; a list of parts renders text
# parts' text and each image part (vLLM passes {"type": "image"}; HF's processor examples pass
# "image" / "image_url" keys) as <|vision_start|><|image_pad|><|vision_end|>, which the processor
# expands to one <|image_pad|> per merged patch. No bos (Qwen tokenizers add none).
_VL_CHAT_TEMPLATE_LINES = r"""
{% for message in messages %}
  {{ '<|im_start|>' + message['role'] + '\n' }}
  {% if message['content'] is string %}
    {{ message['content'] }}
  {% else %}
    {% for part in message['content'] %}
      {% if part['type'] == 'image' or 'image' in part or 'image_url' in part %}
        {{ '<|vision_start|><|image_pad|><|vision_end|>' }}
      {% elif part['type'] == 'text' %}
        {{ part['text'] }}
      {% endif %}
    {% endfor %}
  {% endif %}
  {{ '<|im_end|>\n' }}
{% endfor %}
{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}
"""
VL_CHAT_TEMPLATE = "".join(line.strip() for line in _VL_CHAT_TEMPLATE_LINES.splitlines())

PATCH_SIZE = 14
MERGE_SIZE = 2
# 28 x 28 pixels make one merged patch = one <|image_pad|> token.
MIN_PIXELS = (PATCH_SIZE * MERGE_SIZE) ** 2 * 4
MAX_PIXELS = (PATCH_SIZE * MERGE_SIZE) ** 2 * 16


@dataclass(frozen=True)
class TinyVLSpec:
    name: str
    hidden_size: int = 256
    intermediate_size: int = 768
    num_hidden_layers: int = 4
    num_attention_heads: int = 8  # head_dim 32: mrope_section sums to 16
    num_key_value_heads: int = 2
    mrope_section: tuple[int, int, int] = (4, 6, 6)
    vision_depth: int = 2
    vision_hidden_size: int = 64
    vision_num_heads: int = 2
    vision_intermediate_size: int = 128
    max_position_embeddings: int = 4096
    seed: int = 2525
    weight_std: float = 0.15


TINY_QWEN25_VL = TinyVLSpec("tiny-qwen25-vl")


def build_vl_tokenizer() -> PreTrainedTokenizerFast:
    from transformers import PreTrainedTokenizerFast

    tok = train_byte_level_bpe(VL_SPECIAL_TOKENS, VL_VOCAB_SIZE)
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]  # transformers leaves it unannotated
        tokenizer_object=tok,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=list(VL_SPECIAL_TOKENS[1:]),
        chat_template=VL_CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=TINY_QWEN25_VL.max_position_embeddings,
    )


def build_vl_config(spec: TinyVLSpec, tokenizer: PreTrainedTokenizerFast) -> PretrainedConfig:
    from transformers import Qwen2_5_VLConfig

    ids = {t: int(tokenizer.convert_tokens_to_ids(t)) for t in (VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)}  # type: ignore[arg-type]  # one token in, one id out
    text: dict[str, Any] = dict(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": list(spec.mrope_section)},
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        initializer_range=spec.weight_std,
        tie_word_embeddings=False,
    )
    vision: dict[str, Any] = dict(
        depth=spec.vision_depth,
        hidden_size=spec.vision_hidden_size,
        num_heads=spec.vision_num_heads,
        intermediate_size=spec.vision_intermediate_size,
        out_hidden_size=spec.hidden_size,
        patch_size=PATCH_SIZE,
        spatial_merge_size=MERGE_SIZE,
        temporal_patch_size=2,
        window_size=PATCH_SIZE * MERGE_SIZE * 2,  # 2x2 merged patches per attention window
        fullatt_block_indexes=[spec.vision_depth - 1],
        initializer_range=spec.weight_std,
    )
    return Qwen2_5_VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids[IMAGE_PAD],
        video_token_id=ids[VIDEO_PAD],
        vision_start_token_id=ids[VISION_START],
        vision_end_token_id=ids[VISION_END],
        tie_word_embeddings=False,
    )


def build_vl_model(spec: TinyVLSpec, tokenizer: PreTrainedTokenizerFast) -> PreTrainedModel:
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration

    config = build_vl_config(spec, tokenizer)
    torch.manual_seed(spec.seed)
    model: PreTrainedModel = Qwen2_5_VLForConditionalGeneration._from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]  # transformers leaves it unannotated
    return seeded_reinit(model, spec.seed, spec.weight_std, _is_norm_scale)


def _is_norm_scale(name: str) -> bool:
    """RMSNorm / LayerNorm weights (the merger's ``ln_q`` too); their biases are drawn like the rest."""
    return name.endswith(".weight") and ("norm" in name or ".ln_q." in name)


def build_vl_image_processor() -> Any:
    """The ``Qwen2VLImageProcessor`` of the checkpoint, PIL backend (this venv has no torchvision)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(
        min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS, patch_size=PATCH_SIZE, merge_size=MERGE_SIZE
    )


def save_vl_processor(tokenizer: PreTrainedTokenizerFast, path: Path) -> None:
    """The files ``Qwen2_5_VLProcessor.from_pretrained`` reads: the image processor's config naming
    the processor class, the tokenizer, the chat template. Written piecewise because transformers
    5.19 cannot construct a ``Qwen2_5_VLProcessor`` without torchvision (its video processor is a
    required part), and the CPU venv has none (the PyPI torchvision wheel is built against CUDA
    torch and breaks imports next to the CPU build; see the Makefile)."""
    image_processor = build_vl_image_processor()
    image_processor.processor_class = "Qwen2_5_VLProcessor"
    image_processor.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    (path / "chat_template.jinja").write_text(VL_CHAT_TEMPLATE, encoding="utf-8")


def build_vl_checkpoint(spec: TinyVLSpec, out_dir: Path) -> Path:
    """Write ``out_dir/spec.name``: config, weights, tokenizer, processor and generation config."""
    path = out_dir / spec.name
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_vl_tokenizer()
    build_vl_model(spec, tokenizer).save_pretrained(str(path), safe_serialization=True)
    save_vl_processor(tokenizer, path)
    save_token_ids(tokenizer, path, greedy_default=True)
    canonicalize_json(path)
    return path
