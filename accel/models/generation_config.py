"""The ``generation_config.json`` our locally built checkpoints carry.

Only the special-token ids (plus, for the random tiny checkpoints, ``do_sample: false``): no
sampling defaults, so vLLM's ``generation_config: auto`` leaves a request's sampling as sent,
on bare vLLM as on ours (a real SmolLM2 download has none either).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def save_token_ids(tokenizer: PreTrainedTokenizerBase, path: Path, *, greedy_default: bool = False) -> None:
    """Write ``path/generation_config.json`` with the tokenizer's bos/eos/pad ids.
    ``greedy_default``: also ``do_sample: false`` (what transformers' ``generate`` reads)."""
    from transformers import GenerationConfig

    extra = {"do_sample": False} if greedy_default else {}
    GenerationConfig(  # type: ignore[no-untyped-call]  # transformers leaves it unannotated
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **extra,
    ).save_pretrained(str(path))
