"""Single-signal policies: ``round_robin``, ``least_loaded``, ``prefix`` and ``session``.

They exist as configurable choices and as baselines for the simulator; the default
``prefix+session+load`` lives in ``cost_policy.py``.
"""

from __future__ import annotations

from deployments.config.router import CostWeights

from .policy import Choice, RoutingContext, RoutingPolicy, load_view, tie_rank, without


class RoundRobinPolicy(RoutingPolicy):
    """Candidates in turn, ignoring cache and load."""

    name = "round_robin"

    def __init__(self, weights: CostWeights) -> None:
        super().__init__(weights)
        self._counter = 0

    def choose(self, ctx: RoutingContext) -> Choice:
        replica_id = ctx.candidates[self._counter % len(ctx.candidates)]
        self._counter += 1
        return Choice(replica_id, "round_robin")


class LeastLoadedPolicy(RoutingPolicy):
    """Lowest load score (in-flight, plus queue and KV usage when fresh)."""

    name = "least_loaded"

    def choose(self, ctx: RoutingContext) -> Choice:
        return Choice(self.least_loaded(ctx, load_view(ctx, self.weights)), "load")


class PrefixPolicy(RoutingPolicy):
    """Longest cached prefix, load-blind (ties: fewer in flight); no match: least loaded."""

    name = "prefix"

    def choose(self, ctx: RoutingContext) -> Choice:
        if not ctx.matched_blocks:
            return Choice(self.least_loaded(ctx, load_view(ctx, self.weights)), "load")
        hashes, key, in_flight = ctx.replica_hashes, ctx.tie_key, ctx.in_flight
        best = min(
            ctx.matched_blocks.items(), key=lambda item: (-item[1], in_flight[item[0]], tie_rank(key, hashes[item[0]]))
        )
        return Choice(best[0], "prefix")


class SessionPolicy(RoutingPolicy):
    """The session's replica unless it is overloaded or the session is at its cap; otherwise,
    and for requests without a session, least loaded."""

    name = "session"

    def choose(self, ctx: RoutingContext) -> Choice:
        view = load_view(ctx, self.weights)
        bound = ctx.session_replica
        if bound is not None:
            is_overloaded = not view.is_acceptable(bound)
            if ctx.can_stick and not is_overloaded:
                return Choice(bound, "session")
            reason = "overloaded" if is_overloaded else "spill"
            others = without(ctx.candidates, bound)
            return Choice(self.least_loaded(ctx, view, others), reason, rebind_session=is_overloaded)
        return Choice(self.least_loaded(ctx, view), "load")
