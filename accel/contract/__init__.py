"""The engine contract: what every engine and deployment speaks.

A deployment hands an engine a ``GenerateRequest`` and reads back a stream of ``OutputDelta``s;
``EngineStats`` is the engine's load and cache snapshot. Both engine kinds (the TT mesh engine and
the vLLM slice engine) implement ``Engine``, so deployments treat them alike.

Every type here is a frozen dataclass validated on construction: an invalid value raises
``InvalidRequestError`` naming the offending field, which the HTTP edge turns into a 400.

One module per concept: ``errors``, ``sampling`` (``SamplingParams``), ``request``
(``GenerateRequest``, ``KVTransferParams``), ``output`` (``OutputDelta`` and its parts),
``pooling`` (``EmbedRequest``, ``EmbeddingResult``), ``media`` (``EncodedImage``), ``stats``
(``EngineStats``, ``TTEngineStats``), ``structured_output`` (``StructuredOutputSpec``), ``engine``
(the ``Engine`` protocol, ``PrefixCacheChange``). Import them from here.
"""

from accel.contract.engine import Engine, PrefixCacheChange
from accel.contract.errors import ConfigError, InvalidRequestError
from accel.contract.media import EncodedImage
from accel.contract.output import FinishReason, OutputDelta, TokenLogprob, join_token_ids
from accel.contract.pooling import EmbeddingResult, EmbedRequest
from accel.contract.request import GenerateRequest, KVTransferParams, LoraAdapter
from accel.contract.sampling import SamplingParams
from accel.contract.stats import EngineStats, TTEngineStats
from accel.contract.structured_output import StructuredOutputKind, StructuredOutputSpec

__all__ = [
    "ConfigError",
    "EmbedRequest",
    "EmbeddingResult",
    "EncodedImage",
    "Engine",
    "EngineStats",
    "FinishReason",
    "GenerateRequest",
    "InvalidRequestError",
    "KVTransferParams",
    "LoraAdapter",
    "OutputDelta",
    "PrefixCacheChange",
    "SamplingParams",
    "StructuredOutputKind",
    "StructuredOutputSpec",
    "TTEngineStats",
    "TokenLogprob",
    "join_token_ids",
]
