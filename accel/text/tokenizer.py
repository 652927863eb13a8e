"""Loading a checkpoint's tokenizer, its eos ids and its chat template.

One ``TextTokenizer`` per process and model: the HF fast tokenizer (for chat templates and
encoding, as vLLM does it) plus its Rust ``tokenizers.Tokenizer`` (fast decode in hot loops).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from accel.contract import InvalidRequestError


def _eos_ids(model_dir: Path, hf_tok: Any) -> frozenset[int]:
    ids: set[int] = set()
    if hf_tok.eos_token_id is not None:
        ids.add(int(hf_tok.eos_token_id))
    gen = model_dir / "generation_config.json"
    if gen.exists():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, list):
            ids.update(int(e) for e in eos)
    return frozenset(ids)


# Variables ``apply_chat_template`` sets itself; a request's chat_template_kwargs cannot replace them.
_RESERVED_TEMPLATE_VARS = frozenset(
    {
        "messages",
        "conversation",
        "tools",
        "tokenize",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "return_dict",
    }
)


@dataclass(frozen=True)
class TextTokenizer:
    hf: Any  # transformers.PreTrainedTokenizerFast
    fast: Tokenizer  # the Rust tokenizer inside it
    eos_token_ids: frozenset[int]
    vocab_size: int

    def encode(self, text: str, add_special_tokens: bool = True, max_length: int | None = None) -> list[int]:
        """``max_length``: truncate as HF's ``truncation=True, max_length=...`` does with vLLM's
        ``truncation_side="left"`` (what ``vllm.tokenizers.get_tokenizer`` sets for generative
        models): the text's last tokens are kept and the special tokens are added around them,
        within ``max_length``. Done on the encoding, not with ``enable_truncation``, which would
        change the shared tokenizer under the other worker threads."""
        if max_length is None:
            return self.fast.encode(text, add_special_tokens=add_special_tokens).ids
        encoding = self.fast.encode(text, add_special_tokens=False)
        num_special = self.fast.num_special_tokens_to_add(False) if add_special_tokens else 0
        encoding.truncate(max(0, max_length - num_special), direction="left")
        return self.fast.post_process(encoding, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.fast.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        continue_final_message: bool = False,
        add_special_tokens: bool = False,
        max_length: int | None = None,
    ) -> list[int]:
        """Render and tokenize a conversation. The template carries bos itself, so the rendered
        text is encoded without adding special tokens again unless asked (what vLLM does). ``tools``: the
        request's tool definitions (OpenAI ``{"type": "function", "function": {...}}``), the
        template's ``tools`` variable; ``chat_template_kwargs``: extra template variables (e.g.
        ``enable_thinking``), which cannot replace the ones set here. ``continue_final_message``:
        the final turn is left open, as HF renders it."""
        if chat_template is None and not self.hf.chat_template:
            raise InvalidRequestError("messages", "this model has no chat template; use /v1/completions")
        extra = {k: v for k, v in (chat_template_kwargs or {}).items() if k not in _RESERVED_TEMPLATE_VARS}
        try:
            text = self.hf.apply_chat_template(
                list(messages),
                tools=list(tools) if tools else None,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                chat_template=chat_template,
                continue_final_message=continue_final_message,
                **extra,
            )
        except Exception as exc:  # jinja errors on malformed messages
            raise InvalidRequestError("messages", f"chat template failed: {exc}") from None
        return self.encode(text, add_special_tokens=add_special_tokens, max_length=max_length)


@lru_cache(maxsize=8)
def load_tokenizer(model_dir: str | Path) -> TextTokenizer:
    from transformers import AutoTokenizer

    path = Path(model_dir)
    if path.is_absolute() and not path.exists():
        # transformers would take it for a hub repo id and fail with HFValidationError
        raise FileNotFoundError(
            f"model checkpoint folder {path} does not exist on this node ({socket.gethostname()}); "
            "mount it there or fix the model's path in the serve config"
        )
    hf_tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    return TextTokenizer(
        hf=hf_tok,
        fast=hf_tok.backend_tokenizer,
        eos_token_ids=_eos_ids(path, hf_tok),
        vocab_size=len(hf_tok),
    )
