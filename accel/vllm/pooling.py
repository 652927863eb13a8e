"""Pooling requests on ``AsyncLLM``: our ``EmbedRequest`` as vLLM's ``PoolingParams`` (task
``embed``) through ``AsyncLLM.encode``, and its ``PoolingRequestOutput`` back as an
``EmbeddingResult``. Only an engine built with vLLM's pooling runner (``runner: pooling``,
e.g. ``convert: embed`` on a decoder checkpoint) serves them; vLLM itself checks the rest
(``dimensions`` on a model that is not Matryoshka: its own message).

vLLM is imported inside the functions: this module is imported with ``accel.vllm.engine``,
after the platform choice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from accel.contract import EmbeddingResult, EmbedRequest, InvalidRequestError

if TYPE_CHECKING:
    from vllm.inputs import TokensPrompt

POOLING_RUNNER = "pooling"


def check_embed(request: EmbedRequest, runner_type: str, max_model_len: int, vocab_size: int) -> None:
    """What vLLM's server checks before it calls the engine: the runner serves the task and the
    prompt fits (a pooling request produces no tokens, so up to ``max_model_len`` is fine)."""
    if runner_type != POOLING_RUNNER:
        raise InvalidRequestError(
            "model", f"this engine runs vLLM's {runner_type!r} runner; embeddings need runner: pooling"
        )
    if request.num_prompt_tokens > max_model_len:
        raise InvalidRequestError(
            "input",
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{request.num_prompt_tokens} tokens in the input for embedding generation. Please reduce "
            "the length of the input.",
        )
    bad = [t for t in request.prompt_token_ids if t >= vocab_size]
    if bad:
        raise InvalidRequestError("input", f"token id {bad[0]} is out of the vocabulary (size {vocab_size})")


def to_pooling_params(request: EmbedRequest) -> Any:
    """vLLM's ``PoolingParams`` for an embedding, as its ``EmbeddingCompletionRequest`` builds them."""
    from vllm import PoolingParams  # deferred: see the module docstring

    return PoolingParams(task="embed", dimensions=request.dimensions, use_activation=request.use_activation)


def to_embedding_result(request: EmbedRequest, output: Any) -> EmbeddingResult:
    """``output``: vLLM's finished ``PoolingRequestOutput`` (``outputs.data``: a 1-D tensor)."""
    values = output.outputs.data.flatten().tolist()
    return EmbeddingResult(request.request_id, tuple(float(v) for v in values), len(output.prompt_token_ids))


async def encode(llm: Any, request: EmbedRequest) -> EmbeddingResult:
    """Run ``request`` on ``llm`` (an ``AsyncLLM``); vLLM's own refusals become 400s. Closing the
    caller (cancellation) closes vLLM's generator, which aborts the request there."""
    from vllm.exceptions import VLLMValidationError  # deferred: see the module docstring

    prompt: TokensPrompt = {"prompt_token_ids": list(request.prompt_token_ids)}  # type: ignore[typeddict-item]
    stream = llm.encode(prompt, to_pooling_params(request), request.request_id)
    final = None
    try:
        async for out in stream:
            final = out
    except VLLMValidationError as exc:  # (not a ValueError)
        message = str(exc.args[0]) if exc.args else str(exc)
        raise InvalidRequestError(exc.parameter or _field_of(message), message) from None
    finally:
        await stream.aclose()
    if final is None or not final.finished:
        raise RuntimeError(f"vLLM's pooling stream of {request.request_id} ended without a result")
    return to_embedding_result(request, final)


def _field_of(message: str) -> str:
    """The request field a vLLM pooling refusal is about (vLLM names it only in the message)."""
    return "dimensions" if "dimensions" in message else "input"
