"""Tiny offline checkpoints: ``python -m accel.models.tiny OUT_DIR``.

Writes ``OUT_DIR/tiny-llama`` (LlamaForCausalLM, GQA 8:2, head_dim 32, llama3 RoPE scaling) and
``OUT_DIR/tiny-qwen3`` (Qwen3ForCausalLM, q/k norm, tied embeddings), each with config.json,
model.safetensors, generation_config.json and a byte-level BPE tokenizer trained with the
``tokenizers`` library on source text that ships with Python (``bpe_training.py``), and
``OUT_DIR/tiny-qwen25-vl`` (Qwen2_5_VLForConditionalGeneration with its HF processor:
``tiny_vl.py``) and ``OUT_DIR/tiny-idefics3`` (Idefics3ForConditionalGeneration, the VLM vLLM-CPU
serves here: ``tiny_idefics3.py``). No hub access.

Everything is seeded and serialized in a fixed order, so two runs give byte-identical files.
Weights are drawn with a larger spread than a real model's init so that logits are peaked: greedy
decoding then has clear winners and comparisons between implementations are token-exact rather
than decided by float noise between near-tied logits.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from accel import envs
from accel.models.bpe_training import canonicalize_json, train_byte_level_bpe
from accel.models.generation_config import save_token_ids
from accel.models.seeded_init import seeded_reinit
from accel.models.tiny_idefics3 import TINY_IDEFICS3, build_idefics3_checkpoint
from accel.models.tiny_vl import TINY_QWEN25_VL, build_vl_checkpoint

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerFast

VOCAB_SIZE = 1024
SPECIAL_TOKENS = ("<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>")
BOS, EOS, PAD = "<s>", "</s>", "<pad>"

# Renders {"role", "content"} messages; bos first, like Llama templates. Tool use is rendered
# the way Hermes / Qwen2.5 templates do it (what vLLM's `hermes` tool parser reads back): the
# tools as JSON lines in a system block, an assistant turn's tool calls as
# `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (arguments arrive as a dict: vLLM
# parses the OpenAI JSON string before rendering), tool results as a user turn's
# `<tool_response>`. `enable_thinking=false` (a chat_template_kwargs) closes an empty think block
# after the generation prompt, as Qwen3's template does. Without tools, tool turns or
# enable_thinking the output is the plain `<|im_start|>role\ncontent<|im_end|>` form.
_CHAT_TEMPLATE_LINES = r"""
{{ bos_token }}
{% set ns = namespace(start=0) %}
{% if tools %}
  {{ '<|im_start|>system\n' }}
  {% if messages and messages[0]['role'] == 'system' %}
    {{ messages[0]['content'] + '\n\n' }}{% set ns.start = 1 %}
  {% endif %}
  {{ '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' }}
  {{ 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}
  {% for tool in tools %}{{ '\n' + (tool | tojson) }}{% endfor %}
  {{ '\n</tools>\n\nFor each function call, return a json object with function name and arguments ' }}
  {{ 'within <tool_call></tool_call> XML tags:\n<tool_call>\n' }}
  {{ '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' }}
{% endif %}
{% for message in messages[ns.start:] %}
  {% if message['role'] == 'tool' %}
    {{ '<|im_start|>user\n<tool_response>\n' + message['content'] + '\n</tool_response><|im_end|>\n' }}
  {% elif message['role'] == 'assistant' and message['tool_calls'] %}
    {{ '<|im_start|>assistant\n' + message['content'] }}
    {% for call in message['tool_calls'] %}
      {% set fn = call['function'] %}
      {{ '<tool_call>\n{"name": "' + fn['name'] + '", "arguments": ' }}
      {% if fn['arguments'] is string %}{{ fn['arguments'] }}{% else %}{{ fn['arguments'] | tojson }}{% endif %}
      {{ '}\n</tool_call>' }}
    {% endfor %}
    {{ '<|im_end|>\n' }}
  {% else %}
    {{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}
  {% endif %}
{% endfor %}
{% if add_generation_prompt %}
  {{ '<|im_start|>assistant\n' }}
  {% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\n\n</think>\n\n' }}{% endif %}
{% endif %}
"""
CHAT_TEMPLATE = "".join(line.strip() for line in _CHAT_TEMPLATE_LINES.splitlines())


@dataclass(frozen=True)
class TinySpec:
    name: str
    architecture: str
    hidden_size: int = 256
    intermediate_size: int = 768
    num_hidden_layers: int = 4
    num_attention_heads: int = 8
    num_key_value_heads: int = 2
    head_dim: int = 32
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    seed: int = 0
    weight_std: float = 0.15


TINY_LLAMA = TinySpec("tiny-llama", "LlamaForCausalLM", seed=1234)
TINY_QWEN3 = TinySpec("tiny-qwen3", "Qwen3ForCausalLM", tie_word_embeddings=True, seed=4321)
TINY_SPECS = (TINY_LLAMA, TINY_QWEN3)


def build_tokenizer() -> PreTrainedTokenizerFast:
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    tok = train_byte_level_bpe(SPECIAL_TOKENS, VOCAB_SIZE)
    bos_id = tok.token_to_id(BOS)
    # Completions get bos prepended (what Llama tokenizers do); chat templates carry bos themselves.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]  # transformers leaves it unannotated
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=TINY_LLAMA.max_position_embeddings,
    )


def build_config(spec: TinySpec, tokenizer: PreTrainedTokenizerFast) -> PretrainedConfig:
    from transformers import LlamaConfig, Qwen3Config

    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        rms_norm_eps=1e-6,
        tie_word_embeddings=spec.tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        initializer_range=spec.weight_std,
    )
    if spec.architecture == "LlamaForCausalLM":
        rope = {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 512,
        }
        return LlamaConfig(rope_parameters=rope, **common)
    rope = {"rope_type": "default", "rope_theta": 1000000.0}
    return Qwen3Config(rope_parameters=rope, **common)


def build_hf_model(spec: TinySpec, tokenizer: PreTrainedTokenizerFast) -> PreTrainedModel:
    import torch
    from transformers import AutoModelForCausalLM

    config = build_config(spec, tokenizer)
    torch.manual_seed(spec.seed)
    model: PreTrainedModel = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]  # transformers leaves it unannotated
    return seeded_reinit(model, spec.seed, spec.weight_std, lambda name: name.endswith("norm.weight"))


def write_checkpoint(spec: TinySpec, out_dir: Path, tokenizer: PreTrainedTokenizerFast) -> Path:
    path = out_dir / spec.name
    path.mkdir(parents=True, exist_ok=True)
    model = build_hf_model(spec, tokenizer)
    model.save_pretrained(str(path), safe_serialization=True)
    tokenizer.save_pretrained(str(path))
    save_token_ids(tokenizer, path, greedy_default=True)
    canonicalize_json(path)
    return path


def build_all(out_dir: Path) -> list[Path]:
    tokenizer = build_tokenizer()
    text = [write_checkpoint(spec, out_dir, tokenizer) for spec in TINY_SPECS]
    return [*text, build_vl_checkpoint(TINY_QWEN25_VL, out_dir), build_idefics3_checkpoint(TINY_IDEFICS3, out_dir)]


def ensure_checkpoints(out_dir: Path) -> list[Path]:
    """Build the checkpoints unless they already exist (idempotent, cheap on the second call)."""
    paths = [out_dir / spec.name for spec in TINY_SPECS]
    if all((p / "model.safetensors").exists() and (p / "tokenizer.json").exists() for p in paths):
        for p in paths:
            _refresh_chat_template(p)
        # (the VL checkpoints came later: each built alone where the text ones already exist)
        vl, idefics3 = out_dir / TINY_QWEN25_VL.name, out_dir / TINY_IDEFICS3.name
        has_vl = (vl / "model.safetensors").exists() and (vl / "preprocessor_config.json").exists()
        has_idefics3 = (idefics3 / "model.safetensors").exists() and (idefics3 / "processor_config.json").exists()
        return [
            *paths,
            vl if has_vl else build_vl_checkpoint(TINY_QWEN25_VL, out_dir),
            idefics3 if has_idefics3 else build_idefics3_checkpoint(TINY_IDEFICS3, out_dir),
        ]
    return build_all(out_dir)


def _refresh_chat_template(path: Path) -> None:
    """Bring an existing checkpoint's chat template up to ``CHAT_TEMPLATE`` (it only grew: the
    tool-use and enable_thinking branches; plain conversations render as before). Written to a
    temporary file and renamed, so a concurrent reader sees the old or the new file whole."""
    target = path / "chat_template.jinja"
    if target.exists() and target.read_text(encoding="utf-8") == CHAT_TEMPLATE:
        return
    tmp = path / f".chat_template.jinja.{os.getpid()}"
    tmp.write_text(CHAT_TEMPLATE, encoding="utf-8")
    os.replace(tmp, target)


def main(argv: list[str] | None = None) -> int:
    default_dir = envs.ENVS.checkpoint_dir
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", nargs="?", default=str(default_dir), help=f"output folder (default: {default_dir})")
    parser.add_argument("--if-missing", action="store_true", help="do nothing if they already exist")
    args = parser.parse_args(argv)
    out = Path(args.out_dir).expanduser()
    paths = ensure_checkpoints(out) if args.if_missing else build_all(out)
    for p in paths:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
