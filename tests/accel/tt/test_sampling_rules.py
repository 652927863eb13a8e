"""The sampling rules the TT samplers share: §6 top-k normalization and the seeded row's seed."""

from __future__ import annotations

from accel.tt.sampling_rules import normalize_top_k, row_seed

VOCAB = 100


def test_normalize_top_k():
    assert [normalize_top_k(k, VOCAB) for k in (-1, 0, 1, 5, 99, 100, 500)] == [100, 100, 1, 5, 99, 100, 100]


def test_row_seed_depends_on_seed_and_position_and_fits_manual_seed():
    seeds = {row_seed(seed, pos) for seed in (-1, 0, 1, 2**40) for pos in (0, 1, 7)}
    assert len(seeds) == 12  # every (seed, position) its own stream; -1 is a seed like any other
    assert all(0 <= s < 2**63 for s in seeds)
    assert row_seed(3, 5) == row_seed(3, 5)
