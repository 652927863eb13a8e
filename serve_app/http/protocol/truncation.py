"""``truncate_prompt_tokens`` / ``truncation_side`` as vLLM 0.32 applies them
(``vllm/renderers/params.py``, ``TokenizeParams``).

- Without ``truncation_side`` a text prompt (a completions string, a rendered chat) is truncated
  by the tokenizer: HF's ``truncation=True, max_length=keep`` with the side vLLM's
  ``get_tokenizer`` sets for generative models, "left": the text's last tokens are kept and the
  special tokens (a BOS) are added around them, within ``keep``
  (``TextTokenizer.encode(max_length=...)``). A token-id prompt keeps its last ``keep`` ids.
- With ``truncation_side`` the prompt is encoded whole and ``keep`` ids are sliced from that side.
- ``keep`` > max_model_len is a 400; -1 keeps max_model_len - 1 tokens when output tokens are
  asked for (max_model_len when not).
"""

from __future__ import annotations

from dataclasses import dataclass

from serve_app.http.protocol.errors import bad_request

DEFAULT_SIDE = "left"  # vllm.tokenizers.registry.get_tokenizer, runner_type "generate"


@dataclass(frozen=True)
class Truncation:
    keep: int  # ids to keep (>= 0)
    side: str | None  # the request's truncation_side; None: vLLM's tokenizer-level default

    @property
    def encode_max_length(self) -> int | None:
        """The ``max_length`` a text prompt is encoded with (None: encoded whole, then sliced)."""
        return self.keep if self.side is None else None

    def apply(self, ids: tuple[int, ...]) -> tuple[int, ...]:
        if self.keep >= len(ids):
            return ids
        kept = ids[len(ids) - self.keep :] if (self.side or DEFAULT_SIDE) == "left" else ids[: self.keep]
        if not kept:
            raise bad_request("truncate_prompt_tokens=0 leaves an empty prompt", "truncate_prompt_tokens")
        return kept


def truncation(keep: int | None, side: str | None, max_tokens: int | None, max_model_len: int) -> Truncation | None:
    if keep is None:
        return None
    if keep > max_model_len:
        raise bad_request(
            f"truncate_prompt_tokens={keep} cannot be greater than max_model_len = {max_model_len}. "
            "Please request a smaller truncation size.",
            "truncate_prompt_tokens",
        )
    if keep < 0:
        keep = max(0, max_model_len - 1) if max_tokens else max_model_len
    return Truncation(keep, None if side is None else str(side))
