"""The canonical KV transfer format: one prompt's KV, engine-neutral.

``KVPayload.kv`` is ``[num_layers, 2, num_tokens, num_kv_heads, head_dim]`` in the model dtype
(index 0 = K, 1 = V): per layer K and V as ``[tokens, kv_heads, head_dim]``, token ``t`` at
position ``t`` of the prompt. ``KVDescriptor`` says what it is and where it may go; every importer
calls ``check_compatible`` before copying a single byte.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from accel.block_hash import ROOT_HASH, BlockHash, hash_block, hash_prompt_blocks


class KVModelMismatchError(ValueError):
    """The payload was computed by another model (or shape/dtype) than the importer's."""


class KVIntegrityError(ValueError):
    """The payload does not belong to the prompt it is being imported for."""


@dataclass(frozen=True)
class KVDescriptor:
    """What a payload holds. ``block_hashes`` are the chained hashes (``accel.block_hash``) of the
    transferred tokens in blocks of ``block_size`` (the source engine's); when ``num_tokens`` is not
    a multiple of it the last hash covers the partial tail, so the hashes pin every token."""

    model_fingerprint: str
    dtype: str  # torch dtype name without the "torch." prefix, e.g. "float32"
    num_layers: int
    num_kv_heads: int
    head_dim: int
    num_tokens: int
    block_size: int
    block_hashes: tuple[BlockHash, ...]

    @staticmethod
    def for_prompt(
        model_fingerprint: str,
        dtype: torch.dtype,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        token_ids: Sequence[int],
        block_size: int,
    ) -> KVDescriptor:
        return KVDescriptor(
            model_fingerprint,
            dtype_name(dtype),
            num_layers,
            num_kv_heads,
            head_dim,
            len(token_ids),
            block_size,
            prompt_hashes(token_ids, block_size),
        )

    @property
    def torch_dtype(self) -> torch.dtype:
        dtype = getattr(torch, self.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"KV dtype {self.dtype!r} is not a torch dtype")
        return dtype

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        return (self.num_layers, 2, self.num_tokens, self.num_kv_heads, self.head_dim)

    @property
    def num_bytes(self) -> int:
        return math.prod(self.shape) * self.torch_dtype.itemsize

    def check_compatible(
        self, model_fingerprint: str, dtype: torch.dtype, num_layers: int, num_kv_heads: int, head_dim: int
    ) -> None:
        """Raise ``KVModelMismatchError`` unless an engine with these properties can use the KV."""
        if model_fingerprint != self.model_fingerprint:
            raise KVModelMismatchError(
                f"KV transfer refused: payload was computed by model {self.model_fingerprint}, "
                f"this engine serves model {model_fingerprint} (config or weights differ)"
            )
        theirs = (self.dtype, self.num_layers, self.num_kv_heads, self.head_dim)
        ours = (dtype_name(dtype), num_layers, num_kv_heads, head_dim)
        if theirs != ours:
            raise KVModelMismatchError(
                f"KV transfer refused: payload (dtype, layers, kv_heads, head_dim)={theirs}, engine expects {ours}"
            )

    def check_prompt(self, token_ids: Sequence[int]) -> None:
        """Raise ``KVIntegrityError`` unless the payload is the KV of ``token_ids[:num_tokens]``."""
        if len(token_ids) < self.num_tokens:
            raise KVIntegrityError(f"payload holds {self.num_tokens} tokens, the prompt has {len(token_ids)}")
        if prompt_hashes(token_ids[: self.num_tokens], self.block_size) != self.block_hashes:
            raise KVIntegrityError("payload block hashes do not match the prompt's tokens")


@dataclass(frozen=True)
class KVPayload:
    descriptor: KVDescriptor
    kv: torch.Tensor  # [num_layers, 2, num_tokens, num_kv_heads, head_dim], descriptor.dtype

    def __post_init__(self) -> None:
        if tuple(self.kv.shape) != self.descriptor.shape or self.kv.dtype != self.descriptor.torch_dtype:
            raise ValueError(
                f"payload tensor {tuple(self.kv.shape)} {self.kv.dtype} does not match "
                f"descriptor {self.descriptor.shape} {self.descriptor.dtype}"
            )

    def to_wire(self) -> np.ndarray:
        """A numpy view of the same bytes (Ray's object store moves numpy arrays without pickling
        their data). dtypes numpy lacks (bfloat16) travel as same-width integers."""
        return tensor_to_wire(self.kv)

    @staticmethod
    def from_wire(descriptor: KVDescriptor, array: np.ndarray) -> KVPayload:
        """Inverse of ``to_wire``; zero-copy (the tensor may be read-only shared memory)."""
        return KVPayload(descriptor, tensor_from_wire(array, descriptor.torch_dtype).view(descriptor.shape))

    def head(self, num_tokens: int) -> KVPayload:
        """The payload of the first ``num_tokens`` tokens (a view)."""
        d = self.descriptor
        hashes = d.block_hashes[: num_tokens // d.block_size]
        if num_tokens % d.block_size:
            raise ValueError("head() takes whole source blocks")
        head_desc = KVDescriptor(
            d.model_fingerprint, d.dtype, d.num_layers, d.num_kv_heads, d.head_dim, num_tokens, d.block_size, hashes
        )
        return KVPayload(head_desc, self.kv[:, :, :num_tokens])


def prompt_hashes(token_ids: Sequence[int], block_size: int) -> tuple[BlockHash, ...]:
    hashes = hash_prompt_blocks(token_ids, block_size)
    tail = token_ids[len(hashes) * block_size :]
    if len(tail):
        hashes.append(hash_block(hashes[-1] if hashes else ROOT_HASH, tail))
    return tuple(hashes)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


_NUMPY_STAND_INS = {torch.bfloat16: torch.int16, torch.float8_e4m3fn: torch.uint8, torch.float8_e5m2: torch.uint8}


def tensor_to_wire(tensor: torch.Tensor) -> np.ndarray:
    tensor = tensor.contiguous()
    stand_in = _NUMPY_STAND_INS.get(tensor.dtype)
    return (tensor.view(stand_in) if stand_in else tensor).numpy()


def tensor_from_wire(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "array is not writable": we only read it
        tensor = torch.from_numpy(array)
    return tensor if tensor.dtype == dtype else tensor.view(dtype)
