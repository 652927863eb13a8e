"""Turns a request's sampled tokens into ``OutputDelta``s: detokenize, stop, count.

Every engine feeds sampled token ids here, one step at a time, so stop strings, eos, stop
tokens, max_tokens and max_model_len behave identically across engine kinds.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer

from accel.contract import FinishReason, GenerateRequest, KVTransferParams, OutputDelta, TokenLogprob
from accel.text.detokenizer import IncrementalDetokenizer
from accel.text.stop_strings import StopStringMatcher
from accel.text.stop_tokens import check_token_stop


class OutputBuilder:
    """Per-request output state. Not thread-safe: one owner (the engine's output loop)."""

    def __init__(
        self, request: GenerateRequest, tokenizer: Tokenizer, eos_token_ids: frozenset[int], max_model_len: int
    ):
        self._request = request
        self._eos = eos_token_ids
        self._max_model_len = max_model_len
        sp = request.sampling
        self._detok = IncrementalDetokenizer(tokenizer, sp.skip_special_tokens, request.prompt_token_ids)
        self._stops = StopStringMatcher(sp.stop, sp.include_stop_str_in_output)
        self._num_output = 0
        self.num_cached_tokens = 0
        self.finish_reason: FinishReason | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def num_output_tokens(self) -> int:
        return self._num_output

    def add_tokens(
        self,
        token_ids: Sequence[int],
        logprobs: Sequence[TokenLogprob] | None = None,
        kv_transfer: KVTransferParams | None = None,
    ) -> OutputDelta:
        """Consume newly sampled tokens; tokens after a stop are dropped."""
        assert not self.finished, "request already finished"
        sp = self._request.sampling
        kept: list[int] = []
        text_parts: list[str] = []
        stop_reason: str | int | None = None
        for token_id in token_ids:
            kept.append(token_id)
            self._num_output += 1
            token_stop = check_token_stop(
                token_id, self._num_output, self._request.num_prompt_tokens, sp, self._eos, self._max_model_len
            )
            if token_stop is not None and token_stop.finish_reason is FinishReason.STOP:
                # An eos / stop token id ends the request with its text left out unless
                # include_stop_str_in_output (vLLM's IncrementalDetokenizer.update, stop_terminated):
                # it matters with skip_special_tokens=False (e.g. a tool parser's request).
                if sp.include_stop_str_in_output:
                    text_parts.append(self._stops.feed(self._detok.step([token_id])).text)
                self.finish_reason, stop_reason = token_stop.finish_reason, token_stop.stop_reason
                text_parts.append(self._flush())
                break
            match = self._stops.feed(self._detok.step([token_id]))
            text_parts.append(match.text)
            if match.stop_str is not None:
                self.finish_reason, stop_reason = FinishReason.STOP, match.stop_str
                break
            if token_stop is not None:
                self.finish_reason, stop_reason = token_stop.finish_reason, token_stop.stop_reason
                text_parts.append(self._flush())
                break
        lps = None
        if logprobs is not None and sp.logprobs is not None:
            lps = tuple(logprobs[: len(kept)])
        return OutputDelta(
            request_id=self._request.request_id,
            new_token_ids=tuple(kept),
            text="".join(text_parts),
            num_prompt_tokens=self._request.num_prompt_tokens,
            num_completion_tokens=self._num_output,
            num_cached_tokens=self.num_cached_tokens,
            logprobs=lps,
            finish_reason=self.finish_reason,
            stop_reason=stop_reason,
            kv_transfer=kv_transfer if self.finished else None,
        )

    def _flush(self) -> str:
        # The detokenizer holds nothing worth sending at the end (vLLM drops an incomplete
        # character); only text held back for a possible stop string is released.
        return self._stops.flush()

    def finish(self, reason: FinishReason) -> OutputDelta:
        """End the request from outside (abort, engine error): releases held-back text."""
        text = "" if self.finished else self._flush()
        self.finish_reason = self.finish_reason or reason
        return OutputDelta(
            request_id=self._request.request_id,
            new_token_ids=(),
            text=text,
            num_prompt_tokens=self._request.num_prompt_tokens,
            num_completion_tokens=self._num_output,
            num_cached_tokens=self.num_cached_tokens,
            finish_reason=self.finish_reason,
        )
