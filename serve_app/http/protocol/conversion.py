"""HTTP request models -> the engine contract (``GenerateRequest`` / ``SamplingParams``).

Everything a client can get wrong is caught here or by ``SamplingParams`` itself and raised as
``APIError(400, param=<field>)`` / ``InvalidRequestError(field)``, before any engine sees it.
Defaults and the context-length rule follow vLLM's OpenAI server: ``max_tokens`` None means
"up to max_model_len"; prompt + max_tokens must fit in max_model_len.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from accel.contract import GenerateRequest, InvalidRequestError, SamplingParams
from accel.text.bad_words import bad_words_token_ids
from accel.text.tokenizer import TextTokenizer
from deployments.config.ingress import MAX_N
from serve_app.http.protocol.chat import ChatCompletionRequest
from serve_app.http.protocol.chat_roles import developer_as_system
from serve_app.http.protocol.completions import CompletionRequest
from serve_app.http.protocol.errors import bad_request
from serve_app.http.protocol.field_policy import check_fields
from serve_app.http.protocol.max_tokens import echo_only, fit_max_tokens, max_tokens_or_default
from serve_app.http.protocol.sampling_fields import SamplingFields
from serve_app.http.protocol.structured_outputs import structured_output_spec
from serve_app.http.protocol.tool_request import ToolPlan, tool_call_arguments_as_dicts
from serve_app.http.protocol.truncation import truncation

_INT64 = 2**63
_GREEDY_EPS = 1e-5  # vLLM's _SAMPLING_EPS: a temperature below it is greedy

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
        # vLLM's "before" validators: they look at what the client sent, not at defaults.
        check_cache_salt(body.get("cache_salt"))
        prompt_lps = body.get("prompt_logprobs")
        if body.get("stream") and isinstance(prompt_lps, int) and (prompt_lps > 0 or prompt_lps == -1):
            raise bad_request("`prompt_logprobs` are not available when `stream=True`.", "prompt_logprobs")
        if body.get("stream_options") and not body.get("stream"):
            raise bad_request("Stream options can only be defined when `stream=True`.", "stream_options")
        if is_chat and body.get("continue_final_message") and body.get("add_generation_prompt"):
            raise bad_request(
                "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                "continue_final_message",
            )
    return parse_body(ChatCompletionRequest, body) if is_chat else parse_body(CompletionRequest, body)


_CACHE_SALT_FORBIDDEN = frozenset("@/\\\x00")
_MAX_CACHE_SALT_LENGTH = 128


def check_cache_salt(salt: Any) -> None:
    """vLLM's ``validate_cache_salt``: a non-empty string of at most 128 characters without
    '@', '/', '\\' or NUL."""
    if salt is None:
        return
    if not isinstance(salt, str) or not salt:
        raise bad_request("Parameter 'cache_salt' must be a non-empty string if provided.", "cache_salt")
    if len(salt) > _MAX_CACHE_SALT_LENGTH or any(c in _CACHE_SALT_FORBIDDEN for c in salt):
        raise bad_request(
            "Parameter 'cache_salt' must be at most 128 characters and must not contain '@', '/', '\\\\', or NUL.",
            "cache_salt",
        )


def response_id(prefix: str, header_request_id: str | None, req: SamplingFields) -> str:
    """The response's ``id``: ``<prefix>-<id>``, as vLLM's server builds it, the id being the
    body's ``request_id``, else the ``X-Request-Id`` header, else a random uuid.

    vLLM prefers the header; but behind Ray Serve every request has one (Serve's
    RequestIdMiddleware and its HAProxy generate it when the client sent none), so a body
    ``request_id`` could never win: here it does. Without one the id is the client's header, or
    the one Serve generated and returns in its ``X-Request-ID`` response header."""
    return f"{prefix}-{req.request_id or header_request_id or uuid.uuid4().hex}"


def request_prompts(
    req: CompletionRequest | ChatCompletionRequest,
    tokenizer: TextTokenizer,
    max_model_len: int,
    plan: ToolPlan | None = None,
) -> list[tuple[int, ...]]:
    """The request's prompts as token ids, truncated as ``truncate_prompt_tokens`` asks
    (``truncation``: vLLM's rules; ``plan``: a chat request's tools and template kwargs)."""
    cut = truncation(req.truncate_prompt_tokens, req.truncation_side, max_tokens_or_default(req)[1], max_model_len)
    max_length = None if cut is None else cut.encode_max_length
    if isinstance(req, ChatCompletionRequest):
        prompts = [chat_prompt(req, tokenizer, plan, max_length)]
    else:
        prompts = completion_prompts(req, tokenizer, max_length)
    return prompts if cut is None else [cut.apply(p) for p in prompts]


def _check_common(req: SamplingFields) -> None:
    if req.use_beam_search:
        raise bad_request("beam search is not supported", "use_beam_search")
    if req.n < 1:  # the upper bound is the server's (ingress.max_n <= MAX_N): limits.check_n
        raise bad_request(f"n must be in [1, {MAX_N}], got {req.n}", "n")
    if req.n > 1 and req.temperature is not None and req.temperature < _GREEDY_EPS:
        raise bad_request(f"n must be 1 when using greedy sampling, got {req.n}.", "n")  # vLLM's rule
    if req.seed is not None and not -_INT64 <= req.seed < _INT64:
        raise bad_request("seed must fit in a signed 64-bit integer", "seed")


def completion_prompts(
    req: CompletionRequest, tokenizer: TextTokenizer, max_length: int | None = None
) -> list[tuple[int, ...]]:
    """The request's prompts as token ids (a completions request may carry several); text
    prompts encoded within ``max_length`` (``Truncation.encode_max_length``)."""
    _check_common(req)
    if req.echo and req.logprobs is not None:
        # vLLM answers it with the prompt's logprobs, which not every engine kind computes.
        raise bad_request("echo with logprobs (the prompt's logprobs) is not supported", "echo")
    if req.suffix:
        raise bad_request("suffix is not supported", "suffix")
    prompt = req.prompt
    if prompt is None or prompt == "" or prompt == []:
        raise bad_request("prompt must be a non-empty string, list of strings or list of token ids", "prompt")
    out = []
    for p in _prompt_list(req):
        if isinstance(p, str):
            ids = tuple(tokenizer.encode(p, add_special_tokens=req.add_special_tokens, max_length=max_length))
        else:
            ids = tuple(p)
        if not ids:
            raise bad_request("a prompt is empty", "prompt")
        if any(t >= tokenizer.vocab_size for t in ids):
            raise bad_request(f"prompt token ids must be < vocab size {tokenizer.vocab_size}", "prompt")
        out.append(ids)
    return out


def echo_texts(req: CompletionRequest | ChatCompletionRequest, tokenizer: TextTokenizer) -> tuple[str, ...]:
    """What ``echo`` prepends to each prompt's choices (empty tuple: no echo), as vLLM does.

    Completions: the prompt (a string prompt as sent, token ids decoded with special tokens; ""
    with ``return_token_ids``). Chat: the last message's content when its role is the response's
    (an open assistant turn continued), else ""."""
    if not req.echo:
        return ()
    if isinstance(req, ChatCompletionRequest):
        role = "assistant" if req.add_generation_prompt else req.messages[-1].get("role")
        last = _message_text(req.messages[-1])
        return (str(last["content"]) if last.get("role") == role else "",)
    if req.return_token_ids:
        return tuple("" for _ in _prompt_list(req))
    return tuple(p if isinstance(p, str) else tokenizer.decode(p, skip_special_tokens=False) for p in _prompt_list(req))


def _prompt_list(req: CompletionRequest) -> list[Any]:
    prompt = req.prompt
    if isinstance(prompt, str):
        return [prompt]
    if prompt and all(isinstance(p, int) for p in prompt):
        return [prompt]
    return list(prompt or [])


# Only these roles may send ``"content": null`` in vLLM's message types (others: its model's 400).
_NULL_CONTENT_ROLES = frozenset({"assistant", "function"})


def _message_text(message: Mapping[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if content is None and "content" in message and message.get("role") not in _NULL_CONTENT_ROLES:
        raise bad_request(f"the content of a {message.get('role')!r} message cannot be null", "messages")
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") not in ("text", "image"):
                raise bad_request("only text and image content parts are supported", "messages")
            texts.append(str(part.get("text", "")))
        if any(part.get("type") == "image" for part in content):
            # Images (chat_images.split_images left {"type": "image"} where each was): the parts go
            # to the template as a list, as vLLM hands an "openai"-format template its content.
            return {**message, "content": [dict(part) for part in content]}
        content = "\n".join(texts)
    elif content is None:
        content = ""
    elif not isinstance(content, str):
        raise bad_request("message content must be a string or a list of text parts", "messages")
    return {**message, "content": content}


def chat_prompt(
    req: ChatCompletionRequest, tokenizer: TextTokenizer, plan: ToolPlan | None = None, max_length: int | None = None
) -> tuple[int, ...]:
    """Render the conversation with the model's chat template and tokenize it; ``plan``: the
    request's tools and template kwargs (``tool_request.ChatTools.prepare``)."""
    _check_common(req)
    if req.tools and plan is None:
        raise bad_request("tools need the request's tool plan", "tools")  # the ingress always makes one
    if req.top_logprobs and not req.logprobs:
        raise bad_request("when using `top_logprobs`, `logprobs` must be set to true", "top_logprobs")
    return render_chat(
        req.messages,
        tokenizer,
        add_generation_prompt=req.add_generation_prompt,
        continue_final_message=req.continue_final_message,
        chat_template=req.chat_template,
        add_special_tokens=req.add_special_tokens,
        plan=plan,
        max_length=max_length,
    )


