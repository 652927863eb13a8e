"""Our contract types <-> vLLM's: sampling params and kv_transfer_params in, sampled tokens,
logprobs and the KV connector's returned params out.

vLLM runs with ``detokenize=False`` and no stop strings: it samples and stops on the token-level
conditions (eos, ``stop_token_ids``, ``max_tokens``, ``max_model_len``, ``min_tokens``), and every
sampled token goes through our ``OutputBuilder``, which owns text, stop strings and the final
token count, exactly as in the TT engine. vLLM imports stay inside the functions so importing
this module is cheap.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from accel.contract import FinishReason, KVTransferParams, SamplingParams, StructuredOutputSpec, TokenLogprob
from accel.kv_transfer import params as kv_params

# vLLM's CompletionOutput.finish_reason strings -> ours ("error" ends the stream like an abort).
_FINISH_REASONS = {
    "stop": FinishReason.STOP,
    "length": FinishReason.LENGTH,
    "abort": FinishReason.ABORT,
    "error": FinishReason.ABORT,
}


def to_vllm_sampling_params(sp: SamplingParams) -> Any:
    """vLLM ``SamplingParams`` for ``sp``: every field our contract has, streamed as deltas.

    ``stop`` and ``include_stop_str_in_output`` are not passed: stop strings are matched on our
    side (``OutputBuilder``), which then aborts the vLLM request.
    """
    # deferred: importing this module must not import vLLM (the platform is chosen before it is)
    from vllm import SamplingParams as VllmSamplingParams
    from vllm.sampling_params import RequestOutputKind

    return VllmSamplingParams(
        n=1,
        temperature=sp.temperature,
        top_p=sp.top_p,
        top_k=sp.top_k,
        min_p=sp.min_p,
        seed=sp.seed,
        max_tokens=sp.max_tokens,
        min_tokens=sp.min_tokens,
        stop_token_ids=list(sp.stop_token_ids),
        ignore_eos=sp.ignore_eos,
        logprobs=sp.logprobs,
        prompt_logprobs=sp.prompt_logprobs,
        presence_penalty=sp.presence_penalty,
        frequency_penalty=sp.frequency_penalty,
        repetition_penalty=sp.repetition_penalty,
        logit_bias=dict(sp.logit_bias) or None,
        skip_special_tokens=sp.skip_special_tokens,
        structured_outputs=to_vllm_structured_outputs(sp.structured_outputs),
        allowed_token_ids=None if sp.allowed_token_ids is None else list(sp.allowed_token_ids),
        bad_words=list(sp.bad_words) or None,  # vLLM tokenizes them itself (update_from_tokenizer)
        detokenize=False,
        output_kind=RequestOutputKind.DELTA,
    )


def to_vllm_structured_outputs(spec: StructuredOutputSpec | None) -> Any:
    """vLLM's ``StructuredOutputsParams`` for ``spec`` (vLLM's own structured-output backend
    compiles and applies it). ``reasoning_end_token_ids`` has no per-request counterpart: vLLM
    starts the grammar after the reasoning end itself when the engine has a ``reasoning_parser``."""
    if spec is None:
        return None
    from vllm.sampling_params import StructuredOutputsParams  # deferred: see to_vllm_sampling_params

    return StructuredOutputsParams(
        json=spec.json,
        regex=spec.regex,
        choice=None if spec.choice is None else list(spec.choice),
        grammar=spec.grammar,
        json_object=spec.json_object,
        structural_tag=spec.structural_tag,
        disable_any_whitespace=spec.disable_any_whitespace,
        disable_additional_properties=spec.disable_additional_properties,
        whitespace_pattern=spec.whitespace_pattern,
    )


def to_finish_reason(vllm_reason: str | None) -> FinishReason:
    return _FINISH_REASONS.get(vllm_reason or "abort", FinishReason.ABORT)


def to_token_logprobs(
    token_ids: Sequence[int], logprobs: Sequence[Mapping[int, Any] | None] | None, num_top: int
) -> list[TokenLogprob] | None:
    """vLLM's per-token ``{token_id: Logprob(logprob, rank, decoded_token)}`` -> ``TokenLogprob``.

    Each dict holds the sampled token and the ``num_top`` best tokens (rank 1 = best); ``top`` is
    those best tokens, best first (it contains the sampled token when it ranks within them).
    """
    if logprobs is None:
        return None
    out = []
    for token_id, entries in zip(token_ids, logprobs):
        assert entries is not None  # (vLLM's FlatLogprobs types positions optional; sampled ones have entries)
        sampled = entries[token_id]
        best = sorted(
            (lp.rank, tid, lp.logprob) for tid, lp in entries.items() if lp.rank is not None and lp.rank <= num_top
        )
        out.append(
            TokenLogprob(
                token_id=token_id,
                logprob=float(sampled.logprob),
                top=tuple((tid, float(lp)) for _, tid, lp in best),
                rank=sampled.rank,
            )
        )
    return out


def to_prompt_logprobs(
    prompt_token_ids: Sequence[int], prompt_logprobs: Sequence[Mapping[int, Any] | None] | None, num_top: int
) -> tuple[TokenLogprob | None, ...] | None:
    """vLLM's ``RequestOutput.prompt_logprobs`` (None for the first token) as ``TokenLogprob``s."""
    if prompt_logprobs is None:
        return None
    out: list[TokenLogprob | None] = [None]
    for token_id, entries in zip(list(prompt_token_ids)[1:], list(prompt_logprobs)[1:]):
        if entries is None or token_id not in entries:
            out.append(None)
            continue
        out.extend(to_token_logprobs([token_id], [entries], num_top) or ())
    return tuple(out)


def to_vllm_kv_params(kv: KVTransferParams) -> dict[str, Any]:
    """The request's ``kv_transfer_params`` (vLLM: ``SamplingParams.extra_args``, read by the
    scheduler-side connector): an engine-native connector's own dict (``connector_params``)
    unchanged, else ours, for ``MeshServeConnector``."""
    return dict(kv.connector_params) if kv.connector_params is not None else kv_params.to_dict(kv)


def from_vllm_kv_params(returned: Mapping[str, Any] | None, sent: KVTransferParams | None) -> KVTransferParams | None:
    """What the connector returned (``RequestOutput.kv_transfer_params``), in the terms the
    request was sent in: the engine-native connector's dict unchanged as ``connector_params``,
    else parsed as ours. None when it returned nothing."""
    if not returned:
        return None
    if sent is not None and sent.connector_params is not None:
        return KVTransferParams(connector_params=returned)
    return kv_params.from_dict(returned)
