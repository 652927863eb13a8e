"""Structured-output specs -> xgrammar grammars, the way vLLM 0.32's xgrammar backend builds them.

``check_spec`` is the HTTP edge's compile check (vLLM's ``validate_xgrammar_grammar``: parse the
spec into an ``xgrammar.Grammar`` without a tokenizer; a failure is an ``InvalidRequestError``
naming the request field the spec came from). ``GrammarCompiler`` is the engine side: one per
model (its tokenizer's ``TokenizerInfo``, the model's vocab size), compiling a spec into the
token-level ``CompiledGrammar`` a matcher runs on, with xgrammar's compile cache on (a repeated
schema costs a lookup). Compilation takes milliseconds to seconds (vocab size x grammar size),
so engines call ``compile`` off their step loop.

The choices follow ``vllm/v1/structured_output/backend_xgrammar.py``: ``choice`` becomes the EBNF
``root ::= "a" | "b"`` (``choice_as_grammar``); a grammar without ``::=`` is Lark
(``grammar_is_likely_lark``); ``json_object`` is the schema ``{"type": "object"}``;
``disable_any_whitespace`` compiles JSON without free whitespace and with the compact separators.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

import xgrammar as xgr

from accel.contract import InvalidRequestError, StructuredOutputKind, StructuredOutputSpec

# vLLM's MAX_STRUCTURED_OUTPUT_JSON_NESTING (vllm/sampling_params.py): deeper schemas are refused.
MAX_JSON_NESTING = 64
STRUCTURAL_TAG_WRAPPER_NESTING = 16
_COMPACT_SEPARATORS = (",", ":")


def grammar_is_likely_lark(grammar_str: str) -> bool:
    """vLLM's test (``vllm.v1.structured_output.utils``): no line defines a rule with ``::=``."""
    if not grammar_str or not isinstance(grammar_str, str):
        return False
    for line in grammar_str.split("\n"):
        line = re.sub(r"(#|//).*$", "", line).strip()
        if line and "::=" in line:
            return False
    return True


def _escape_ebnf_char(ch: str) -> str:
    escapes = {"\\": r"\\", '"': r"\"", "\n": r"\n", "\r": r"\r", "\t": r"\t"}
    if ch in escapes:
        return escapes[ch]
    if ord(ch) < 0x20 or ord(ch) == 0x7F:
        return f"\\u{ord(ch):04x}"
    return ch


def choice_as_grammar(choice: Iterable[str]) -> str:
    """vLLM's ``choice_as_grammar``: one EBNF alternative per choice, literals escaped."""
    alternatives = ('"' + "".join(_escape_ebnf_char(ch) for ch in c) + '"' for c in choice)
    return "root ::= " + " | ".join(alternatives)


