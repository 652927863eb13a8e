"""``/v1/embeddings``'s protocol: the parse (refusals by name), the prompts (held against vLLM's
tokenizer for a pooling model), and the vectors' encodings (held against vLLM's own encoder)."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from accel.contract import EmbeddingResult
from serve_app.http.protocol.embeddings import (
    embedding_prompts,
    embedding_response,
    encode_embedding,
    parse_embedding_request,
)
from serve_app.http.protocol.errors import APIError

VALUES = (0.1, -2.5, 3.0e-7, 1234.5)


def _refused(body) -> str | None:
    with pytest.raises(APIError) as err:
        parse_embedding_request(body)
    assert err.value.status == 400
    return err.value.param


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"input": "x", "messages": [{"role": "user", "content": "x"}]}, "messages"),
        ({"input": [{"role": "user", "content": "x"}]}, "input"),
        ({"input": "x", "encoding_format": "bytes"}, "encoding_format"),
        ({"input": "x", "encoding_format": "utf8"}, "encoding_format"),
        ({"input": "x", "embed_dtype": "bfloat16"}, "embed_dtype"),
        ({"input": "x", "normalize": True}, "normalize"),
        ({"input": "x", "padding": "max_length"}, "padding"),
        ({"input": "x", "priority": 1}, "priority"),
        ({"input": "x", "truncate_prompt_tokens": -2}, "truncate_prompt_tokens"),
        ({"input": 3}, "input"),
        ({}, "input"),
    ],
)
def test_refusals_name_the_field(body, field):
    assert _refused(body) == field


def test_inputs_as_vllm_tokenizes_them(tok, tiny_llama):
    from vllm.tokenizers import get_tokenizer

    vllm_tok = get_tokenizer(str(tiny_llama), runner_type="pooling")
    texts = ["hello world", "def main():\n    return 0"]
    prompts = embedding_prompts(parse_embedding_request({"input": texts}), tok, 512)
    assert prompts == [tuple(vllm_tok.encode(t)) for t in texts]
    assert embedding_prompts(parse_embedding_request({"input": texts[0]}), tok, 512) == prompts[:1]
    assert embedding_prompts(parse_embedding_request({"input": [5, 6, 7]}), tok, 512) == [(5, 6, 7)]
    assert embedding_prompts(parse_embedding_request({"input": [[5, 6], [7]]}), tok, 512) == [(5, 6), (7,)]
    no_bos = embedding_prompts(parse_embedding_request({"input": texts[0], "add_special_tokens": False}), tok, 512)
    assert no_bos == [tuple(vllm_tok.encode(texts[0], add_special_tokens=False))]


def test_truncation_keeps_the_first_tokens_by_default(tok):
    ids = list(range(10, 30))
    req = parse_embedding_request({"input": ids, "truncate_prompt_tokens": 5})
    assert embedding_prompts(req, tok, 512) == [tuple(ids[:5])]  # a pooling model's side: right
    req = parse_embedding_request({"input": ids, "truncate_prompt_tokens": 5, "truncation_side": "left"})
    assert embedding_prompts(req, tok, 512) == [tuple(ids[-5:])]
    req = parse_embedding_request({"input": ids, "truncate_prompt_tokens": -1})
    assert embedding_prompts(req, tok, 8) == [tuple(ids[:8])]


def test_too_long_or_empty_inputs_are_400(tok):
    with pytest.raises(APIError) as err:
        embedding_prompts(parse_embedding_request({"input": list(range(1, 10))}), tok, 8)
    assert err.value.param == "input" and "maximum context length is 8" in err.value.message
    with pytest.raises(APIError) as err:
        embedding_prompts(parse_embedding_request({"input": []}), tok, 8)
    assert err.value.param == "input"


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("endianness", ["native", "little", "big"])
def test_base64_equals_vllms_encoder(dtype, endianness):
    import torch
    from vllm.utils.serial_utils import tensor2binary

    req = parse_embedding_request(
        {"input": "x", "encoding_format": "base64", "embed_dtype": dtype, "endianness": endianness}
    )
    expected = base64.b64encode(tensor2binary(torch.tensor(VALUES, dtype=torch.float32), dtype, endianness)).decode()
    assert encode_embedding(VALUES, req) == expected


def test_float32_base64_is_what_the_openai_client_decodes():
    req = parse_embedding_request({"input": "x", "encoding_format": "base64"})
    decoded = np.frombuffer(base64.b64decode(encode_embedding(VALUES, req)), dtype="float32")
    assert decoded.tolist() == np.asarray(VALUES, dtype=np.float32).tolist()


def test_response_body_and_usage():
    req = parse_embedding_request({"input": ["a", "b"]})
    results = [EmbeddingResult("r-0", VALUES, 3), EmbeddingResult("r-1", VALUES[:2], 4)]
    body = embedding_response("embd-1", 7, "m", results, req).model_dump()
    assert body["object"] == "list" and body["model"] == "m" and body["id"] == "embd-1"
    assert [(d["index"], d["object"], d["embedding"]) for d in body["data"]] == [
        (0, "embedding", list(VALUES)),
        (1, "embedding", list(VALUES[:2])),
    ]
    assert body["usage"] == {
        "prompt_tokens": 7,
        "total_tokens": 7,
        "completion_tokens": 0,
        "prompt_tokens_details": None,
    }


def test_every_field_of_vllms_request_is_honoured_or_refused():
    from vllm.entrypoints.pooling.embed.protocol import EmbeddingChatRequest, EmbeddingCompletionRequest

    from serve_app.http.protocol.embeddings import REFUSED_FIELDS, EmbeddingRequest

    ours = set(EmbeddingRequest.model_fields) | set(REFUSED_FIELDS)
    assert set(EmbeddingCompletionRequest.model_fields) <= ours
    assert "messages" in REFUSED_FIELDS and set(EmbeddingChatRequest.model_fields) - ours <= {
        "add_generation_prompt",
        "continue_final_message",
        "chat_template_kwargs",
        "media_io_kwargs",
    }  # (the chat form's options: it is refused as a whole, by `messages`)