def render_chat(
    raw_messages: Sequence[Any],
    tokenizer: TextTokenizer,
    *,
    add_generation_prompt: bool,
    continue_final_message: bool,
    chat_template: str | None,
    add_special_tokens: bool,
    plan: ToolPlan | None = None,
    max_length: int | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> tuple[int, ...]:
    """The conversation's prompt ids (chat completions, ``/tokenize`` and the embeddings' chat
    form alike); ``plan``: a chat request's tools and template kwargs; ``chat_template_kwargs``:
    the template kwargs of a request without a plan (the embeddings' chat form)."""
    if not raw_messages:
        raise bad_request("messages must not be empty", "messages")
    for m in raw_messages:
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise bad_request("every message needs a string role", "messages")
    if continue_final_message and add_generation_prompt:
        # vLLM hands both to HF's apply_chat_template, which refuses them together (the
        # default add_generation_prompt=True included): clients send add_generation_prompt=false.
        raise bad_request(
            "continue_final_message and add_generation_prompt are not compatible. Use "
            "continue_final_message when you want the model to continue the final message, and "
            "add_generation_prompt when you want to add a header that will prompt it to start a new "
            "assistant message instead.",
            "continue_final_message",
        )
    template = chat_template or tokenizer.hf.chat_template
    messages = developer_as_system([_message_text(m) for m in raw_messages], template)
    tool_call_arguments_as_dicts(messages)
    # continue_final_message leaves the final turn open, as HF renders it.
    ids = tokenizer.apply_chat_template(
        messages,
        add_generation_prompt=add_generation_prompt,
        chat_template=chat_template,
        tools=plan.tool_dicts if plan is not None else None,
        chat_template_kwargs=plan.chat_template_kwargs if plan is not None else chat_template_kwargs,
        continue_final_message=continue_final_message,
        add_special_tokens=add_special_tokens,
        max_length=max_length,
    )
    if not ids:
        raise bad_request("the rendered prompt is empty", "messages")
    return tuple(ids)


def sampling_params(
    req: CompletionRequest | ChatCompletionRequest,
    num_prompt_tokens: int,
    max_model_len: int,
    tokenizer: TextTokenizer | None = None,
) -> SamplingParams:
    """The engine's sampling params; ``InvalidRequestError(field)`` for out-of-range values.
    ``tokenizer`` encodes ``bad_words`` (required when the request has any)."""
    param, requested = max_tokens_or_default(req)
    if isinstance(req, ChatCompletionRequest):
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
    else:
        logprobs = req.logprobs
    if echo_only(req):  # vLLM generates one token and shows only the prompt
        requested = 1
    max_tokens = fit_max_tokens(requested, param, num_prompt_tokens, max_model_len)
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
        prompt_logprobs=req.prompt_logprobs,
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
    base_id: str,
    prompts: Sequence[tuple[int, ...]],
    sampling: Sequence[SamplingParams],
    n: int,
    session_id: str | None,
    cache_salt: str | None = None,
) -> list[GenerateRequest]:
    """One engine request per (prompt, sample): choice index = prompt_index * n + sample_index,
    request id ``<base>-<choice index>``; with a seed, sample i samples with seed + i (what vLLM
    does for n > 1), so seeded choices differ and each is reproducible."""
    return [
        GenerateRequest(
            request_id=f"{base_id}-{p * n + i}",
            prompt_token_ids=ids,
            sampling=_with_seed_offset(sampling[p], i),
            session_id=session_id,
            cache_salt=cache_salt,
        )
        for p, ids in enumerate(prompts)
        for i in range(n)
    ]


def _with_seed_offset(sp: SamplingParams, index: int) -> SamplingParams:
    if sp.seed is None or index == 0:
        return sp
    return dataclasses.replace(sp, seed=sp.seed + index)