def _nesting_depth(value: Any) -> int:
    """Object/array nesting depth of a JSON value (iterative: a hostile schema cannot recurse us)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Iterable[Any] = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children)
    return deepest


def check_spec(spec: StructuredOutputSpec) -> None:
    """Raise ``InvalidRequestError(spec.param, ...)`` unless ``spec`` parses into a grammar.

    Tokenizer-free, so the ingress can run it for any model; regex parsing can be slow on
    adversarial patterns, so callers run this off their event loop with a timeout.
    """
    param = spec.param
    kind = spec.kind
    try:
        if kind is StructuredOutputKind.JSON:
            assert spec.json is not None
            try:
                schema = json.loads(spec.json)
            except json.JSONDecodeError:
                raise InvalidRequestError(param, "Invalid JSON grammar specification.") from None
            if _nesting_depth(schema) > MAX_JSON_NESTING:
                raise InvalidRequestError(
                    param,
                    f"The JSON schema is nested too deeply: objects and arrays may nest at most "
                    f"{MAX_JSON_NESTING} levels",
                )
            xgr.Grammar.from_json_schema(spec.json, any_whitespace=not spec.disable_any_whitespace)
        elif kind is StructuredOutputKind.REGEX:
            assert spec.regex is not None
            if "\x00" in spec.regex:
                raise InvalidRequestError(param, "regex must not contain a NUL character ('\\x00')")
            xgr.Grammar.from_regex(spec.regex)
        elif kind is StructuredOutputKind.CHOICE:
            assert spec.choice is not None
            xgr.Grammar.from_ebnf(choice_as_grammar(spec.choice))
        elif kind is StructuredOutputKind.GRAMMAR:
            assert spec.grammar is not None
            if grammar_is_likely_lark(spec.grammar):
                xgr.Grammar.from_lark(spec.grammar)
            else:
                xgr.Grammar.from_ebnf(spec.grammar)
        elif kind is StructuredOutputKind.STRUCTURAL_TAG:
            assert spec.structural_tag is not None
            tag = json.loads(spec.structural_tag)
            if _nesting_depth(tag) > MAX_JSON_NESTING + STRUCTURAL_TAG_WRAPPER_NESTING:
                raise InvalidRequestError(param, "The structural tag is nested too deeply")
            _structural_tag_grammar(tag, spec.structural_tag)
        # JSON_OBJECT: a fixed schema, nothing the client can get wrong
    except InvalidRequestError:
        raise
    except Exception as exc:  # xgrammar raises RuntimeError / ValueError / its own errors
        raise InvalidRequestError(param, f"invalid {kind.value} specification: {_first_line(exc)}") from None


def _legacy_structural_tag(tag: Any) -> tuple[list[Any], Any] | None:
    """``(items, triggers)`` of the deprecated ``{"structures": [...], "triggers": [...]}`` form
    (vLLM still takes it), None for the current form (passed to xgrammar as its JSON text)."""
    if not (isinstance(tag, dict) and "structures" in tag):
        return None
    items = [
        xgr.StructuralTagItem(begin=s["begin"], schema=json.dumps(s["schema"]), end=s["end"]) for s in tag["structures"]
    ]
    return items, tag["triggers"]


def _structural_tag_grammar(tag: Any, text: str) -> Any:
    legacy = _legacy_structural_tag(tag)
    if legacy is not None:
        return xgr.Grammar.from_structural_tag(*legacy)
    return xgr.Grammar.from_structural_tag(text)


def _first_line(exc: Exception) -> str:
    """xgrammar's messages start with a ``[time] file:line:`` prefix; keep what the client needs."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return re.sub(r"^\[[^\]]*\]\s*\S+:\d+:\s*", "", text)


class GrammarCompiler:
    """Compiles specs for one model. Thread-safe (xgrammar's compiler is); cached per spec.

    ``hf_tokenizer``: the model's HF tokenizer (``TokenizerInfo.from_huggingface``, as vLLM);
    ``vocab_size``: the model's (logits width, >= the tokenizer's), as vLLM passes it.
    """

    def __init__(self, hf_tokenizer: Any, vocab_size: int, max_threads: int = 8, cache_limit_mb: int = 512):
        self.vocab_size = vocab_size
        self.tokenizer_info = xgr.TokenizerInfo.from_huggingface(hf_tokenizer, vocab_size=vocab_size)
        self._compiler = xgr.GrammarCompiler(
            self.tokenizer_info,
            max_threads=max_threads,
            cache_enabled=True,
            cache_limit_bytes=cache_limit_mb * 1024 * 1024,
        )

    def compile(self, spec: StructuredOutputSpec) -> xgr.CompiledGrammar:
        compiler = self._compiler
        kind = spec.kind
        json_kwargs: dict[str, Any] = {
            "any_whitespace": not spec.disable_any_whitespace,
            "separators": _COMPACT_SEPARATORS if spec.disable_any_whitespace else None,
        }
        if kind is StructuredOutputKind.JSON:
            assert spec.json is not None
            return compiler.compile_json_schema(spec.json, **json_kwargs)
        if kind is StructuredOutputKind.JSON_OBJECT:
            return compiler.compile_json_schema('{"type": "object"}', **json_kwargs)
        if kind is StructuredOutputKind.REGEX:
            assert spec.regex is not None
            return compiler.compile_regex(spec.regex)
        if kind is StructuredOutputKind.CHOICE:
            assert spec.choice is not None
            return compiler.compile_grammar(choice_as_grammar(spec.choice))
        if kind is StructuredOutputKind.GRAMMAR:
            assert spec.grammar is not None
            if grammar_is_likely_lark(spec.grammar):
                return compiler.compile_lark(spec.grammar)
            return compiler.compile_grammar(spec.grammar)
        assert spec.structural_tag is not None
        legacy = _legacy_structural_tag(json.loads(spec.structural_tag))
        if legacy is not None:
            return compiler.compile_structural_tag(*legacy)
        return compiler.compile_structural_tag(spec.structural_tag)
