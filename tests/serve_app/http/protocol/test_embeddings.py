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
        ({"messages": [{"content": "x"}]}, "messages"),
        (
            {
                "messages": [{"role": "user", "content": "x"}],
                "add_generation_prompt": True,
                "continue_final_message": True,
            },
            "messages",
        ),
        ({"input": [{"content": "x"}]}, "input"),
        ({"messages": [{"role": "user", "content": "x"}], "media_io_kwargs": {}}, "media_io_kwargs"),
        ({"input": "x", "encoding_format": "utf8"}, "encoding_format"),
        ({"input": "x", "embed_dtype": "float64"}, "embed_dtype"),
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


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"])
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
        "completion_tokens_details": None,
    }


def test_every_field_of_vllms_request_is_honoured_or_refused():
    from vllm.entrypoints.pooling.embed.protocol import EmbeddingChatRequest, EmbeddingCompletionRequest

    from serve_app.http.protocol.embeddings import REFUSED_FIELDS, EmbeddingRequest
    from serve_app.http.protocol.embeddings import EmbeddingChatRequest as OurChat

    ours = set(EmbeddingRequest.model_fields) | set(REFUSED_FIELDS) | {"normalize"}
    assert set(EmbeddingCompletionRequest.model_fields) <= ours
    # (the conversation is ours as `conversations`: one or a batch, from `messages` or `input`)
    assert set(EmbeddingChatRequest.model_fields) - set(OurChat.model_fields) - set(REFUSED_FIELDS) == {"messages"}


CONVERSATION = [
    {"role": "system", "content": "You embed."},
    {"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "text", "text": "world"}]},
]


def _template_ids(vllm_tok, conversation, **kwargs) -> tuple[int, ...]:
    """What vLLM's HF renderer makes of a pooling chat request: the template with vLLM's
    defaults for it (no generation prompt), encoded without adding special tokens."""
    messages = [
        {**m, "content": "\n".join(p["text"] for p in m["content"])} if isinstance(m["content"], list) else m
        for m in conversation
    ]
    text = vllm_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=False, **kwargs)
    return tuple(vllm_tok.encode(text, add_special_tokens=False))


@pytest.mark.parametrize(
    "body",
    [
        {"messages": CONVERSATION},
        {"input": CONVERSATION, "messages": CONVERSATION},
        {"input": CONVERSATION},
    ],
)
def test_the_chat_form_renders_the_template_as_vllm(body, tok, vllm_tok):
    from serve_app.http.protocol.embeddings import EmbeddingChatRequest

    req = parse_embedding_request(body)
    assert isinstance(req, EmbeddingChatRequest) and not req.add_special_tokens
    assert req.prompts(tok, 512) == [_template_ids(vllm_tok, CONVERSATION)]


def test_a_batch_of_conversations_is_one_prompt_each(tok, vllm_tok):
    second = [{"role": "user", "content": "x"}]
    for field in ("messages", "input"):
        req = parse_embedding_request({field: [CONVERSATION, second]})
        assert req.prompts(tok, 512) == [_template_ids(vllm_tok, CONVERSATION), _template_ids(vllm_tok, second)]


def test_chat_options_reach_the_template(tok, vllm_tok):
    req = parse_embedding_request({"messages": CONVERSATION, "add_generation_prompt": True})
    expected = vllm_tok.apply_chat_template(
        CONVERSATION[:1] + [{"role": "user", "content": "hello\nworld"}], tokenize=False, add_generation_prompt=True
    )
    assert req.prompts(tok, 512) == [tuple(vllm_tok.encode(expected, add_special_tokens=False))]
    cut = parse_embedding_request({"messages": CONVERSATION, "truncate_prompt_tokens": 4})
    assert cut.prompts(tok, 512) == [_template_ids(vllm_tok, CONVERSATION)[:4]]
    with pytest.raises(APIError) as err:
        parse_embedding_request({"messages": CONVERSATION}).prompts(tok, 4)
    assert err.value.param == "messages" and "maximum context length is 4" in err.value.message


def test_bytes_bodies_are_vllms():
    """``bytes``: the vectors back to back and vLLM's metadata header; ``bytes_only``: no header.
    Decoded with vLLM's own ``decode_pooling_output``."""
    import json

    import torch
    from vllm.entrypoints.pooling.utils import MetadataItem, decode_pooling_output

    from serve_app.http.protocol.pooling_encoding import BinaryBody

    results = [EmbeddingResult("r-0", VALUES, 3), EmbeddingResult("r-1", VALUES[::-1], 4)]
    for dtype, endianness in [("float32", "native"), ("float16", "big"), ("bfloat16", "little")]:
        req = parse_embedding_request(
            {"input": ["a", "b"], "encoding_format": "bytes", "embed_dtype": dtype, "endianness": endianness}
        )
        body = embedding_response("embd-1", 7, "m", results, req)
        assert isinstance(body, BinaryBody) and body.media_type == "application/octet-stream"
        meta = json.loads(body.headers["metadata"])
        assert {k: meta[k] for k in ("id", "created", "model", "usage")} == {
            "id": "embd-1",
            "created": 7,
            "model": "m",
            "usage": {"prompt_tokens": 7, "total_tokens": 7},
        }
        items = [MetadataItem(**{**d, "shape": tuple(d["shape"])}) for d in meta["data"]]
        decoded = decode_pooling_output(items, body.content)
        for tensor, result in zip(decoded, results, strict=True):
            expected = torch.tensor(result.embedding, dtype=torch.float32).to(tensor.dtype)
            assert torch.equal(tensor, expected)
    req = parse_embedding_request({"input": "a", "encoding_format": "bytes_only"})
    only = embedding_response("embd-1", 7, "m", results[:1], req)
    assert only.headers is None and only.content == np.asarray(VALUES, dtype=np.float32).tobytes()


def test_usage_has_vllms_fields():
    """The usage body carries every field vLLM's ``UsageInfo`` has (a client comparing bodies sees
    the same keys: ``completion_tokens_details`` null as there)."""
    from vllm.entrypoints.serve.engine.protocol import UsageInfo as VllmUsageInfo

    from serve_app.http.protocol.common import UsageInfo

    assert UsageInfo().model_dump() == VllmUsageInfo().model_dump()
