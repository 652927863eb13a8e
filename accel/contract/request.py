"""What one generation asks for: ``GenerateRequest`` (token ids in, already tokenized) and its
optional prefill/decode hand-off, ``KVTransferParams``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from accel.contract.errors import InvalidRequestError, normalize_token_ids, require
from accel.contract.media import EncodedImage
from accel.contract.sampling import SamplingParams


@dataclass(frozen=True)
class KVTransferParams:
    """Prefill/decode disaggregation hand-off, named after vLLM's NIXL convention.

    A prefill request carries ``do_remote_decode=True`` (export the KV after prefill); the decode
    request carries ``do_remote_prefill=True`` and the ``transfer_id`` the prefill returned.

    ``connector_params``: the ``kv_transfer_params`` dict of an engine's OWN KV connector (e.g.
    tpu-inference's ``TPUConnector``: ``{uuid, remote_host, remote_port}``), handed to the engine
    and returned from it unchanged, never interpreted by meshserve; None = our own connector, which
    reads the fields above. JSON-like (vLLM returns it in HTTP bodies); copied on construction.
    """

    do_remote_decode: bool = False
    do_remote_prefill: bool = False
    transfer_id: str | None = None
    num_tokens: int = 0
    connector_params: Mapping[str, Any] | None = field(default=None, hash=False)

    def __post_init__(self) -> None:
        require(
            not (self.do_remote_decode and self.do_remote_prefill),
            "kv_transfer_params",
            "a request cannot both export and import KV",
        )
        require(
            not self.do_remote_prefill or bool(self.transfer_id),
            "kv_transfer_params",
            "do_remote_prefill needs a transfer_id",
        )
        if self.connector_params is not None:
            require(
                isinstance(self.connector_params, Mapping) and all(isinstance(k, str) for k in self.connector_params),
                "kv_transfer_params",
                "connector params must be a mapping with string keys",
            )
            try:
                json.dumps(dict(self.connector_params))
            except (TypeError, ValueError) as exc:
                raise InvalidRequestError("kv_transfer_params", f"connector params are not JSON-like: {exc}") from None
            object.__setattr__(self, "connector_params", dict(self.connector_params))


@dataclass(frozen=True)
class LoraAdapter:
    """A LoRA adapter a request runs with, as vLLM's ``LoRARequest`` names it: ``name`` (what the
    client sends as ``model``), ``int_id`` (> 0, unique per adapter within a replica) and ``path``
    (a PEFT folder on the replica's node: ``adapter_config.json`` + ``adapter_model.safetensors``)."""

    name: str
    int_id: int
    path: str

    def __post_init__(self) -> None:
        require(isinstance(self.name, str) and bool(self.name), "model", "an adapter needs a name")
        require(isinstance(self.int_id, int) and self.int_id > 0, "model", "an adapter's int_id must be > 0")


@dataclass(frozen=True)
class GenerateRequest:
    """One generation. ``prompt_token_ids`` are already tokenized (chat template applied)."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    session_id: str | None = None
    kv_transfer: KVTransferParams | None = None
    # vLLM's cache_salt: the prefix cache only shares blocks between requests with the same salt
    # (engines and router start the prompt's block-hash chain at accel.block_hash.salted_root).
    cache_salt: str | None = None
    # The LoRA adapter to run with (None: the base model). Engines that cannot run adapters refuse
    # a request carrying one, naming `model`.
    lora: LoraAdapter | None = None
    # A failover continuation's output so far: the tokens an earlier attempt already emitted, which
    # end ``prompt_token_ids``. An engine advances the request's logit constraint (structured-output
    # grammar, bad-word history) over them before its first sample, so the grammar resumes where the
    # stream stopped instead of restarting; an engine that cannot must refuse such a request.
    resumed_output_token_ids: tuple[int, ...] = ()
    # The request's images, in the order of their placeholders in the prompt (one image
    # placeholder token each, as the model's chat template renders an image part, before the
    # model's processor expands it). An engine whose model takes no images refuses them, naming
    # `images`.
    images: tuple[EncodedImage, ...] = ()

    def __post_init__(self) -> None:
        require(isinstance(self.request_id, str) and bool(self.request_id), "request_id", "must be a non-empty string")
        require(
            isinstance(self.images, tuple) and all(isinstance(i, EncodedImage) for i in self.images),
            "images",
            "must be a tuple of EncodedImage",
        )
        require(
            self.cache_salt is None or (isinstance(self.cache_salt, str) and bool(self.cache_salt)),
            "cache_salt",
            "must be a non-empty string",
        )
        ids = normalize_token_ids(self.prompt_token_ids, "prompt")
        require(len(ids) > 0, "prompt", "the prompt is empty")
        object.__setattr__(self, "prompt_token_ids", ids)
        resumed = normalize_token_ids(self.resumed_output_token_ids, "prompt")
        require(
            len(resumed) < len(ids) and ids[len(ids) - len(resumed) :] == resumed,
            "prompt",
            "resumed output tokens must end the prompt, after at least one prompt token",
        )
        object.__setattr__(self, "resumed_output_token_ids", resumed)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)
