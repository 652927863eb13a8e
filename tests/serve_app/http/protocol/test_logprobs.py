"""Logprobs JSON against vLLM 0.32's own server code: ``OpenAIServingCompletion.
_create_completion_logprobs`` and ``OpenAIServingChat._create_chat_logprobs`` (called on a
stand-in ``self`` that has only what they read), fed the per-position dicts vLLM's
``LogprobsProcessor`` builds from the same sampled and top token ids, with vLLM's tokenizer of
the same checkpoint. Positions include tokens that are single bytes of a multi-byte character
(their text is "" until the character completes), a sampled token outside the top k, a sampled
token inside it (deduplicated), and -inf."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from vllm.entrypoints.generate.base.serving import GenerateBaseServing
from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion
from vllm.v1.engine.logprobs import LogprobsProcessor

from accel.contract import TokenLogprob
from serve_app.http.protocol.logprobs import chat_logprobs, completion_logprobs

K = 3


def _positions(tok) -> list[TokenLogprob]:
    split = tok.encode("ОЖ😀", add_special_tokens=False)  # characters of 2 and 4 UTF-8 bytes
    assert len(split) > 3
    positions = []
    for i, tid in enumerate([*split, 318, 44]):
        logprob = float("-inf") if i == 2 else -1.25 - i
        top = [(t, -0.5 - j) for j, t in enumerate((tid + 1 + i, 100, 45)[:K])]
        if i == len(split) + 1:
            logprob, top[1] = -0.7, (tid, -0.7)  # the sampled token among the top ones
        positions.append(TokenLogprob(tid, logprob, tuple(top)))
    return positions


def _vllm_dicts(vllm_tok, positions: list[TokenLogprob]):
    processor = LogprobsProcessor(vllm_tok, [], None, 0.0, K, None)
    rows = [np.array([p.token_id, *(t for t, _ in p.top)]) for p in positions]
    values = [np.array([p.logprob, *(v for _, v in p.top)]) for p in positions]
    ranks = [np.array(5) for _ in positions]
    processor._update_sample_logprobs((rows, values, ranks, None))
    return processor.logprobs


def _fake_self(as_ids: bool):
    fake = SimpleNamespace(return_tokens_as_token_ids=as_ids, _get_decoded_token=GenerateBaseServing._get_decoded_token)
    fake._get_top_logprobs = lambda *a, **kw: OpenAIServingChat._get_top_logprobs(fake, *a, **kw)
    return fake


@pytest.mark.parametrize("num_top", [0, 1, K])
@pytest.mark.parametrize("as_ids", [False, True])
def test_completions_logprobs_as_vllm(tok, vllm_tok, num_top, as_ids):
    positions = _positions(tok)
    ids = [p.token_id for p in positions]
    theirs = OpenAIServingCompletion._create_completion_logprobs(
        _fake_self(as_ids), ids, _vllm_dicts(vllm_tok, positions), num_top, vllm_tok, initial_text_offset=7
    )
    ours = completion_logprobs(tok, positions, num_top, 7, as_ids)
    assert ours.model_dump() == theirs.model_dump()
    # streamed in two pieces, the second with the first's sampled tokens as context
    first = completion_logprobs(tok, positions[:2], num_top, 7, as_ids)
    rest = completion_logprobs(tok, positions[2:], num_top, 7 + sum(map(len, first.tokens)), as_ids, ids[:2])
    assert first.tokens + rest.tokens == theirs.tokens and first.top_logprobs + rest.top_logprobs == theirs.top_logprobs
    assert first.text_offset + rest.text_offset == theirs.text_offset


@pytest.mark.parametrize("num_top", [0, 1, K])
@pytest.mark.parametrize("as_ids", [False, True])
def test_chat_logprobs_as_vllm(tok, vllm_tok, num_top, as_ids):
    positions = _positions(tok)
    ids = [p.token_id for p in positions]
    theirs = OpenAIServingChat._create_chat_logprobs(
        _fake_self(as_ids), ids, _vllm_dicts(vllm_tok, positions), vllm_tok, num_top
    )
    ours = chat_logprobs(tok, positions, num_top, as_ids)
    assert ours.model_dump() == theirs.model_dump()
    rest = chat_logprobs(tok, positions[3:], num_top, as_ids, ids[:3])
    assert rest.model_dump()["content"] == theirs.model_dump()["content"][3:]


def test_a_split_characters_bytes_read_empty_until_it_completes(tok):
    positions = _positions(tok)
    tokens = completion_logprobs(tok, positions, 0, 0).tokens
    assert "".join(tokens).startswith("ОЖ😀") and "\ufffd" not in "".join(tokens) and "" in tokens
