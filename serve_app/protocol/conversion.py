"""HTTP request models -> the engine contract (``GenerateRequest`` / ``SamplingParams``).

Everything a client can get wrong is caught here or by ``SamplingParams`` itself and raised as
``APIError(400, param=<field>)`` / ``InvalidRequestError(field)``, before any engine sees it.
Defaults and the context-length rule follow vLLM's OpenAI server: ``max_tokens`` None means
"up to max_model_len"; prompt + max_tokens must fit in max_model_len.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from accel.contract import GenerateRequest, InvalidRequestError, SamplingParams
from accel.text.bad_words import bad_words_token_ids
from accel.text.tokenizer import TextTokenizer
from serve_app.protocol.chat import ChatCompletionRequest
from serve_app.protocol.completions import CompletionRequest
from serve_app.protocol.errors import APIError, bad_request
from serve_app.protocol.field_policy import check_fields
from serve_app.protocol.sampling_fields import SamplingFields
from serve_app.protocol.structured_outputs import structured_output_spec
from serve_app.protocol.tool_request import ToolPlan, tool_call_arguments_as_dicts

_INT64 = 2**63
MAX_N = 128

M = TypeVar("M", bound=BaseModel)


def parse_body(model_cls: type[M], body: Any) -> M:
    """Validate a JSON body; a wrong field is a 400 naming it (vLLM answers 400, not 422)."""
    if not isinstance(body, Mapping):
        raise bad_request("the request body must be a JSON object")
    try:
        return model_cls.model_validate(body)
    except ValidationError as err:
        first = err.errors()[0]
        param = str(first["loc"][0]) if first["loc"] else None
        raise bad_request(f"{'.'.join(map(str, first['loc']))}: {first['msg']}", param) from None


def parse_request(body: Any, is_chat: bool) -> ChatCompletionRequest | CompletionRequest:
    """A chat or completions body as our request model; a field vLLM accepts that we do not
    honour is a 400 naming it (``field_policy``), never dropped."""
    if isinstance(body, Mapping):
        check_fields(body, is_chat)
    return parse_body(ChatCompletionRequest, body) if is_chat else parse_body(CompletionRequest, body)


def _check_common(req: SamplingFields) -> None:
    if req.use_beam_search:
        raise bad_request("beam search is not supported", "use_beam_search")
    if not 1 <= req.n <= MAX_N:
        raise bad_request(f"n must be in [1, {MAX_N}], got {req.n}", "n")
    if req.seed is not None and not -_INT64 <= req.seed < _INT64:
        raise bad_request("seed must fit in a signed 64-bit integer", "seed")


def completion_prompts(req: CompletionRequest, tokenizer: TextTokenizer) -> list[tuple[int, ...]]:
    """The request's prompts as token ids (a completions request may carry several)."""
    _check_common(req)
    if req.echo:
        raise bad_request("echo is not supported", "echo")
    if req.suffix:
        raise bad_request("suffix is not supported", "suffix")
    prompt = req.prompt
    if prompt is None or prompt == "" or prompt == []:
        raise bad_request("prompt must be a non-empty string, list of strings or list of token ids", "prompt")
    if isinstance(prompt, str):
        prompts: list[Any] = [prompt]
    elif all(isinstance(p, int) for p in prompt):
        prompts = [prompt]
    else:
        prompts = list(prompt)
    out = []
    for p in prompts:
        ids = tuple(tokenizer.encode(p, add_special_tokens=req.add_special_tokens)) if isinstance(p, str) else tuple(p)
        if not ids:
            raise bad_request("a prompt is empty", "prompt")
        if any(t >= tokenizer.vocab_size for t in ids):
            raise bad_request(f"prompt token ids must be < vocab size {tokenizer.vocab_size}", "prompt")
        out.append(ids)
    return out


