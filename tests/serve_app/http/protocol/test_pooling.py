"""vLLM's ``/pooling`` for an embedding model: the embeddings request plus ``task`` (only
``embed``), the vectors in vLLM's pooling shape."""

from __future__ import annotations

import pytest

from accel.contract import EmbeddingResult
from serve_app.http.protocol.embeddings import REFUSED_FIELDS
from serve_app.http.protocol.errors import APIError
from serve_app.http.protocol.pooling import PoolingRequest, parse_pooling_request, pooling_response


def test_only_the_embed_task():
    assert parse_pooling_request({"input": "x", "task": "embed"}).input == "x"
    assert parse_pooling_request({"input": "x"}).input == "x"
    for task in ("token_embed", "classify", "plugin"):
        with pytest.raises(APIError) as err:
            parse_pooling_request({"input": "x", "task": task})
        assert (err.value.status, err.value.param) == (400, "task")


def test_every_field_of_vllms_request_is_honoured_or_refused():
    from vllm.entrypoints.pooling.pooling.protocol import PoolingCompletionRequest

    assert set(PoolingCompletionRequest.model_fields) <= set(PoolingRequest.model_fields) | set(REFUSED_FIELDS)


def test_response_shape():
    req = parse_pooling_request({"input": ["a", "b"], "encoding_format": "float"})
    body = pooling_response("pooling-1", 3, "m", [EmbeddingResult("a", (0.5, 1.0), 2)] * 2, req).model_dump()
    assert [(d["index"], d["object"], d["data"]) for d in body["data"]] == [(i, "pooling", [0.5, 1.0]) for i in (0, 1)]
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] == 4 and body["object"] == "list"
