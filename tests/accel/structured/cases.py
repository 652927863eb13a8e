"""Structured-output cases shared by the engine tests: a spec and a check of the text it yields.

Every grammar is bounded (no free whitespace, bounded numbers and repetitions): the tiny model is
random, and an unbounded grammar lets it run to max_tokens instead of finishing. json_object is
left to the unit tests for that reason (any object is unbounded)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

import jsonschema

from accel.contract import StructuredOutputSpec

SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "enum": ["yes", "no"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["answer", "count"],
    "additionalProperties": False,
}
REGEX = r"[a-c]{2}-[0-9]{1,3}"
CHOICES = ("alpha", "beta gamma", "delta")
GRAMMAR = 'root ::= "<" item ("," item){0,3} ">"\nitem ::= "x" | "yy"'


def _valid_json(text: str) -> bool:
    jsonschema.validate(json.loads(text), SCHEMA)
    return True


@dataclass(frozen=True)
class Case:
    name: str
    spec: StructuredOutputSpec
    valid: Callable[[str], bool]


CASES = [
    Case("json_schema", StructuredOutputSpec(json=SCHEMA, disable_any_whitespace=True), _valid_json),
    Case("regex", StructuredOutputSpec(regex=REGEX), lambda t: re.fullmatch(REGEX, t) is not None),
    Case("choice", StructuredOutputSpec(choice=CHOICES), lambda t: t in CHOICES),
    Case(
        "grammar", StructuredOutputSpec(grammar=GRAMMAR), lambda t: re.fullmatch(r"<(x|yy)(,(x|yy))*>", t) is not None
    ),
]
