"""Per-model output parsing: vLLM's tool-call and reasoning parsers, spelled as ``vllm serve``
spells them (``--enable-auto-tool-choice``, ``--tool-call-parser``, ``--reasoning-parser``,
``--tool-strict-level``), set in the model's config block (every pool of a model shares them:
the ingress parses the output, whichever engine produced it).

The names are vLLM's registry names (``vllm.tool_parsers.ToolParserManager``,
``vllm.reasoning.ReasoningParserManager``); the ingress builds the parsers with
``vllm.parser.ParserManager.get_parser`` at start, which refuses an unknown name or a tokenizer
the parser cannot work with (as ``vllm serve`` does at start).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from accel.contract import ConfigError

ToolStrictLevel = Literal["auto", "function", "parameter"]


@dataclass(frozen=True)
class OutputParsing:
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    tool_strict_level: ToolStrictLevel = "auto"

    def __post_init__(self) -> None:
        # vLLM's own start-up rule (vllm.entrypoints.launchers.cli_args).
        if self.enable_auto_tool_choice and not self.tool_call_parser:
            raise ConfigError("enable_auto_tool_choice requires tool_call_parser to be set")

    @property
    def has_parser(self) -> bool:
        """Whether vLLM's ``ParserManager`` builds a parser for this model (as ``vllm serve``:
        a tool parser only with auto tool choice enabled)."""
        return bool(self.reasoning_parser) or (self.enable_auto_tool_choice and bool(self.tool_call_parser))
