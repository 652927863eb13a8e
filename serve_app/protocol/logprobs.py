"""Engine ``TokenLogprob``s in the two OpenAI shapes: completions (parallel lists) and chat
(a list of token entries). Token strings are each id decoded alone, special tokens kept."""

from __future__ import annotations

from collections.abc import Sequence

from accel.contract import TokenLogprob
from accel.text.tokenizer import TextTokenizer
from serve_app.protocol.chat import ChatCompletionLogProb, ChatCompletionLogProbs, ChatCompletionLogProbsContent
from serve_app.protocol.completions import CompletionLogProbs


def _token(tokenizer: TextTokenizer, token_id: int, as_id: bool = False) -> str:
    """The token's text; ``as_id`` (``return_tokens_as_token_ids``): ``token_id:<id>``, as vLLM
    spells it, so tokens that are not valid UTF-8 on their own stay identifiable."""
    if as_id:
        return f"token_id:{token_id}"
    return tokenizer.decode([token_id], skip_special_tokens=False)


def completion_logprobs(
    tokenizer: TextTokenizer,
    logprobs: Sequence[TokenLogprob],
    num_top: int,
    text_offset_start: int,
    as_ids: bool = False,
) -> CompletionLogProbs:
    """``text_offset`` counts characters from the start of the completion text."""
    out = CompletionLogProbs()
    offset = text_offset_start
    for lp in logprobs:
        token = _token(tokenizer, lp.token_id, as_ids)
        out.tokens.append(token)
        out.token_logprobs.append(lp.logprob)
        out.text_offset.append(offset)
        offset += len(token)
        top = {token: lp.logprob}
        for tid, value in lp.top[:num_top]:
            top.setdefault(_token(tokenizer, tid, as_ids), value)
        out.top_logprobs.append(top if num_top > 0 else None)
    return out


def chat_logprobs(
    tokenizer: TextTokenizer, logprobs: Sequence[TokenLogprob], num_top: int, as_ids: bool = False
) -> ChatCompletionLogProbs:
    content = []
    for lp in logprobs:
        token = _token(tokenizer, lp.token_id, as_ids)
        top = [
            ChatCompletionLogProb(
                token=(t := _token(tokenizer, tid, as_ids)), logprob=max(v, -9999.0), bytes=list(t.encode("utf-8"))
            )
            for tid, v in lp.top[:num_top]
        ]
        content.append(
            ChatCompletionLogProbsContent(
                token=token, logprob=max(lp.logprob, -9999.0), bytes=list(token.encode("utf-8")), top_logprobs=top
            )
        )
    return ChatCompletionLogProbs(content=content)
