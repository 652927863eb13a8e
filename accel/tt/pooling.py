"""The TT mesh engine runs generative models only: a pooling request (embeddings) is refused
naming ``model``, as vLLM refuses a task its runner does not serve."""

from __future__ import annotations

from typing import NoReturn

from accel.contract import EmbedRequest, InvalidRequestError


def refuse_pooling(request: EmbedRequest) -> NoReturn:
    del request
    raise InvalidRequestError(
        "model",
        "the TT mesh engine runs no pooling (embeddings); serve the model from a vLLM pool with "
        "engine_args runner: pooling",
    )
