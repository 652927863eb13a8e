"""``/score`` and ``/rerank`` for an embedding model: the body forms, the pairing (1:1, 1:N, N:N),
cosine similarity as torch computes it, vLLM's response shapes and usage, refusals by name."""

from __future__ import annotations

import numpy as np
import pytest

from accel.contract import EmbeddingResult
from serve_app.http.protocol.errors import APIError
from serve_app.http.protocol.scoring import (
    REFUSED_FIELDS,
    RerankRequest,
    ScoreRequest,
    parse_rerank_request,
    parse_score_request,
)

RNG = np.random.default_rng(0)
VECTORS = [tuple(float(v) for v in RNG.standard_normal(16).astype(np.float32)) for _ in range(4)]


def _results(n):
    return [EmbeddingResult(f"r{i}", VECTORS[i], i + 2) for i in range(n)]


def _torch_cosine(a, b):
    import torch

    return float(torch.nn.functional.cosine_similarity(torch.tensor(a), torch.tensor(b), dim=0))


@pytest.mark.parametrize(
    "pair", [("queries", "documents"), ("queries", "items"), ("data_1", "data_2"), ("text_1", "text_2")]
)
def test_score_forms_and_one_to_n(pair):
    req = parse_score_request({pair[0]: "q", pair[1]: ["a", "b", "c"]})
    assert (req.texts_1, req.texts_2) == (["q"], ["a", "b", "c"])
    body = req.render("score-1", 5, "m", _results(4)).model_dump()
    expected = [_torch_cosine(VECTORS[0], VECTORS[i]) for i in (1, 2, 3)]
    assert [d["index"] for d in body["data"]] == [0, 1, 2] and {d["object"] for d in body["data"]} == {"score"}
    np.testing.assert_allclose([d["score"] for d in body["data"]], expected, rtol=0, atol=1e-6)
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] == 2 + 3 + 4 + 5


def test_n_to_n_pairs():
    req = parse_score_request({"queries": ["q1", "q2"], "documents": ["a", "b"]})
    scores = req.pair_scores(_results(4))
    np.testing.assert_allclose(
        scores, [_torch_cosine(VECTORS[0], VECTORS[2]), _torch_cosine(VECTORS[1], VECTORS[3])], atol=1e-6
    )


def test_rerank_sorts_and_cuts_to_top_n():
    req = parse_rerank_request({"query": "q", "documents": ["a", "b", "c"], "top_n": 2})
    body = req.render("score-1", 5, "m", _results(4)).model_dump()
    scores = {i: _torch_cosine(VECTORS[0], VECTORS[i + 1]) for i in range(3)}
    best = sorted(scores, key=scores.get, reverse=True)[:2]
    assert [r["index"] for r in body["results"]] == best
    assert [r["document"] for r in body["results"]] == [{"text": "abc"[i], "multi_modal": None} for i in best]
    assert body["usage"] == {"prompt_tokens": 14, "total_tokens": 14} and "created" not in body


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"queries": ["a", "b"], "documents": ["x", "y", "z"]}, "queries"),
        ({"queries": [], "documents": ["x"]}, "queries"),
        ({"queries": "a", "documents": [{"content": [{"type": "image_url"}]}]}, "documents"),
        ({"queries": "a", "documents": "x", "max_tokens_per_doc": 3}, "max_tokens_per_doc"),
        ({"queries": "a", "documents": "x", "instruction": "rank"}, "instruction"),
        ({"queries": "a", "documents": "x", "priority": 2}, "priority"),
        ({"documents": "x"}, "queries"),
    ],
)
def test_score_refusals_name_the_field(body, field):
    with pytest.raises(APIError) as err:
        parse_score_request(body)
    assert (err.value.status, err.value.param) == (400, field)


def test_rerank_refusals():
    for body, field in [({"documents": ["x"]}, "query"), ({"query": ["a", "b"], "documents": ["x"]}, "query")]:
        with pytest.raises(APIError) as err:
            parse_rerank_request(body)
        assert err.value.param == field


def test_every_field_of_vllms_requests_is_honoured_or_refused():
    from vllm.entrypoints.pooling.scoring import protocol

    sides = {
        name for pair in (("queries", "documents", "items"), ("data_1", "data_2", "text_1", "text_2")) for name in pair
    }
    ours = (
        set(ScoreRequest.model_fields)
        | set(REFUSED_FIELDS)
        | {"max_tokens_per_query", "max_tokens_per_doc", "priority"}
    )
    for cls in (
        protocol.ScoreQueriesDocumentsRequest,
        protocol.ScoreQueriesItemsRequest,
        protocol.ScoreDataRequest,
        protocol.ScoreTextRequest,
    ):
        assert set(cls.model_fields) - sides <= ours
    assert set(protocol.RerankRequest.model_fields) - {"query", "documents"} <= ours | set(RerankRequest.model_fields)
