"""The prefix-vs-load rule that picks a KV cache domain: a replica for the router, a lane inside
a TT replica for its lane coordinator. One rule for both, so the router's choice of a replica
(made on that replica's best lane match) is the choice the replica's lanes then make again.

Per decision, over the candidates (each with a load score and the number of leading prompt
blocks its cache holds):
1. Window: a candidate is acceptable iff ``score <= min_score + max(window_abs, window_rel *
   min_score)``; outside it the candidate is *overloaded* and never chosen. This is the imbalance
   fallback that keeps affinity (routing-and-pd.md §10 pitfall 2): among the acceptable the best
   prefix still wins.
2. Cost over the acceptable: ``w_prefill * uncached_prompt_blocks + w_load_blocks * score``
   (Dynamo-like); the cheapest wins. A cold miss (nothing cached anywhere) has equal prefill
   everywhere, so it goes by load (pitfall 3: never by "smallest cache").

Load score, in requests: ``in_flight + w_queue * waiting + w_kv_usage * kv_usage`` (the router
counts in-flight itself and reads waiting / KV usage from fresh engine stats; a lane reads them
from its own queues and block allocator).

Pure logic: no torch, no Ray. Ties are the caller's (the router spreads them by rendezvous
hashing, lanes take the lowest index).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

K = TypeVar("K")


@dataclass(frozen=True)
class AffinityWeights:
    """The rule's weights; defaults chosen on ``bench/router_sim.py`` (router) and shared by the
    TT lanes (``deployments.config.router.CostWeights`` is this plus config validation)."""

    w_prefill: float = 1.0  # per uncached prompt block
    w_load_blocks: float = 4.0  # blocks of prefill one unit of load score is worth
    w_queue: float = 1.0  # load score per waiting request
    w_kv_usage: float = 4.0  # load score at 100% KV usage
    window_abs: float = 8.0  # acceptable load-score excess over the least-loaded candidate ...
    window_rel: float = 0.25  # ... or this fraction of the least-loaded score, whichever is larger


def load_score(num_in_flight: float, num_waiting: float, kv_usage: float, weights: AffinityWeights) -> float:
    """A candidate's load in requests (``num_in_flight`` includes the waiting ones)."""
    return num_in_flight + weights.w_queue * num_waiting + weights.w_kv_usage * kv_usage


def load_limit(min_score: float, weights: AffinityWeights) -> float:
    """Scores up to this are acceptable (not overloaded)."""
    return min_score + max(weights.window_abs, weights.window_rel * min_score)


def cheapest(
    candidates: Sequence[K],
    scores: Callable[[K], float],
    matched_blocks: Callable[[K], float],
    limit: float,
    weights: AffinityWeights,
    expected_scores: Callable[[K], float] | None = None,
) -> list[K]:
    """The acceptable candidates (``scores(c) <= limit``) of least cost, in ``candidates`` order;
    empty when none is acceptable. The ``w_prefill * num_prompt_blocks`` term of the cost is the
    same for every candidate, so only ``w_load * score - w_prefill * matched`` is compared.
    ``expected_scores``: the load the cost counts instead of ``scores`` (the window still judges
    the present load): the router adds the sessions bound to a replica when it places a new one."""
    w_prefill, w_load = weights.w_prefill, weights.w_load_blocks
    best: list[K] = []
    best_cost = 0.0
    for c in candidates:
        score = scores(c)
        if score > limit:
            continue
        if expected_scores is not None:
            score = expected_scores(c)
        cost = w_load * score - w_prefill * matched_blocks(c)
        if not best or cost < best_cost:
            best, best_cost = [c], cost
        elif cost == best_cost:
            best.append(c)
    return best
