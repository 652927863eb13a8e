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


def hf_greedy(model_dir: str | Path, prompt_ids: Sequence[int], max_new_tokens: int,
              eos_token_ids: frozenset[int] = frozenset(), ignore_eos: bool = True) -> list[int]:
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
