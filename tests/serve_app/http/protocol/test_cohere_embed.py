"""Cohere's ``/v2/embed`` protocol: the parse (vLLM's own request model; refusals by name), the
prompts (held against vLLM's tokenizer and chat template, and vLLM's truncation rules), task
instructions by ``input_type``, and the body (vLLM's ``build_typed_embeddings``)."""

from __future__ import annotations

import shutil

import pytest

from accel.contract import EmbeddingResult
from accel.text.tokenizer import load_tokenizer
from serve_app.http.protocol.cohere_embed import parse_cohere_request, task_instructions
from serve_app.http.protocol.errors import APIError


def _refused(body) -> str | None:
    with pytest.raises(APIError) as err:
        parse_cohere_request(body)
    assert err.value.status == 400
    return err.value.param


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"images": ["data:image/png;base64,AAAA"]}, "images"),
        ({"inputs": [{"content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}, "inputs"),
        ({}, "texts"),
        ({"texts": []}, "texts"),
        ({"texts": ["a"], "inputs": [{"content": [{"type": "text", "text": "b"}]}]}, "texts"),
        ({"texts": ["a"], "embedding_types": ["int8"]}, "embedding_types"),
        ({"texts": ["a"], "truncate": "MIDDLE"}, "truncate"),
        ({"texts": ["a"], "priority": 2}, "priority"),
    ],
)
def test_refusals_name_the_field(body, field):
    assert _refused(body) == field


def test_texts_are_tokenized_and_truncated_as_vllm(tok, vllm_tok):
    texts = ["hello world", "The quick brown fox jumps over the lazy dog."]
    full = [tuple(vllm_tok.encode(t)) for t in texts]
    assert parse_cohere_request({"texts": texts}).prompts(tok, 512) == full
    assert parse_cohere_request({"texts": texts}).prompts(tok, 6) == [p[:6] for p in full]  # END, -1: max_model_len
    assert parse_cohere_request({"texts": texts, "max_tokens": 3}).prompts(tok, 512) == [p[:3] for p in full]
    start = parse_cohere_request({"texts": texts, "max_tokens": 3, "truncate": "START"})
    assert start.prompts(tok, 512) == [p[-3:] for p in full]
    assert parse_cohere_request({"texts": texts, "truncate": "NONE"}).prompts(tok, 512) == full
    with pytest.raises(APIError) as err:
        parse_cohere_request({"texts": texts, "truncate": "NONE", "max_tokens": 3}).prompts(tok, 512)
    assert err.value.param == "max_tokens" and "exceeds max_tokens=3 with truncate=NONE" in err.value.message
    with pytest.raises(APIError) as err:
        parse_cohere_request({"texts": texts, "truncate": "NONE"}).prompts(tok, 6)
    assert err.value.param == "texts"


def test_inputs_are_rendered_as_one_user_message(tok, vllm_tok):
    body = {"inputs": [{"content": [{"type": "text", "text": "hello"}, {"type": "text", "text": "world"}]}]}
    text = vllm_tok.apply_chat_template(
        [{"role": "user", "content": "hello\nworld"}], tokenize=False, add_generation_prompt=False
    )
    assert parse_cohere_request(body).prompts(tok, 512) == [tuple(vllm_tok.encode(text, add_special_tokens=False))]


def test_input_type_needs_the_models_task_instructions(tok, tiny_llama, tmp_path):
    assert task_instructions(str(tiny_llama)) is None
    with pytest.raises(APIError) as err:
        parse_cohere_request({"texts": ["a"], "input_type": "query"}).prompts(tok, 512)
    assert err.value.param == "input_type" and "does not define any input_type" in err.value.message
    model = tmp_path / "with-prompts"
    shutil.copytree(tiny_llama, model)
    (model / "config_sentence_transformers.json").write_text('{"prompts": {"query": "Query: ", "document": ""}}')
    with_template = load_tokenizer(str(model))
    assert task_instructions(str(model)) == {"query": "Query: ", "document": ""}
    with pytest.raises(APIError) as err:
        parse_cohere_request({"texts": ["a"], "input_type": "code"}).prompts(with_template, 512)
    assert err.value.param == "input_type" and "Supported values: document, query" in err.value.message
    # A model with a chat template: the instruction is the system message (vLLM's _batch_render_chat).
    messages = [{"role": "system", "content": "Query: "}, {"role": "user", "content": "a"}]
    text = with_template.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    got = parse_cohere_request({"texts": ["a"], "input_type": "query"}).prompts(with_template, 512)
    assert got == [tuple(with_template.encode(text, add_special_tokens=False))]
    # An empty instruction is none: the text as it is.
    document = parse_cohere_request({"texts": ["a"], "input_type": "document"}).prompts(with_template, 512)
    assert document == [tuple(with_template.encode("a"))]


def test_without_a_chat_template_the_instruction_prefixes_the_text(tiny_llama, tmp_path):
    model = tmp_path / "no-template"
    shutil.copytree(tiny_llama, model)
    (model / "chat_template.jinja").unlink()
    (model / "config.json").write_text(
        (model / "config.json").read_text().replace("{", '{"task_instructions": {"query": "Q: "},', 1)
    )
    plain = load_tokenizer(str(model))
    assert not plain.hf.chat_template
    got = parse_cohere_request({"texts": ["a", "b"], "input_type": "query"}).prompts(plain, 512)
    assert got == [tuple(plain.encode("Q: a")), tuple(plain.encode("Q: b"))]


def test_the_body_is_vllms():
    from vllm.entrypoints.pooling.embed.protocol import build_typed_embeddings

    vectors = [tuple(float(i % 7 - 3) / 4 for i in range(16)), tuple(float(i % 5 - 2) for i in range(16))]
    results = [EmbeddingResult(f"r-{i}", v, 3 + i) for i, v in enumerate(vectors)]
    types = ["float", "binary", "ubinary", "base64"]
    call = parse_cohere_request({"texts": ["a", "b"], "embedding_types": types, "output_dimension": 16})
    assert call.dimensions == 16 and call.request_id is None and call.use_activation is None
    body = call.render("embd-x", 1, "m", results)
    expected = build_typed_embeddings([list(v) for v in vectors], types).model_dump(exclude_none=True)
    assert body == {
        "id": "embd-x",
        "embeddings": expected,
        "texts": ["a", "b"],
        "meta": {"api_version": {"version": "2"}, "billed_units": {"input_tokens": 7, "image_tokens": 0}},
        "response_type": "embeddings_by_type",
    }
    default = parse_cohere_request({"inputs": [{"content": [{"type": "text", "text": "a"}]}]})
    assert set(default.render("embd-y", 1, "m", results[:1])["embeddings"]) == {"float"}
    assert "texts" not in default.render("embd-y", 1, "m", results[:1])
    odd = [EmbeddingResult("r", (1.0, -1.0, 0.5), 1)]
    with pytest.raises(APIError) as err:
        parse_cohere_request({"texts": ["a"], "embedding_types": ["binary"]}).render("embd-z", 1, "m", odd)
    assert err.value.param == "embedding_types"
