"""``POST /invocations`` as vLLM 0.32's server routes it (``vllm/entrypoints/serve/sagemaker``):
the body goes to the first endpoint whose request model accepts it, in vLLM's order, among the
endpoints the model serves: chat completions, then completions (a generative model); embeddings,
rerank, score, then pooling (an embedding model). Each is validated by vLLM's own request type
(``get_generate_invocation_types`` + ``get_pooling_invocation_types``), then served by our
endpoint for it. A body none accepts is vLLM's 400 listing the types it tried.

vLLM serves one model; here the body's ``model`` picks whose tasks count (a model we do not
serve, or none with several served: every served task, the endpoint then answers its 404).
SageMaker's session and adapter headers (``model_hosting_container_standards``) are not read.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Mapping
from functools import cache
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from serve_app.http.json_io import error_response, read_body
from serve_app.http.protocol.errors import APIError, bad_request

# (task the model must serve, endpoint, vLLM's request type), in vLLM's order: generate first,
# then pooling (its "items defined earlier take higher priority").
INVOCATION_TYPES = (
    ("generate", "chat", "vllm.entrypoints.openai.chat_completion.protocol:ChatCompletionRequest"),
    ("generate", "completions", "vllm.entrypoints.openai.completion.protocol:CompletionRequest"),
    ("embed", "embeddings", "vllm.entrypoints.pooling.embed.protocol:EmbeddingRequest"),
    ("embed", "rerank", "vllm.entrypoints.pooling.scoring.protocol:RerankRequest"),
    ("embed", "score", "vllm.entrypoints.pooling.scoring.protocol:ScoreRequest"),
    ("embed", "pooling", "vllm.entrypoints.pooling.pooling.protocol:PoolingRequest"),
)

Handler = Callable[[Request], Awaitable[Response]]


@cache
def _validator(spec: str) -> tuple[Any, str]:
    """vLLM's request type ``spec`` as a ``TypeAdapter`` (built once) and its name as vLLM's
    message prints it."""
    import pydantic

    module, name = spec.split(":")
    request_type = getattr(importlib.import_module(module), name)  # deferred: vLLM only when called
    shown = request_type.__name__ if isinstance(request_type, type) else str(request_type)
    return pydantic.TypeAdapter(request_type), shown


def choose(body: Mapping[str, Any], tasks: frozenset[str]) -> str:
    """The endpoint vLLM would serve ``body`` with, for a model serving ``tasks``."""
    import pydantic
    from vllm.exceptions import VLLMValidationError  # deferred: as above

    tried, refused, raised = [], set(), None
    for task, endpoint, spec in INVOCATION_TYPES:
        if task not in tasks or task in refused:
            continue
        validator, shown = _validator(spec)
        tried.append(shown)
        try:
            validator.validate_python(dict(body))
        except pydantic.ValidationError:
            continue
        except VLLMValidationError as exc:
            # A request type's own check raised: vLLM's server (one model, one task) answers
            # that 400. A model here serving both tasks still tries the other task's types.
            raised = raised or bad_request(str(exc.args[0]) if exc.args else str(exc), exc.parameter)
            if len(tasks) == 1:
                raise raised from None
            refused.add(task)
            continue
        return endpoint
    raise raised or bad_request(f"Cannot find suitable handler for request. Expected one of: {tried}")


async def invoke(
    request: Request,
    tasks_of: Callable[[str | None], frozenset[str]],
    handlers: Mapping[str, Handler],
    on_reject: Callable[[str, int], None],
) -> Response:
    """Serve ``request`` with the endpoint vLLM would choose (``handlers``: endpoint -> its route;
    the body, read here, stays cached on ``request`` for it). ``on_reject(model label, status)``
    counts a body no endpoint takes."""
    try:
        body = await read_body(request)
        model = body.get("model")
        endpoint = choose(body, tasks_of(model if isinstance(model, str) else None))
    except APIError as err:
        on_reject("unknown", err.status)
        return error_response(err)
    return await handlers[endpoint](request)
