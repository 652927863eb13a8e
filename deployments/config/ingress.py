"""The HTTP edge's settings (``ingress:`` in the YAML)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from accel.contract import ConfigError

# The engine contract's own bound on n, as vLLM's default (conversion refuses n < 1, limits.check_n above max_n).
MAX_N = 128
# Characters one prompt token stands for at most, for the character cap before tokenizing: a text
# longer than max_model_len x this cannot fit the context with any tokenizer we serve (a token of a
# BPE vocabulary is far shorter), so it is refused before the tokenizer spends time on it.
MAX_CHARS_PER_TOKEN = 32
HandleTransport = Literal["grpc", "actor"]
HANDLE_TRANSPORTS: tuple[HandleTransport, ...] = get_args(HandleTransport)


@dataclass(frozen=True)
class IngressConfig:
    replicas: int = 1
    num_cpus: float = 0.0
    # Engine requests one ingress replica holds at once (a request with p prompts and n choices
    # holds p x n); past it new ones get 429 + Retry-After.
    max_concurrent_requests: int = 256
    retry_after_s: int = 1  # the Retry-After of a 429 / 503
    # Serve's per-request access log line of the ingress (the engines and router never log one).
    access_log: bool = True
    # Bearer keys /v1/*, /tokenize and /detokenize require (vLLM's --api-key); empty = open.
    # The loader falls back to MESHSERVE_API_KEY (vLLM's VLLM_API_KEY) when the list is empty.
    api_keys: tuple[str, ...] = ()
    # Largest request body; a bigger one is a 413 before the rest of it is read.
    max_request_bytes: int = 8 * 1024 * 1024
    # Characters of prompt text (all prompts / messages of a request) before tokenizing;
    # None = the served model's max_model_len x MAX_CHARS_PER_TOKEN.
    max_prompt_chars: int | None = None
    # Largest max_tokens a client may ask for (and the default when it asks for none); None = the
    # model's context room only.
    max_tokens_cap: int | None = None
    max_n: int = MAX_N  # largest n (choices per prompt)
    # Render a chat_template sent by the client (vLLM's --trust-request-chat-template).
    trust_request_chat_template: bool = False
    # Times one streaming engine request may move to another replica after its replica died.
    max_failovers: int = 1
    # How the ingress reaches the router and the engine replicas over their Serve handles:
    # "grpc" = Serve's by-value path (``_by_reference=False``: each call and its token stream go over
    # the replica's own gRPC server), "actor" = Ray actor calls, each streamed item an object ref.
    # grpc spends less CPU per request and per streamed message on both sides (bench/router_peers
    # --agentic: ingress 3.0-4.8 CPU-s against 5.4-7.2 for the same replay), which a small host's
    # engines get back as throughput.
    handle_transport: HandleTransport = "grpc"

    def __post_init__(self) -> None:
        for name in ("replicas", "max_concurrent_requests", "max_request_bytes", "max_n"):
            if getattr(self, name) < 1:
                raise ConfigError(f"ingress.{name}: must be >= 1, got {getattr(self, name)}")
        if self.max_n > MAX_N:
            raise ConfigError(f"ingress.max_n: must be <= {MAX_N}, got {self.max_n}")
        for name in ("max_prompt_chars", "max_tokens_cap"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"ingress.{name}: must be >= 1, got {value}")
        if self.max_failovers < 0:
            raise ConfigError(f"ingress.max_failovers: must be >= 0, got {self.max_failovers}")
        if self.handle_transport not in HANDLE_TRANSPORTS:
            raise ConfigError(f"ingress.handle_transport: one of {HANDLE_TRANSPORTS}, got {self.handle_transport!r}")
        if any(not k for k in self.api_keys):
            raise ConfigError("ingress.api_keys: keys must be non-empty strings")

    def prompt_char_cap(self, max_model_len: int) -> int:
        return self.max_prompt_chars if self.max_prompt_chars is not None else max_model_len * MAX_CHARS_PER_TOKEN
