"""``bad_words`` -> the token sequences a sampler bans, built as vLLM 0.32 builds them
(``SamplingParams.update_from_tokenizer``).

Each word is encoded twice, as is (leading whitespace stripped) and with one leading space (the
form it takes inside text); the spaced form is kept only when it is a different word token of the
same length. A word that encodes to nothing is refused, as are more than ``MAX_NUM_BAD_WORDS``
sequences (vLLM's ``VLLM_MAX_NUM_BAD_WORDS`` default).
"""

from __future__ import annotations

from collections.abc import Sequence

from accel.contract import InvalidRequestError
from accel.text.tokenizer import TextTokenizer

MAX_NUM_BAD_WORDS = 128


def bad_words_token_ids(words: Sequence[str], tokenizer: TextTokenizer) -> tuple[tuple[int, ...], ...]:
    out: list[tuple[int, ...]] = []
    for word in dict.fromkeys(words):  # vLLM de-duplicates, keeping order
        if not word:
            raise InvalidRequestError("bad_words", "bad_words cannot contain an empty string")
        for add_prefix_space in (False, True):
            ids = tuple(tokenizer.encode((" " if add_prefix_space else "") + word.lstrip(), add_special_tokens=False))
            if not ids:
                if not add_prefix_space:
                    raise InvalidRequestError("bad_words", "bad_words entries must tokenize to at least one token.")
                continue
            if not add_prefix_space or (ids[0] != out[-1][0] and len(ids) == len(out[-1])):
                out.append(ids)
                if len(out) > MAX_NUM_BAD_WORDS:
                    raise InvalidRequestError(
                        "bad_words",
                        f"Too many bad words after tokenization: {len(out)}. The max number is {MAX_NUM_BAD_WORDS}.",
                    )
    invalid = [t for seq in out for t in seq if t >= tokenizer.vocab_size]
    if invalid:
        raise InvalidRequestError("bad_words", f"bad_words tokenize to out-of-vocabulary ids {invalid}")
    return tuple(out)
