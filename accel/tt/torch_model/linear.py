"""The torch mesh program's linear layers: ``y = x @ W.T (+ b)``, on CPU with a oneDNN-packed weight.

Why packed: this CPU build's ``aten::mm`` sends fp32 GEMMs to a BLAS whose small-M kernels ran at
under half of oneDNN's speed here (1 thread, tiny-llama shapes: the 256 -> 1536 gate/up at M = 32,
decode, 279 vs 130 us; at M = 4096, a 32 x 128 prefill, 33 vs 14 ms), and GEMMs were 58 % of a
decode step. A weight reordered once into oneDNN's blocked layout and multiplied by
``mkldnn._linear_pointwise`` is what torch's own inductor emits for frozen CPU linears
(``mkldnn._reorder_linear_weight``) and the same library vLLM's CPU backend calls
(``create_onednn_mm``), here without a compile step. Elsewhere (CUDA, a torch without oneDNN) the
layer is a plain ``F.linear`` over the input-major dense weight.

Invariant: exactly one of ``weight`` / ``packed`` is set. The packed copy replaces the dense one
(no doubled weight memory); ``dense()`` recovers its values exactly (identity x W: one nonzero
product per output element).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

# Dtypes oneDNN's packed inner product takes on CPU.
_PACKABLE_DTYPES = (torch.float32, torch.bfloat16)


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    """True where the packed oneDNN path exists: a CPU tensor of a packable dtype, torch built with
    oneDNN and not told to avoid it (``torch.backends.mkldnn.enabled``)."""
    return (
        device.type == "cpu"
        and dtype in _PACKABLE_DTYPES
        and bool(torch.backends.mkldnn.is_available())  # type: ignore[no-untyped-call]
        and bool(torch.backends.mkldnn.enabled)
    )


@dataclass(frozen=True)
class Linear:
    out_features: int
    in_features: int
    weight: torch.Tensor | None  # [out, in], stored input-major (see ``as_matmul_weight``); None when packed
    packed: torch.Tensor | None  # opaque oneDNN tensor holding the same [out, in] values
    bias: torch.Tensor | None  # [out]

    @staticmethod
    def build(weight: torch.Tensor, bias: torch.Tensor | None = None, *, pack: bool) -> Linear:
        """``weight`` ``[out, in]`` (HF's shape). ``pack``: reorder it for oneDNN (needs
        ``can_pack``); a packing failure falls back to the dense layer, logged."""
        out_features, in_features = weight.shape
        if pack:
            try:
                # No batch-size hint: one packing serves decode (M = slots) and prefill (M = tokens);
                # a hint of 32 or 128 measured the same at M = 1..4096.
                packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), None)
                return Linear(out_features, in_features, None, packed, bias)
            except RuntimeError as e:  # an ISA or build oneDNN refuses: the dense GEMM still works
                logger.warning("oneDNN weight packing failed (%s); using F.linear", e)
        return Linear(out_features, in_features, as_matmul_weight(weight), None, bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``[..., in]`` -> ``[..., out]``."""
        if self.packed is not None:
            y: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
            return y
        assert self.weight is not None  # invariant: one of the two is set
        return F.linear(x, self.weight, self.bias)

    def dense(self) -> torch.Tensor:
        """The ``[out, in]`` weight values (for checks; a full GEMM when packed)."""
        if self.weight is not None:
            return self.weight
        assert self.packed is not None  # invariant: one of the two is set
        eye = torch.eye(self.in_features, dtype=self.packed.dtype)
        values: torch.Tensor = torch.ops.mkldnn._linear_pointwise(eye, self.packed, None, "none", [], "")
        return values.t()


def as_matmul_weight(w: torch.Tensor) -> torch.Tensor:
    """``w`` ``[out, in]`` with the same values, stored input-major (``w.t()`` is contiguous
    ``[in, out]``): ``F.linear`` then runs a plain ``x @ W`` GEMM, ~25% faster on CPU for the
    skinny decode batches than the transposed-B GEMM a row-major ``[out, in]`` weight gets."""
    return w.t().contiguous().t()
