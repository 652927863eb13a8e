"""Builds RoutingContexts by hand for policy tests."""

from __future__ import annotations

from deployments.messages.routing import stable_hash64
from deployments.router.logic.policy import RoutingContext


def context(
    in_flight: dict[str, int],
    matched: dict[str, int] | None = None,
    *,
    num_blocks: int = 100,
    stats: dict[str, tuple[int, float]] | None = None,
    session: str | None = None,
    can_stick: bool = True,
    tie_key: int = 7,
    foreign: dict[str, int] | None = None,
    active_sessions: dict[str, int] | None = None,
    new_session: bool = False,
) -> RoutingContext:
    candidates = tuple(sorted(in_flight))
    return RoutingContext(
        candidates=candidates,
        num_prompt_blocks=num_blocks,
        matched_blocks=matched or {},
        in_flight=in_flight,
        fresh_stats=stats or {},
        replica_hashes={r: stable_hash64(r) for r in candidates},
        tie_key=tie_key,
        session_replica=session,
        can_stick=can_stick,
        foreign_in_flight=foreign or {},
        active_sessions=active_sessions or {},
        new_session=new_session,
    )
