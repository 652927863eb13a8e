"""Engine ``TokenLogprob``s in the two OpenAI shapes, as vLLM 0.32's server writes them.

Token strings are vLLM's (``vllm/v1/engine/logprobs.py``, ``LogprobsProcessor``): each id of a
position (the sampled one first, then its top alternatives) decoded alone
(``convert_ids_list_to_tokens``: SentencePiece leading spaces restored), and a string ending in
U+FFFD -- a byte of a character split over several tokens -- decoded again behind up to four of
the sampled tokens before it: the token that completes the character gets its text, one that
does not gets "". Each position's entries are vLLM's dict ``{sampled, top 1, top 2, ...}`` (ids
deduplicated, the sampled one first): completions show its first k + 1 entries (``logprobs: 0``
is the sampled token alone), chat its first k; logprobs are clamped at -9999.0."""

from __future__ import annotations

from collections.abc import Sequence

from accel.contract import TokenLogprob
from accel.text.tokenizer import TextTokenizer
from serve_app.http.protocol.chat import ChatCompletionLogProb, ChatCompletionLogProbs, ChatCompletionLogProbsContent
from serve_app.http.protocol.completions import CompletionLogProbs

_CONTEXT = 4  # sampled tokens vLLM decodes a split character behind (``_get_sampled_context_ids``)
_MIN_LOGPROB = -9999.0  # what OpenAI writes for -inf


class _TokenTexts:
    """vLLM's token strings for logprob positions (its own functions, imported on first use:
    only requests with logprobs need them)."""

    def __init__(self, tokenizer: TextTokenizer):
        from vllm.tokenizers.detokenizer_utils import convert_ids_list_to_tokens
        from vllm.v1.engine.logprobs import LogprobsProcessor

        self._hf = tokenizer.hf
        self._convert = convert_ids_list_to_tokens
        self._verifier = LogprobsProcessor(tokenizer.hf, None, None, None, None, None)

    def entries(self, lp: TokenLogprob, context: Sequence[int]) -> list[tuple[int, str, float]]:
        """(token id, its text, logprob) of one position: the sampled token, then the top ones."""
        values = {lp.token_id: lp.logprob}  # vLLM's dict: the sampled id keeps the first place
        values.update((tid, v) for tid, v in lp.top if tid != lp.token_id)
        ids = list(values)
        texts = self._verifier._verify_tokens(
            self._convert(self._hf, ids), ids, context_token_ids=list(context[-_CONTEXT:])
        )
        return [(tid, text, values[tid]) for tid, text in zip(ids, texts)]


def _shown(token_id: int, text: str, as_id: bool) -> str:
    """``return_tokens_as_token_ids``: ``token_id:<id>``, as vLLM spells it."""
    return f"token_id:{token_id}" if as_id else text


def completion_logprobs(
    tokenizer: TextTokenizer,
    logprobs: Sequence[TokenLogprob],
    num_top: int,
    text_offset_start: int,
    as_ids: bool = False,
    context: Sequence[int] = (),
) -> CompletionLogProbs:
    """``text_offset`` counts characters from the start of the completion text; ``context``: the
    choice's sampled token ids before these."""
    out = CompletionLogProbs()
    offset = text_offset_start
    sampled, texts = list(context), _TokenTexts(tokenizer)
    for lp in logprobs:
        entries = texts.entries(lp, sampled)
        token = _shown(lp.token_id, entries[0][1], as_ids)
        out.tokens.append(token)
        out.token_logprobs.append(max(lp.logprob, _MIN_LOGPROB))
        out.text_offset.append(offset)
        offset += len(token)
        out.top_logprobs.append(
            {_shown(tid, text, as_ids): max(v, _MIN_LOGPROB) for tid, text, v in entries[: num_top + 1]}
        )
        sampled.append(lp.token_id)
    return out


def chat_logprobs(
    tokenizer: TextTokenizer,
    logprobs: Sequence[TokenLogprob],
    num_top: int,
    as_ids: bool = False,
    context: Sequence[int] = (),
) -> ChatCompletionLogProbs:
    content = []
    sampled, texts = list(context), _TokenTexts(tokenizer)
    for lp in logprobs:
        entries = texts.entries(lp, sampled)
        top = [
            ChatCompletionLogProb(
                token=(t := _shown(tid, text, as_ids)),
                logprob=max(v, _MIN_LOGPROB),
                bytes=list(t.encode("utf-8", errors="replace")),
            )
            for tid, text, v in entries[:num_top]
        ]
        decoded = entries[0][1]
        content.append(
            ChatCompletionLogProbsContent(
                token=_shown(lp.token_id, decoded, as_ids),
                logprob=max(lp.logprob, _MIN_LOGPROB),
                bytes=list(decoded.encode("utf-8", errors="replace")),
                top_logprobs=top,
            )
        )
        sampled.append(lp.token_id)
    return ChatCompletionLogProbs(content=content)
