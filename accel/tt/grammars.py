"""The TT engine's structured-output grammars: compiled off the step loop, cached, and turned
into one ``LogitsConstraint`` per request on the engine thread.

Compiling a spec against the model's vocabulary takes milliseconds (tiny vocab, small schema) to
seconds (150k-token vocab, large schema), so ``compile`` runs in a worker thread from the request's
coroutine (before the request reaches the engine thread) and never on the step loop; xgrammar's
compile cache makes a repeated spec a lookup. The compiler (the tokenizer's ``TokenizerInfo``) is
built on first use, in that thread too. Compiling here rather than at the ingress keeps the
ingress model-agnostic and ships nothing but the spec (a compiled grammar of a large vocabulary
is megabytes); bench/structured_outputs.py measures the compile and per-token costs.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from accel.contract import GenerateRequest, InvalidRequestError, StructuredOutputSpec
from accel.structured.constraint import LogitsConstraint
from accel.structured.grammar import GrammarCompiler
from accel.text.tokenizer import TextTokenizer


class EngineGrammars:
    def __init__(self, tokenizer: TextTokenizer, vocab_size: int):
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._compiler: GrammarCompiler | None = None
        self._lock = threading.Lock()
        self.num_compiles = 0

    def _get_compiler(self) -> GrammarCompiler:
        with self._lock:
            if self._compiler is None:
                self._compiler = GrammarCompiler(self._tokenizer.hf, self.vocab_size)
            return self._compiler

    def compile_sync(self, spec: StructuredOutputSpec) -> Any:
        """The compiled grammar of ``spec`` (an ``xgrammar.CompiledGrammar``); a spec that does not
        compile is an ``InvalidRequestError`` naming its field (the ingress checks specs first,
        so this only fires for callers that skip it)."""
        compiler = self._get_compiler()
        self.num_compiles += 1
        try:
            return compiler.compile(spec)
        except Exception as exc:
            raise InvalidRequestError(spec.param, f"the {spec.kind.value} constraint does not compile: {exc}") from None

    async def compile(self, spec: StructuredOutputSpec) -> Any:
        return await asyncio.to_thread(self.compile_sync, spec)

    def constraint(self, request: GenerateRequest, grammar: Any) -> LogitsConstraint:
        """A fresh per-request constraint (engine thread; building the matcher is cheap). The
        grammar's stop tokens are vLLM's ``all_stop_token_ids``: eos and the stop token ids. A
        failover continuation's constraint is advanced over the output its earlier attempt emitted
        (``resumed_output_token_ids``), so its grammar resumes where the stream stopped."""
        sp = request.sampling
        stops = set(self._tokenizer.eos_token_ids) | set(sp.stop_token_ids)
        constraint = LogitsConstraint(sp, grammar, stops, self.vocab_size)
        for token_id in request.resumed_output_token_ids:
            constraint.accept(token_id)
        return constraint
