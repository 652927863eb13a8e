"""HF transformers greedy generation: the reference every engine test compares against."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=4)
def _load(model_dir: str):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def hf_greedy(
    model_dir: str | Path,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    eos_token_ids: frozenset[int] = frozenset(),
    ignore_eos: bool = True,
) -> list[int]:
    """Greedy continuation of ``prompt_ids`` with HF's own forward and KV cache.

    Stops after ``max_new_tokens`` or, unless ``ignore_eos``, after (and including) an eos token.
    """
    import torch

    model = _load(str(model_dir))
    ids = torch.tensor([list(prompt_ids)], dtype=torch.long)
    out: list[int] = []
    past = None
    with torch.no_grad():
        for _ in range(max_new_tokens):
            res = model(input_ids=ids, past_key_values=past, use_cache=True)
            past = res.past_key_values
            token = int(res.logits[0, -1].argmax())
            out.append(token)
            if not ignore_eos and token in eos_token_ids:
                break
            ids = torch.tensor([[token]], dtype=torch.long)
    return out


def hf_logprobs(
    model_dir: str | Path, prompt_ids: Sequence[int], token_ids: Sequence[int], num_top: int = 0
) -> list[tuple[float, list[int]]]:
    """Raw log-probability HF gives each of ``token_ids`` after ``prompt_ids`` (teacher forced),
    with the ids of its ``num_top`` most likely tokens at that position."""
    import torch

    model = _load(str(model_dir))
    ids = torch.tensor([list(prompt_ids) + list(token_ids)], dtype=torch.long)
    with torch.no_grad():
        # logits at position p predict token p + 1: rows len(prompt)-1 .. end-1 score token_ids
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1]
    lps = torch.log_softmax(logits.float(), dim=-1)
    return [
        (float(lps[i, t]), lps[i].topk(num_top).indices.tolist() if num_top else []) for i, t in enumerate(token_ids)
    ]


def hf_prompt_kv(model_dir: str | Path, prompt_ids: Sequence[int]):
    """HF's KV cache after prefilling ``prompt_ids``, in the canonical transfer layout
    ``[layers, 2 (K, V), tokens, kv_heads, head_dim]`` (K after RoPE, as engines store it)."""
    import torch

    model = _load(str(model_dir))
    with torch.no_grad():
        past = model(input_ids=torch.tensor([list(prompt_ids)], dtype=torch.long), use_cache=True).past_key_values
    # each layer's K and V: [batch=1, kv_heads, tokens, head_dim]
    layers = [(layer.keys, layer.values) for layer in past.layers]
    return torch.stack([torch.stack([k[0].transpose(0, 1), v[0].transpose(0, 1)]) for k, v in layers])


def vllm_text(model_dir: str | Path, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> str:
    """The text vLLM 0.32's server sends for ``output_ids`` after ``prompt_ids``: its own
    incremental detokenizer (``vllm.v1.engine.detokenizer``) with vLLM's tokenizer of the
    checkpoint. It differs from a plain ``decode`` of the ids where a character is still
    incomplete at the end (never sent) or split between prompt and output."""
    from vllm import SamplingParams
    from vllm.v1.engine import EngineCoreRequest
    from vllm.v1.engine.detokenizer import IncrementalDetokenizer

    sampling = SamplingParams(max_tokens=max(1, len(output_ids)))
    request = EngineCoreRequest("ref", list(prompt_ids), None, sampling, None, 0.0, None, None, None)
    detok = IncrementalDetokenizer.from_new_request(_vllm_tokenizer(str(model_dir)), request)
    for token_id in output_ids:
        detok.update([token_id], False)
    return detok.output_text


@lru_cache(maxsize=4)
def _vllm_tokenizer(model_dir: str):
    from vllm.tokenizers import get_tokenizer

    return get_tokenizer(model_dir)


def greedy_divergence(
    model_dir: str | Path, prompt_ids: Sequence[int], output_ids: Sequence[int]
) -> tuple[int, float] | None:
    """Where ``output_ids`` first leaves HF's greedy choice after ``prompt_ids`` (teacher forced
    on ``output_ids`` itself), as ``(index, margin)``: the logit gap between HF's best token and
    the token chosen there (0 when HF would tie). None when every token is HF's argmax.

    An engine whose fp32 sums run in another order (blocked attention, fused projections) may
    legitimately pick HF's second token where HF's top two are closer than that rounding noise;
    a real bug shows up as a large margin."""
    import torch

    model = _load(str(model_dir))
    ids = torch.tensor([list(prompt_ids) + list(output_ids)], dtype=torch.long)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
    for i, token in enumerate(output_ids):
        best = int(logits[i].argmax())
        if best != token:
            return i, float(logits[i, best] - logits[i, token])
    return None


def merge_lora(model_dir: str | Path, adapter_dir: str | Path, out_dir: Path) -> Path:
    """``model_dir`` with a PEFT LoRA adapter merged into its weights (``W + alpha/r * B @ A``),
    saved to ``out_dir``: the HF reference for generation with the adapter (no peft needed)."""
    import json

    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    config = json.loads((Path(adapter_dir) / "adapter_config.json").read_text())
    scale = config["lora_alpha"] / config["r"]
    lora = load_file(str(Path(adapter_dir) / "adapter_model.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, a in lora.items():
            if not name.endswith(".lora_A.weight"):
                continue
            b = lora[name.replace(".lora_A.", ".lora_B.")]
            target = name.removeprefix("base_model.model.").replace(".lora_A.weight", ".weight")
            params[target] += scale * (b @ a)
    model.save_pretrained(str(out_dir))
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (Path(model_dir) / f).exists():
            (out_dir / f).write_bytes((Path(model_dir) / f).read_bytes())
    return out_dir


def qwen25_vl_inputs(model_dir: str | Path, messages: list[dict], images: Sequence) -> dict:
    """HF's inputs for a Qwen2.5-VL chat: ``input_ids`` (each ``<|image_pad|>`` expanded to one per
    merged patch, as ``Qwen2_5_VLProcessor`` does), ``pixel_values``, ``image_grid_thw``.
    The pixels come from the checkpoint's own image processor; the expansion is written here
    because transformers 5.19 builds no ``Qwen2_5_VLProcessor`` without torchvision."""
    from transformers import AutoImageProcessor, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    out: dict = {}
    if images:
        image_processor = AutoImageProcessor.from_pretrained(str(model_dir))
        out = dict(image_processor(images=list(images), return_tensors="pt"))
        merge = image_processor.merge_size**2
        pieces = text.split("<|image_pad|>")
        assert len(pieces) == len(images) + 1, "one <|image_pad|> per image"
        pads = ["<|image_pad|>" * (int(thw.prod()) // merge) for thw in out["image_grid_thw"]]
        text = pieces[0] + "".join(pad + rest for pad, rest in zip(pads, pieces[1:], strict=True))
    out["input_ids"] = tok(text, return_tensors="pt", add_special_tokens=False).input_ids
    # Qwen2_5_VLProcessor returns these by default (return_mm_token_type_ids, 1 = image token);
    # without them HF's model cannot build the multimodal rotary positions and falls back to 1-D ones.
    out["mm_token_type_ids"] = (out["input_ids"] == tok.convert_tokens_to_ids("<|image_pad|>")).int()
    return out


def hf_vl_greedy(model_dir: str | Path, messages: list[dict], images: Sequence, max_new_tokens: int) -> list[int]:
    """Greedy tokens of HF's ``Qwen2_5_VLForConditionalGeneration`` for a chat with ``images``
    (PIL images, in the order of the messages' image parts); eos ignored."""
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration

    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    inputs = qwen25_vl_inputs(model_dir, messages, images)
    ids = inputs["input_ids"]
    with torch.no_grad():
        out = model.generate(
            **inputs,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
            do_sample=False,
        )
    return out[0, ids.shape[1] :].tolist()


def hf_processor_greedy(
    model_dir: str | Path, messages: list[dict], images: Sequence, max_new_tokens: int
) -> list[int]:
    """Greedy tokens of HF's image-text-to-text model for a chat with ``images`` (PIL images, in
    the order of the messages' image parts), through the checkpoint's own HF processor (what vLLM
    runs too); eos ignored. For checkpoints whose processor builds here (tiny-idefics3)."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(str(model_dir))
    model = AutoModelForImageTextToText.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    inputs = processor(images=list(images) or None, text=text, return_tensors="pt", add_special_tokens=False)
    ids = inputs["input_ids"]
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False)
    return out[0, ids.shape[1] :].tolist()