def _message_text(message: Mapping[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text":
                raise bad_request("only text content parts are supported", "messages")
            texts.append(str(part.get("text", "")))
        content = "\n".join(texts)
    elif content is None:
        content = ""
    elif not isinstance(content, str):
        raise bad_request("message content must be a string or a list of text parts", "messages")
    return {**message, "content": content}


def chat_prompt(req: ChatCompletionRequest, tokenizer: TextTokenizer, plan: ToolPlan | None = None) -> tuple[int, ...]:
    """Render the conversation with the model's chat template and tokenize it; ``plan``: the
    request's tools and template kwargs (``tool_request.ChatTools.prepare``)."""
    _check_common(req)
    if req.tools and plan is None:
        raise bad_request("tools need the request's tool plan", "tools")  # the ingress always makes one
    if req.top_logprobs and not req.logprobs:
        raise bad_request("when using `top_logprobs`, `logprobs` must be set to true", "top_logprobs")
    if not req.messages:
        raise bad_request("messages must not be empty", "messages")
    for m in req.messages:
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise bad_request("every message needs a string role", "messages")
    messages = [_message_text(m) for m in req.messages]
    tool_call_arguments_as_dicts(messages)
    ids = tokenizer.apply_chat_template(
        messages,
        add_generation_prompt=req.add_generation_prompt and not req.continue_final_message,
        chat_template=req.chat_template,
        tools=plan.tool_dicts if plan is not None else None,
        chat_template_kwargs=plan.chat_template_kwargs if plan is not None else None,
    )
    if not ids:
        raise bad_request("the rendered prompt is empty", "messages")
    return tuple(ids)


def _max_tokens(requested: int | None, param: str, num_prompt_tokens: int, max_model_len: int) -> int:
    if num_prompt_tokens >= max_model_len:
        raise APIError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, "
            f"your request has {num_prompt_tokens} input tokens. Please reduce the "
            "length of the input messages.",
            "messages" if param == "max_completion_tokens" else "prompt",
        )
    room = max_model_len - num_prompt_tokens
    if requested is None:
        return room
    if requested < 1:
        raise bad_request(f"{param} must be at least 1, got {requested}.", param)
    if requested > room:
        raise bad_request(
            f"'{param}' is too large: {requested}. This model's maximum context length "
            f"is {max_model_len} tokens and your request has {num_prompt_tokens} input "
            f"tokens ({requested} > {max_model_len} - {num_prompt_tokens}).",
            param,
        )
    return requested


def sampling_params(
    req: CompletionRequest | ChatCompletionRequest,
    num_prompt_tokens: int,
    max_model_len: int,
    tokenizer: TextTokenizer | None = None,
) -> SamplingParams:
    """The engine's sampling params; ``InvalidRequestError(field)`` for out-of-range values.
    ``tokenizer`` encodes ``bad_words`` (required when the request has any)."""
    if isinstance(req, ChatCompletionRequest):
        param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
    else:
        param, requested, logprobs = "max_tokens", req.max_tokens, req.logprobs
    max_tokens = _max_tokens(requested, param, num_prompt_tokens, max_model_len)
    return SamplingParams(
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=0 if req.top_k is None else req.top_k,
        min_p=0.0 if req.min_p is None else req.min_p,
        seed=req.seed,
        max_tokens=max_tokens,
        min_tokens=req.min_tokens,
        stop=(req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ()),
        stop_token_ids=tuple(req.stop_token_ids or ()),
        include_stop_str_in_output=req.include_stop_str_in_output,
        ignore_eos=req.ignore_eos,
        logprobs=logprobs,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
        logit_bias=_logit_bias(req.logit_bias),
        skip_special_tokens=req.skip_special_tokens,
        structured_outputs=structured_output_spec(req.structured_outputs, req.response_format),
        allowed_token_ids=None if req.allowed_token_ids is None else tuple(req.allowed_token_ids),
        bad_words=tuple(req.bad_words),
        bad_words_token_ids=_bad_words(req.bad_words, tokenizer),
    )


def _bad_words(words: list[str], tokenizer: TextTokenizer | None) -> tuple[tuple[int, ...], ...]:
    if not words:
        return ()
    assert tokenizer is not None, "bad_words need the model's tokenizer"
    return bad_words_token_ids(words, tokenizer)


def _logit_bias(bias: dict[str, float] | None) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``{"<token id>": bias}`` as (token id, bias) pairs (ranges: ``SamplingParams``)."""
    pairs = []
    for key, value in (bias or {}).items():
        try:
            pairs.append((int(key), value))
        except ValueError:
            raise InvalidRequestError("logit_bias", f"key {key!r} is not a token id") from None
    return tuple(pairs)


def generate_requests(
    base_id: str, prompts: Sequence[tuple[int, ...]], sampling: Sequence[SamplingParams], n: int, session_id: str | None
) -> list[GenerateRequest]:
    """One engine request per (prompt, sample): choice index = prompt_index * n + sample_index,
    request id ``<base>-<choice index>`` (what vLLM does for n > 1)."""
    return [
        GenerateRequest(
            request_id=f"{base_id}-{p * n + i}", prompt_token_ids=ids, sampling=sampling[p], session_id=session_id
        )
        for p, ids in enumerate(prompts)
        for i in range(n)
    ]
