"""RouterLogic: the router's state and decisions, as pure logic (no Ray, no torch).

Composes a prefix index (``prefix_index``), a session table (``sessions``), a load tracker
(``load``) and a routing policy chosen by name (``policies``) over each model's replicas by role
(``role_groups``). Its settings are the app config's: ``deployments.config.router.RouterConfig``
and, per served model, ``ModelRouting`` (routing block size, PD threshold), derived once from the
model's pools.

How the Router deployment drives it
-----------------------------------
Each router deployment replica holds one ``RouterLogic``; every ingress replica asks the router
instead of keeping its own state (several independent routers each seeing a fraction of the
traffic is the failure SMG measured at 0.66 vs 0.93 hit rate). With several router replicas they
agree because each core is fed the same engine view (every KV event, every replica's stats) and a
session's requests always reach the same router replica (``deployments/router/deployment.py``).
The deployment is a thin async wrapper whose methods never block (no RPCs inside; all methods
below are O(prompt blocks + replicas)):

- ``route(RouteRequest) -> RouteDecision`` (the deployment's own messages,
  ``deployments.messages.routing``): choose and count the request at once, *before* the ingress
  dispatches it (so a burst cannot pile onto one replica). The ingress computes
  ``RouteRequest.prompt_block_hashes`` with ``accel.block_hash.hash_prompt_blocks`` at the model's
  routing block size itself, which keeps hashing off the router's single thread. A request pinned
  to a pool (``pool``) or retried without some replicas (``excluded_replicas``) is chosen among the
  rest and never disaggregated. The decision carries its tickets (``ticket`` / ``prefill_ticket``).
- ``on_completed(request_id)`` when the response ends — completion, error and client cancel alike
  (idempotent); ``on_prefill_done(request_id)`` when a disaggregated prefill returns.
- ``add_replica(ReplicaInfo)`` (pool, model, role, capacity) / ``remove_replica(id)`` from the
  deployment's view of the engine replicas (its polls, Serve's membership pushes, replicas
  reported dead); removal drops the replica's index entries, sessions and load at once.
- ``apply_stats(id, EngineStats, num_reported_in_flight)`` from the router's periodic poll;
  ``apply_kv_events(id, events)`` from engines that publish KV events (``precise`` mode; the TT
  engine publishes ``kv_events`` directly, vLLM replicas go through one
  ``vllm_kv_events.VLLMEventTranslator`` each);
  ``apply_snapshot(id, block_hashes)`` once per engine after a router (re)start.
If the router cannot be reached, the ingress falls back to its own least-loaded choice (and counts
that in a metric); the router's state stays consistent because unknown request ids are ignored.

Reproducibility: decisions are a deterministic function of the state (sorted candidates, ties
broken by rendezvous hashing of stable 64-bit keys — ``accel.block_hash`` values and blake2b of
ids, never Python's salted ``hash()``), so a restarted router that rebuilds its index from engine
snapshots makes the same prefix choices, and a session whose binding was lost lands again where
its history is cached.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from accel.block_hash import BlockHash
from accel.contract import EngineStats
from deployments.config.app import Role
from deployments.config.router import ModelRouting, RouterConfig
from deployments.config.task import PoolTask
from deployments.messages.kv_events import KVEvent, Tier
from deployments.messages.routing import RouteDecision, RouteRequest, prefill_ticket_of, stable_hash64

from .adapters import AdapterTable
from .index_modes import make_prefix_index
from .load import LoadTracker, ReplicaLoad
from .policies import make_policy
from .policy import RoutingContext
from .prefix_index import PrefixIndex, tier_credit
from .role_groups import RoleGroups
from .sessions import SessionTable


class NoReplicaError(LookupError):
    """No replica serves the requested model (or the pool it needs is empty)."""


@dataclass(frozen=True)
class ReplicaInfo:
    replica_id: str
    pool: str  # the pool it belongs to (what a decision names)
    model: str
    num_kv_blocks: int  # engine KV capacity in blocks of the model's routing block size
    role: Role = "both"  # "both": prefill and decode on the same replica
    # False: the engine publishes no KV events (at the router's block size), so even in
    # ``precise`` mode this replica's index entries are learned from routing (approximate).
    publishes_kv_events: bool = True
    # What its pool's engine serves (``deployments.config.task``): a request goes only where its
    # task is served (a model may have generative and pooling pools).
    tasks: frozenset[PoolTask] = frozenset({"generate"})
    max_loras: int = 0  # LoRA adapters it runs in one batch (its pool's enable_lora); 0 = none


@dataclass(frozen=True)
class _Pick:
    """One phase's choice inside a decision (the policy's ``Choice`` and what the logic adds to it),
    kept until the request is dispatched."""

    replica_id: str
    session_key: str | None  # the session-table key the dispatch binds (None: no session)
    rebind_session: bool  # the bound replica was overloaded: move the binding here
    num_matched_blocks: int  # leading prompt blocks cached on the replica
    reason: str  # the policy's (``policy.Choice.reason``)


class RouterLogic:
    """Router state plus decisions. Not thread-safe: the deployment calls it from one loop."""

    def __init__(
        self,
        config: RouterConfig,
        models: Mapping[str, ModelRouting],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``models``: the served models' routing settings (block size, PD threshold), by name."""
        self.config = config
        self._models = dict(models)
        self._clock = clock
        self._policy = make_policy(self.config.policy, self.config.weights)
        self._index = make_prefix_index(self.config.index_mode, clock, self.config.speculative_ttl_s)
        self._sessions = SessionTable(self.config.sessions, clock)
        self._load = LoadTracker(self.config.load, clock)
        self._adapters = AdapterTable()  # LoRA slots and affinity (``adapters``)
        self._tier_credit = tier_credit(config.weights.host_tier_credit, config.weights.storage_tier_credit)
        self._replicas: dict[str, ReplicaInfo] = {}
        self._replica_hashes: dict[str, int] = {}
        self._groups = RoleGroups()
        self._plans: dict[str, tuple[_Pick, ...]] = {}  # decided, awaiting dispatch
        self._session_keys_of_request: dict[str, tuple[str, ...]] = {}

    # ----- replicas -------------------------------------------------------------------------
    def add_replica(self, info: ReplicaInfo) -> None:
        """Start routing to a replica (re-adding updates its pool, role and capacity).
        Raises ``KeyError`` for a model the logic was not configured with."""
        if info.model not in self._models:
            raise KeyError(f"replica {info.replica_id!r} serves unknown model {info.model!r}")
        if info.replica_id in self._replicas:
            self._drop_from_groups(info.replica_id)
        self._replicas[info.replica_id] = info
        self._replica_hashes[info.replica_id] = stable_hash64(info.replica_id)
        self._index.add_replica(info.replica_id, info.num_kv_blocks)
        self._index.set_event_driven(info.replica_id, info.publishes_kv_events)
        self._load.add_replica(info.replica_id)
        self._adapters.add_replica(info.replica_id, info.max_loras)
        self._groups.add((info.model, info.role), info.replica_id)

    def remove_replica(self, replica_id: str) -> None:
        """The replica is dead or drained: no more routing to it; its cached blocks, session
        bindings and in-flight counts are dropped at once. Idempotent."""
        if replica_id not in self._replicas:
            return
        self._drop_from_groups(replica_id)
        del self._replicas[replica_id]
        del self._replica_hashes[replica_id]
        self._index.remove_replica(replica_id)
        self._sessions.remove_replica(replica_id)
        self._load.remove_replica(replica_id)
        self._adapters.remove_replica(replica_id)

    def replicas(self) -> tuple[ReplicaInfo, ...]:
        return tuple(self._replicas[r] for r in sorted(self._replicas))

    def _drop_from_groups(self, replica_id: str) -> None:
        info = self._replicas[replica_id]
        self._groups.discard((info.model, info.role), replica_id)

    # ----- decisions ------------------------------------------------------------------------
    def route(self, request: RouteRequest) -> RouteDecision:
        """``choose`` and ``on_dispatched`` in one step (what the deployment calls)."""
        decision = self.choose(request)
        self.on_dispatched(request, decision)
        return decision

    def choose(self, request: RouteRequest) -> RouteDecision:
        """Pick the replica(s) for ``request`` without changing load or the index.

        Raises ``NoReplicaError`` when no replica may serve ``request`` (none of its model, or
        none left of its pinned pool)."""
        model = request.model
        routing = self._models.get(model)
        if routing is None:
            raise NoReplicaError(f"no replica serves model {model!r}")
        hashes = request.prompt_block_hashes
        threshold = routing.pd_threshold_tokens
        allowed = self._allowed(request)
        prefill_pool, decode_pool, both_pool = self._groups.by_role(model, allowed)
        session = request.session_id
        decode = None
        # Shorter prompts may go PD too while their decode replica is busy — only where they would
        # prefill on it (no colocated pool to run them instead).
        busy = None if both_pool else routing.pd_busy_decode_threshold_tokens
        if (
            threshold is not None
            and prefill_pool
            and decode_pool
            and request.num_prompt_tokens >= (threshold if busy is None else min(threshold, busy))
        ):
            decode = self._choose_in(decode_pool, (model, "decode"), hashes, session)
            num_uncached = request.num_prompt_tokens - decode.num_matched_blocks * routing.block_size
            if num_uncached < threshold:
                prefill_pool = self._short_prompt_prefill_pool(prefill_pool, decode, num_uncached, busy)
            if prefill_pool:
                prefill_session = f"prefill|{session}" if session else None
                prefill = self._choose_in(
                    prefill_pool, (model, "prefill"), hashes, prefill_session, frozenset(prefill_pool)
                )
                self._plans[request.request_id] = (decode, prefill)
                return self._decision(request, decode, prefill)
        # Short or mostly cached prompts (or no PD pools) run where they decode: colocated
        # replicas, else the decode pool prefills locally — on the replica holding the cache.
        if decode is None or both_pool:
            role: Role = "both" if both_pool else "decode"
            pool = both_pool or decode_pool
            if not pool:
                raise NoReplicaError(f"no replica serves model {model!r}")
            decode = self._choose_in(pool, (model, role), hashes, session, allowed, request.lora)
        self._plans[request.request_id] = (decode,)
        return self._decision(request, decode, None)

    def _short_prompt_prefill_pool(
        self, prefill_pool: tuple[str, ...], decode: _Pick, num_uncached: int, busy: int | None
    ) -> tuple[str, ...]:
        """The prefill replicas a prompt under the PD threshold may use: the idle ones while its
        decode replica is busy (a TT step is phase-only: a local prefill pauses every decoding
        row there) and ``num_uncached >= busy``; otherwise none (it prefills where it decodes)."""
        if busy is None or num_uncached < busy or self._is_idle(decode.replica_id):
            return ()
        return tuple(r for r in prefill_pool if self._is_idle(r))

    def _is_idle(self, replica_id: str) -> bool:
        """No request in flight there, from this router or (fresh) from its peers."""
        return not self._load.in_flight.get(replica_id) and not self._load.foreign_in_flight().get(replica_id)

    def _allowed(self, request: RouteRequest) -> frozenset[str] | None:
        """The replicas a pinned or retried request, one whose task not every replica of its model
        serves, or one with a LoRA adapter (``adapters.AdapterTable.placeable``; never
        disaggregated), may use; None = every replica of its model."""
        serves_all = all(request.task in i.tasks for i in self._replicas.values() if i.model == request.model)
        if request.pool is None and not request.excluded_replicas and serves_all and request.lora is None:
            return None
        replicas = (
            r
            for r, info in self._replicas.items()
            if (request.pool is None or info.pool == request.pool) and request.task in info.tasks
        )
        allowed = frozenset(replicas) - frozenset(request.excluded_replicas)
        return allowed if request.lora is None else self._adapters.placeable(request.lora, allowed)

    def _decision(self, request: RouteRequest, serve: _Pick, prefill: _Pick | None) -> RouteDecision:
        """``serve`` runs the request (the colocated replica, or the decode side under PD)."""
        replica_id = serve.replica_id
        pool = self._replicas[replica_id].pool
        num_prompt_blocks = len(request.prompt_block_hashes)
        if prefill is None:
            reason = "pinned" if request.pool is not None else serve.reason
            return RouteDecision(
                pool,
                replica_id,
                request.request_id,
                reason,
                num_matched_blocks=serve.num_matched_blocks,
                num_prompt_blocks=num_prompt_blocks,
            )
        prefill_id = prefill.replica_id
        return RouteDecision(
            pool,
            replica_id,
            request.request_id,
            "prefill_decode",
            prefill_pool=self._replicas[prefill_id].pool,
            prefill_replica_id=prefill_id,
            prefill_ticket=prefill_ticket_of(request.request_id),
            num_matched_blocks=prefill.num_matched_blocks,
            num_prompt_blocks=num_prompt_blocks,
        )

    def _choose_in(
        self,
        pool: tuple[str, ...],
        pool_key: tuple[str, Role],
        hashes: Sequence[BlockHash],
        session_key: str | None,
        allowed: frozenset[str] | None = None,
        lora: str | None = None,
    ) -> _Pick:
        pool_set = self._groups.member_set(pool_key, allowed)
        matched = self._index.match(hashes, pool_set)
        credited = self._index.credit(hashes, matched, self._tier_credit)
        if lora is not None:
            credited = self._adapters.credit(lora, credited, pool_set)
        bound = self._sessions.bound_replica(session_key) if session_key else None
        new_session = bool(session_key) and bound is None
        if bound is not None and bound not in pool_set:
            bound = None
        if session_key:
            tie_key = stable_hash64(session_key)
        else:
            tie_key = (hashes[0] & 0xFFFFFFFFFFFFFFFF) if hashes else 0
        ctx = RoutingContext(
            candidates=pool,
            num_prompt_blocks=len(hashes),
            matched_blocks=credited,
            in_flight=self._load.in_flight,
            queued_prefill_blocks=self._load.queued_prefill_blocks,
            fresh_stats=self._load.fresh_stats(),
            foreign_in_flight=self._load.foreign_in_flight(),
            replica_hashes=self._replica_hashes,
            tie_key=tie_key,
            session_replica=bound,
            can_stick=self._sessions.can_stick(session_key) if session_key else True,
            active_sessions=self._sessions.num_active() if new_session else {},
            new_session=new_session,
        )
        choice = self._policy.choose(ctx)
        return _Pick(
            choice.replica_id, session_key, choice.rebind_session, matched.get(choice.replica_id, 0), choice.reason
        )

    # ----- dispatch and completion ------------------------------------------------------------
    def on_dispatched(self, request: RouteRequest, decision: RouteDecision) -> None:
        """The request was (about to be) sent as decided: count it, bind its session and, in
        approximate mode, record its blocks on the replicas that will hold them."""
        plans = self._plans.pop(request.request_id, None)
        if plans is None:
            raise KeyError(f"request {request.request_id!r} was not chosen (or already dispatched)")
        live = [p for p in plans if p.replica_id in self._replicas]  # a replica may have died since
        hashes = request.prompt_block_hashes
        # The prompt blocks each phase computes: all a colocated replica lacks, and under PD the
        # prefill replica's (the decode side receives the KV instead).
        computing = [p for p in plans[-1:] if p in live]  # (plans: (serve,) or (decode, prefill))
        prefill_blocks = {p.replica_id: len(hashes) - p.num_matched_blocks for p in computing}
        self._load.on_dispatched(request.request_id, (p.replica_id for p in live), prefill_blocks)
        if request.lora is not None:
            self._adapters.on_dispatched(request.request_id, request.lora, (p.replica_id for p in live))
        keys = []
        for plan in live:
            self._index.on_routed(plan.replica_id, hashes)
            if plan.session_key:
                self._sessions.on_dispatched(plan.session_key, plan.replica_id, rebind=plan.rebind_session)
                keys.append(plan.session_key)
        self._session_keys_of_request[request.request_id] = tuple(keys)

    def on_prefill_done(self, request_id: str, prefill_replica_id: str) -> None:
        """The prefill phase of a disaggregated request ended; it no longer loads that replica."""
        self._load.on_phase_done(request_id, prefill_replica_id)

    def on_completed(self, request_id: str) -> None:
        """The request ended: completed, failed or cancelled. Unknown ids are ignored."""
        self._plans.pop(request_id, None)
        self._load.on_finished(request_id)
        self._adapters.on_finished(request_id)
        for key in self._session_keys_of_request.pop(request_id, ()):
            self._sessions.on_finished(key)

    # ----- engine signals -------------------------------------------------------------------
    def apply_stats(self, replica_id: str, stats: EngineStats, num_reported_in_flight: int | None = None) -> None:
        """``num_reported_in_flight``: the replica's own count of requests it serves (every
        router's), when it reports one; the excess over ours counts as load (several routers)."""
        self._load.apply_stats(replica_id, stats, num_reported_in_flight)

    def apply_peer_in_flight(self, peer_id: str, counts: Mapping[str, int]) -> None:
        """Another router replica's in-flight counts per engine replica (several routers)."""
        self._load.apply_peer_in_flight(peer_id, counts)

    def peer_router_ids(self) -> tuple[str, ...]:
        """The peer router replicas whose in-flight counts are fresh."""
        return self._load.fresh_peer_ids()

    def in_flight_counts(self) -> dict[str, int]:
        """This router's own requests in flight per engine replica (what it publishes to peers)."""
        return {replica_id: n for replica_id, n in self._load.in_flight.items() if n}

    def apply_kv_events(self, replica_id: str, events: Iterable[KVEvent]) -> None:
        """KV events of one replica, in publication order (``precise`` mode follows them)."""
        if replica_id in self._replicas:
            self._index.apply_events(replica_id, events)

    def apply_snapshot(
        self, replica_id: str, block_hashes: Sequence[BlockHash], tiers: Sequence[tuple[BlockHash, Tier]] = ()
    ) -> None:
        """The replica's full list of cached blocks (least recently used first) and those held only
        off the device (``tiers``): rebuilds its index entries after a router restart."""
        if replica_id in self._replicas:
            self._index.apply_snapshot(replica_id, block_hashes, tiers)

    # ----- introspection (metrics, tests) ------------------------------------------------------
    @property
    def index(self) -> PrefixIndex:
        """The prefix index; read-only use."""
        return self._index

    def model_routing(self, model: str) -> ModelRouting:
        return self._models[model]

    def num_in_flight(self, replica_id: str) -> int:
        return self._load.num_in_flight(replica_id)

    def load(self, replica_id: str) -> ReplicaLoad:
        """The replica's load as the router sees it (in-flight count plus fresh engine stats)."""
        return self._load.load(replica_id)

    def session_replica(self, session_id: str) -> str | None:
        """The replica ``session_id``'s requests are bound to (None: unbound or expired)."""
        return self._sessions.bound_replica(session_id)
