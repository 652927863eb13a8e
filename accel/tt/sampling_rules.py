"""Sampling rules every TT sampler shares (the host sampler, the runner's device arguments and
the torch mesh program's sampler), so host and device paths agree on them.

- ``normalize_top_k``: the §6 rule, ``top_k <= 0`` or ``>= vocab`` means the whole vocabulary.
- ``row_seed``: the seed of a seeded row's generator, from ``(seed, position of the sampled
  token)``, so a seeded request reproduces whatever else shares its batches.
"""

from __future__ import annotations

_SEED_MIX = 0x9E3779B97F4A7C15  # golden-ratio constant: spreads (seed, position) over the seed space


def normalize_top_k(top_k: int, vocab_size: int) -> int:
    return vocab_size if top_k <= 0 or top_k >= vocab_size else top_k


def row_seed(seed: int, position: int) -> int:
    """The ``manual_seed`` of a seeded row's generator (any int seed, including negative ones)."""
    return (seed * _SEED_MIX + position) % (2**63)
