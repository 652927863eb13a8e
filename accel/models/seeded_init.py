"""The tiny checkpoints' weights: a seeded, fixed-order re-init of a freshly built HF model.

Independent of transformers' own init code paths (which move between versions), so a tiny
checkpoint is the same bytes wherever it is built: every parameter, in sorted name order, drawn
from one generator seeded with the spec's seed and scaled by ``weight_std``; norm scales
(``is_norm_scale``) are 1.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def seeded_reinit(
    model: PreTrainedModel, seed: int, weight_std: float, is_norm_scale: Callable[[str], bool]
) -> PreTrainedModel:
    """Re-draw ``model``'s parameters in place and put it in eval mode; returns it."""
    import torch

    with torch.no_grad():
        gen = torch.Generator().manual_seed(seed)
        for name, param in sorted(model.named_parameters()):
            if is_norm_scale(name):
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=gen) * weight_std)
    model.eval()  # type: ignore[no-untyped-call]  # transformers leaves it unannotated
    return model
