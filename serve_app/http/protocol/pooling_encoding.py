"""How the pooling endpoints encode their vectors, as vLLM 0.32 does
(``vllm/entrypoints/pooling/utils.py``, ``vllm/utils/serial_utils.py``): ``float`` (a JSON list),
``base64`` (the bytes of the vector in ``embed_dtype`` and ``endianness``), and the binary
bodies ``bytes`` (every vector's bytes back to back, described by a ``metadata`` header: id,
created, model, each vector's dtype, endianness, byte range and shape, usage) and
``bytes_only`` (the bytes without the header). The bytes are vLLM's own ``tensor2binary``, so
every ``embed_dtype`` vLLM has (``float32``, ``float16``, ``bfloat16``, ``fp8_e4m3``,
``fp8_e5m2``) encodes exactly as there.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass

from accel.contract import EmbeddingResult

JSON_FORMATS = ("float", "base64")
BYTES_FORMATS = ("bytes", "bytes_only")
MEDIA_TYPE = "application/octet-stream"


@dataclass(frozen=True)
class BinaryBody:
    """A ``bytes`` / ``bytes_only`` answer: the body and its headers (vLLM's
    ``build_pooling_bytes_streaming_response``)."""

    content: bytes
    headers: dict[str, str] | None
    media_type: str = MEDIA_TYPE


def embed_dtypes() -> tuple[str, ...]:
    """The ``embed_dtype`` values vLLM accepts (its ``EMBED_DTYPES``)."""
    from vllm.utils.serial_utils import EMBED_DTYPES  # deferred: vLLM only when a pooling body is parsed

    return tuple(EMBED_DTYPES)


def vector_bytes(values: Sequence[float], embed_dtype: str, endianness: str) -> bytes:
    """One vector's bytes, as vLLM's ``tensor2binary`` writes a float32 pooler output."""
    import torch
    from vllm.utils.serial_utils import tensor2binary  # deferred: as above

    tensor = torch.tensor(list(values), dtype=torch.float32)
    return tensor2binary(tensor, embed_dtype, endianness)  # type: ignore[arg-type]


def encode_vector(
    values: Sequence[float], encoding_format: str, embed_dtype: str, endianness: str
) -> list[float] | str:
    """One vector in a JSON body: its floats, or base64 of its bytes."""
    if encoding_format == "float":
        return list(values)
    return base64.b64encode(vector_bytes(values, embed_dtype, endianness)).decode("utf-8")


def binary_body(
    response_id: str,
    created: int,
    model: str,
    results: Sequence[EmbeddingResult],
    encoding_format: str,
    embed_dtype: str,
    endianness: str,
) -> BinaryBody:
    """vLLM's ``bytes`` / ``bytes_only`` answer for ``results`` (in order)."""
    chunks, items, offset = [], [], 0
    for i, result in enumerate(results):
        chunk = vector_bytes(result.embedding, embed_dtype, endianness)
        items.append(
            {
                "index": i,
                "embed_dtype": embed_dtype,
                "endianness": endianness,
                "start": offset,
                "end": offset + len(chunk),
                "shape": [len(result.embedding)],
            }
        )
        chunks.append(chunk)
        offset += len(chunk)
    num_tokens = sum(r.num_prompt_tokens for r in results)
    usage = {"prompt_tokens": num_tokens, "total_tokens": num_tokens}
    metadata = {"id": response_id, "created": created, "model": model, "data": items, "usage": usage}
    headers = None if encoding_format == "bytes_only" else {"metadata": json.dumps(metadata)}
    return BinaryBody(b"".join(chunks), headers)
