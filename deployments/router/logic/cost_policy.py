"""The default policy, ``prefix+session+load``: session stickiness, then a prefill-vs-load cost.

Per decision, over one pool:
1. Load view: each candidate's load score (in-flight, plus engine queue and KV usage when fresh)
   and the acceptable window ``score <= min_score + max(window_abs, window_rel * min_score)``.
2. Session: a bound replica inside the window, with the session under its in-flight cap, wins
   while it holds at least as much of the prompt as any candidate (credited blocks). Stickiness
   stands in for the session's cache; when the index says another replica holds more (the bound
   engine evicted the history under KV pressure, or never held it), staying would recompute
   blocks that are cached elsewhere and evict other sessions' blocks to make room, so the session
   *yields*: the request goes by the cost rule (3), and the binding follows it where it lands.
   Outside the window the session spills and moves (``rebind_session``). At the cap the request
   goes by the cost rule (3) with the bound replica among the candidates, and the binding stays:
   it leaves only where that is cheaper. A burst of siblings (an agent's fan-out: sub-requests
   over the session's whole history, sent together) is the common case: the bound replica holds
   that history (or, in precise mode, the first sibling's speculative entries), and a copy on
   another replica recomputes all of it and evicts other sessions' blocks there under KV
   pressure (issue 42's ``agentic`` trace); with little prefix at stake the load term moves it.
3. Cost (Dynamo-like; ``accel.cache_affinity.cheapest``), over the candidates inside the window only:
   ``cost = w_prefill * uncached_prompt_blocks + w_load_blocks * load_score``.
   The window is the imbalance fallback that keeps affinity: an overloaded replica is never
   chosen, yet among acceptable replicas the best prefix match still wins unless its extra load
   costs more than the prefill it saves. A cold miss (no replica holds any block) has equal
   prefill everywhere, so it goes by load — never by "smallest tree" — with ties spread by
   rendezvous hashing of the prompt's first block.
4. A new session (a session key bound nowhere yet) is placed for its whole life, not for one
   request: its later turns follow the binding while the replica stays in the window. So its
   cost also counts, as load, ``w_session`` per session active on each candidate (bound there
   and used within ``sessions.active_s``). Without it, at light load a popular system prompt's
   cached blocks outweigh the one or two requests in flight, every session on that prompt binds
   to one replica, and the window (in requests) never sees the skew: max/mean load 1.4-1.5 on
   ``router_peers``' ``kv_pressure`` trace. Copying the system prompt to another replica costs
   its prefill once while the KV cache has room; once the pool's KV is nearly full of running
   requests (mean fresh usage >= ``session_max_kv_usage``) a copy costs capacity that evicts
   some session's history instead, so the term is off there and sessions gather by prefix.
5. Queued prefill: the prompt blocks the requests in flight on a candidate still compute there
   (``RoutingContext.queued_prefill_blocks``) delay a new request's first token as its own
   uncached blocks would, where a count of requests cannot tell a 40-block prefill from a
   1-block one; the cost counts ``w_queued_prefill`` of load per such block (in the cost only,
   like step 4: the window stays in requests).
"""

from __future__ import annotations

from collections.abc import Callable

from accel.cache_affinity import cheapest

from .policy import Choice, LoadView, RoutingContext, RoutingPolicy, load_view, tie_rank


class PrefixSessionLoadPolicy(RoutingPolicy):
    name = "prefix+session+load"

    def choose(self, ctx: RoutingContext) -> Choice:
        weights = self.weights
        view = load_view(ctx, weights)
        bound = ctx.session_replica
        is_overloaded = yields = False
        if bound is not None:
            is_overloaded = not view.is_acceptable(bound)
            if ctx.can_stick and not is_overloaded:
                if self._holds_most(ctx, view, bound):
                    return Choice(bound, "session")
                yields = True
        # At the cap the bound replica stays a candidate (the docstring's step 2); when it is
        # overloaded the window excludes it anyway.

        # The shared rule (``accel.cache_affinity``): the TT lanes of the chosen replica apply it
        # again over their own caches, so the replica's best lane is where the request lands.
        matched_get, scores, limit = ctx.matched_blocks.get, view.scores, view.limit
        tied = cheapest(
            ctx.candidates, scores.__getitem__, lambda r: matched_get(r, 0), limit, weights, self._expected(ctx, scores)
        )
        # (Never empty: the least-loaded candidate is always inside the window.)
        hashes, key = ctx.replica_hashes, ctx.tie_key
        best_id = tied[0] if len(tied) == 1 else min(tied, key=lambda r: tie_rank(key, hashes[r]))

        if bound is not None:
            if is_overloaded:
                reason = "overloaded"
            elif yields:  # (it may stay: the bound replica can still be the cheapest)
                reason = "yield" if best_id != bound else "session"
            else:
                reason = "sibling" if best_id == bound else "spill"
        else:
            reason = "prefix" if matched_get(best_id, 0) > 0 else "load"
        return Choice(best_id, reason, rebind_session=is_overloaded or (yields and best_id != bound))

    @staticmethod
    def _holds_most(ctx: RoutingContext, view: LoadView, bound: str) -> bool:
        """The bound replica holds at least as many (credited) prompt blocks as any candidate
        inside the load window (an overloaded one could not take the request anyway)."""
        matched = ctx.matched_blocks
        best = max((n for r, n in matched.items() if view.is_acceptable(r)), default=0)
        return matched.get(bound, 0) >= best

    def _expected(self, ctx: RoutingContext, scores: dict[str, float]) -> Callable[[str], float] | None:
        """The load the cost counts, beyond the present scores (None: the scores as they are):
        the sessions active on each replica when a new one is placed (step 4), and the prompt
        blocks queued for prefill there (step 5)."""
        weights = self.weights
        active = ctx.active_sessions if ctx.new_session and weights.w_session and self._kv_has_room(ctx) else None
        queued = ctx.queued_prefill_blocks if weights.w_queued_prefill else None
        if not active and not queued:
            return None
        w_session, w_queued = weights.w_session, weights.w_queued_prefill
        active_get = (active or {}).get
        queued_get = (queued or {}).get
        return lambda r: scores[r] + w_session * active_get(r, 0) + w_queued * queued_get(r, 0)

    def _kv_has_room(self, ctx: RoutingContext) -> bool:
        """The candidates' mean KV usage (fresh stats only; none fresh: room) is below
        ``session_max_kv_usage``."""
        stats = ctx.fresh_stats
        usages = [stats[r][1] for r in ctx.candidates if r in stats]
        return not usages or sum(usages) / len(usages) < self.weights.session_max_kv_usage
