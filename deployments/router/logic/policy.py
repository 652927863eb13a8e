"""Routing policies: the small abstract base every policy implements, and what they share.

A policy sees one ``RoutingContext`` (the candidate replicas of one pool with their prefix
matches, loads and the session binding) and returns a ``Choice``. It holds no state about
replicas, so ``RouterLogic`` owns all bookkeeping; the only policy state is round-robin's counter.

Load score (``accel.cache_affinity.load_score``), in requests: ``in_flight + foreign_in_flight +
w_queue * waiting + w_kv_usage * kv_usage``, the last two only from fresh stats (foreign = other
router replicas'); the acceptable window is ``accel.cache_affinity.load_limit``.
In-flight is always present (tracked locally), so the score never freezes when stats are stale or
missing.

The policies by config name live in ``policies`` (the registry imports the implementations,
which import this module: one direction, no cycle).

Ties are broken deterministically by rendezvous hashing of (request tie key, replica): equal
candidates spread over replicas by the prompt's first block (or the session key), yet every router
process given the same state picks the same replica.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from accel.cache_affinity import load_limit
from deployments.config.router import CostWeights

_MASK64 = (1 << 64) - 1
_GOLDEN64 = 0x9E3779B97F4A7C15


def tie_rank(tie_key: int, replica_hash: int) -> int:
    """Rendezvous rank of a replica for a request: smaller wins among equal candidates."""
    x = ((tie_key ^ replica_hash) * _GOLDEN64) & _MASK64
    return x ^ (x >> 29)


@dataclass(frozen=True)
class RoutingContext:
    """Everything a policy may look at for one decision over one pool."""

    candidates: tuple[str, ...]  # replica ids of the pool, sorted, non-empty
    num_prompt_blocks: int  # full blocks of the prompt
    # replica -> leading prompt blocks cached, in device blocks (a block held only on a slower
    # tier counts its tier's credit; an adapter already loaded adds some); absent = 0
    matched_blocks: Mapping[str, float]
    in_flight: Mapping[str, int]  # replica -> requests in flight
    fresh_stats: Mapping[str, tuple[int, float]]  # replica -> (num_waiting, kv_usage), fresh only
    replica_hashes: Mapping[str, int]  # replica -> stable 64-bit hash (tie-breaks)
    tie_key: int  # stable 64-bit key of the request (first block hash or session key)
    session_replica: str | None = None  # bound replica when it is among the candidates
    can_stick: bool = True  # the session is under its in-flight cap
    # replica -> requests other router replicas have in flight there (fresh stats only; absent = 0)
    foreign_in_flight: Mapping[str, int] = field(default_factory=dict)
    # replica -> sessions bound there and used within sessions.active_s (absent = 0); filled only
    # when placing a new session
    active_sessions: Mapping[str, int] = field(default_factory=dict)
    new_session: bool = False  # the request carries a session key that is bound nowhere yet
    # replica -> prompt blocks its requests in flight compute there (``load.LoadTracker``; absent = 0)
    queued_prefill_blocks: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Choice:
    replica_id: str
    # "session", "prefix", "load", "round_robin", "spill", "overloaded", "sibling" (at the
    # session's cap, yet the bound replica was the cheapest), "yield" (another replica held more
    # of the session's prompt than its bound one: chosen by cost)
    reason: str
    # bind the session here now: its replica was overloaded, or it yielded and landed elsewhere
    rebind_session: bool = False


@dataclass
class LoadView:
    """Load scores of a context's candidates, and the acceptable window."""

    scores: dict[str, float] = field(default_factory=dict)
    min_score: float = 0.0
    limit: float = 0.0  # scores <= limit are acceptable

    def is_acceptable(self, replica_id: str) -> bool:
        return self.scores[replica_id] <= self.limit


def load_view(ctx: RoutingContext, weights: CostWeights) -> LoadView:
    in_flight, stats = ctx.in_flight, ctx.fresh_stats
    scores = {replica_id: float(in_flight[replica_id]) for replica_id in ctx.candidates}
    for replica_id, num_foreign in ctx.foreign_in_flight.items():
        if replica_id in scores:
            scores[replica_id] += num_foreign
    if stats:
        w_queue, w_kv = weights.w_queue, weights.w_kv_usage
        for replica_id, (num_waiting, kv_usage) in stats.items():
            if replica_id in scores:
                scores[replica_id] += w_queue * num_waiting + w_kv * kv_usage
    min_score = min(scores.values())
    return LoadView(scores, min_score, load_limit(min_score, weights))


class RoutingPolicy(ABC):
    """Picks one replica of ``ctx.candidates``. Must be deterministic given the context (and,
    for round-robin, its own counter)."""

    name: ClassVar[str]

    def __init__(self, weights: CostWeights) -> None:
        self.weights = weights

    @abstractmethod
    def choose(self, ctx: RoutingContext) -> Choice: ...

    def least_loaded(self, ctx: RoutingContext, view: LoadView, among: tuple[str, ...] | None = None) -> str:
        hashes, key = ctx.replica_hashes, ctx.tie_key
        return min(among or ctx.candidates, key=lambda r: (view.scores[r], tie_rank(key, hashes[r])))


def without(candidates: tuple[str, ...], replica_id: str) -> tuple[str, ...]:
    """``candidates`` minus one replica, or all of them when it is the only one (a spill needs
    somewhere to go; with one replica it queues where it is)."""
    others = tuple(r for r in candidates if r != replica_id)
    return others or candidates
