"""Specs -> xgrammar: the edge's check (400 naming the field) and the engine's compiler, held
against vLLM 0.32's xgrammar backend helpers."""

from __future__ import annotations

import json

import pytest
import xgrammar as xgr

from accel.contract import InvalidRequestError, SamplingParams, StructuredOutputKind, StructuredOutputSpec
from accel.structured.grammar import GrammarCompiler, check_spec, choice_as_grammar, grammar_is_likely_lark
from accel.text.tokenizer import load_tokenizer

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name"],
}


def test_spec_holds_exactly_one_constraint():
    assert StructuredOutputSpec(regex="a+").kind is StructuredOutputKind.REGEX
    spec = StructuredOutputSpec(json=SCHEMA)
    assert spec.kind is StructuredOutputKind.JSON and json.loads(spec.json) == SCHEMA
    assert list(json.loads(spec.json)["properties"]) == ["name", "age"]  # key order kept
    assert StructuredOutputSpec(choice=["a", "b"]).choice == ("a", "b")
    hash(StructuredOutputSpec(json=SCHEMA))  # frozen and hashable: a cache key
    for bad in ({}, {"regex": "a", "choice": ["a"]}, {"choice": []}, {"choice": "ab"}, {"json_object": "yes"}):
        with pytest.raises(InvalidRequestError) as err:
            StructuredOutputSpec(**bad, param="response_format")
        assert err.value.field == "response_format"


def test_sampling_params_carry_constraints():
    sp = SamplingParams(
        structured_outputs=StructuredOutputSpec(regex="[0-9]+"),
        allowed_token_ids=[3, 4],
        bad_words=["x", "x"],
        bad_words_token_ids=[[5], [6, 7]],
    )
    assert sp.allowed_token_ids == (3, 4) and sp.bad_words == ("x",) and sp.bad_words_token_ids == ((5,), (6, 7))
    assert sp.has_logit_constraints and not SamplingParams().has_logit_constraints
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams(allowed_token_ids=[])
    assert err.value.field == "allowed_token_ids"
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams(bad_words=[""])
    assert err.value.field == "bad_words"


@pytest.mark.parametrize(
    "choices",
    [["yes", "no"], ['say "hi"', "back\\slash", "new\nline", "tab\t", "\x01ctl\x7f"], ["ünï", ""]],
)
def test_choice_grammar_is_vllms(choices):
    from vllm.v1.structured_output.utils import choice_as_grammar as vllm_choice_as_grammar

    assert choice_as_grammar(choices) == vllm_choice_as_grammar(choices)


@pytest.mark.parametrize("text", ["root ::= 'a'", "start: 'a'\n", "# c ::= x\nstart: A", "", "root ::= x # y"])
def test_lark_detection_is_vllms(text):
    from vllm.v1.structured_output.utils import grammar_is_likely_lark as vllm_is_lark

    assert grammar_is_likely_lark(text) == vllm_is_lark(text)


GOOD = [
    StructuredOutputSpec(json=SCHEMA),
    StructuredOutputSpec(regex=r"\d{3}-[a-z]+"),
    StructuredOutputSpec(choice=["red", "green"]),
    StructuredOutputSpec(grammar='root ::= "a" | "b" root'),
    StructuredOutputSpec(grammar='start: "x" | "y"'),
    StructuredOutputSpec(json_object=True),
    StructuredOutputSpec(
        structural_tag=json.dumps(
            {
                "type": "structural_tag",
                "structures": [{"begin": "<f>", "schema": SCHEMA, "end": "</f>"}],
                "triggers": ["<f>"],
            }
        )
    ),
]


@pytest.mark.parametrize("spec", GOOD, ids=lambda s: s.kind.value)
def test_good_specs_pass_the_check_and_compile(spec, tiny_llama):
    check_spec(spec)
    tok = load_tokenizer(str(tiny_llama))
    compiled = GrammarCompiler(tok.hf, 1024).compile(spec)
    assert isinstance(compiled, xgr.CompiledGrammar)


@pytest.mark.parametrize(
    "spec",
    [
        StructuredOutputSpec(json={"type": "objekt"}, param="response_format"),
        StructuredOutputSpec(json="{not json"),
        StructuredOutputSpec(regex="(unclosed"),
        StructuredOutputSpec(regex="a\x00"),
        StructuredOutputSpec(grammar="root ::= "),
        StructuredOutputSpec(grammar="start: ("),
        StructuredOutputSpec(structural_tag='{"structures": 3}'),
        StructuredOutputSpec(json=json.dumps(json.loads("[" * 70 + "]" * 70))),
    ],
    ids=["schema", "json-text", "regex", "nul", "ebnf", "lark", "tag", "nesting"],
)
def test_bad_specs_are_400s_naming_the_field(spec):
    with pytest.raises(InvalidRequestError) as err:
        check_spec(spec)
    assert err.value.field == spec.param
    assert "/project/cpp" not in err.value.message  # xgrammar's source prefix is stripped
