"""Discrete-event model of N engine replicas behind a router, for the router simulator.

Each replica has a finite prefix cache (an LRU of block hashes — the ENGINE's real cache, separate
from the router's index), ``max_batch`` concurrent slots and a FIFO wait queue. A request starting
on a replica hits its cache for the leading cached blocks of its prompt, stores the prompt blocks,
and occupies a slot for ``prefill_s_per_token * uncached_prompt_tokens + decode_s_per_token *
output_tokens``; at completion the blocks of prompt + answer are stored. Blocks are touched last
block first (vLLM frees a request's blocks in reverse order, so prompt tails are evicted first).
Stores and evictions are reported as KV events (for ``precise`` routers) the way the router
deployment sees them: it polls every engine replica every ``stats_period_s`` (the deployment's
``router.stats_period_s``, 0.5 s by default) and each poll answer carries the engine's stats and
the KV events that reached the replica's event log by then — events older than
``kv_event_delay_s`` (the engine's publication plus, for vLLM, the replica's ZMQ subscriber) — so
a router learns of a block between ``kv_event_delay_s`` and ``stats_period_s + kv_event_delay_s``
after the engine stored it. ``kv_events_at_poll=False`` delivers every event at once instead
(the simulator before issue 17, which flattered the precise index).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from router_sim_workload import TraceRequest

from accel.contract import EngineStats
from deployments.messages.kv_events import BlockRemoved, BlockStored, KVEvent


@dataclass(frozen=True)
class ClusterConfig:
    num_replicas: int = 8
    kv_blocks_per_replica: int = 1024
    block_size: int = 16
    max_batch: int = 8
    prefill_s_per_token: float = 0.0005
    decode_s_per_token: float = 0.01
    stats_period_s: float = 0.5  # the router deployment's poll period (router.stats_period_s)
    kv_event_delay_s: float = 0.05  # engine store/evict -> visible in the replica's event log
    kv_events_at_poll: bool = True  # False: every KV event reaches the router the moment it happens


class SimRouter(Protocol):
    def choose(self, request: TraceRequest, now_s: float) -> str: ...
    def on_completed(self, request: TraceRequest, now_s: float) -> None: ...
    def on_kv_events(self, replica_id: str, events: list[KVEvent]) -> None: ...
    def on_stats(self, replica_id: str, stats: EngineStats) -> None: ...


class EngineCache:
    """LRU of block hashes with a capacity in blocks."""

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity = capacity_blocks
        self.blocks: OrderedDict[int, None] = OrderedDict()

    def num_cached_prefix(self, hashes: Sequence[int]) -> int:
        n = 0
        for h in hashes:
            if h not in self.blocks:
                break
            n += 1
        return n

    def store(self, hashes: Sequence[int]) -> list[KVEvent]:
        blocks, new = self.blocks, []
        for h in reversed(hashes):
            if h in blocks:
                blocks.move_to_end(h)
            else:
                blocks[h] = None
                new.append(h)
        evicted = []
        while len(blocks) > self.capacity:
            evicted.append(blocks.popitem(last=False)[0])
        if not new and not evicted:
            return []
        gone = set(evicted)
        stored = tuple(h for h in reversed(new) if h not in gone)  # chain order
        events: list[KVEvent] = []
        if evicted:
            new_set = set(new)
            removed = tuple(h for h in evicted if h not in new_set)
            if removed:
                events.append(BlockRemoved(removed))
        if stored:
            events.append(BlockStored(stored))
        return events


@dataclass
class SimReplica:
    replica_id: str
    cache: EngineCache
    queue: deque = field(default_factory=deque)
    num_running: int = 0
    num_running_blocks: int = 0
    num_in_system: int = 0
    load_area: float = 0.0  # integral of num_in_system over time
    last_change_s: float = 0.0

    def account(self, now_s: float, delta: int) -> None:
        self.load_area += self.num_in_system * (now_s - self.last_change_s)
        self.last_change_s = now_s
        self.num_in_system += delta


@dataclass
class SimResult:
    num_prompt_tokens: int = 0
    num_hit_tokens: int = 0
    ttft_s: list[float] = field(default_factory=list)
    load_per_replica: list[float] = field(default_factory=list)  # time-averaged requests in system


def simulate(
    trace: Sequence[TraceRequest], cluster: ClusterConfig, router: SimRouter, replica_ids: Sequence[str]
) -> SimResult:
    replicas = {r: SimReplica(r, EngineCache(cluster.kv_blocks_per_replica)) for r in replica_ids}
    result = SimResult()
    events: list[tuple[float, int, int, object]] = []  # (time, seq, kind, payload)
    arrival, done, stats_tick = 0, 1, 2
    seq = 0
    for i, req in enumerate(trace):
        events.append((req.arrival_s, seq, arrival, i))
        seq += 1
    heapq.heapify(events)
    heapq.heappush(events, (0.0, -1, stats_tick, None))
    bs = cluster.block_size
    num_pending = len(trace)
    unpolled: deque[tuple[float, str, list[KVEvent]]] = deque()  # (time, replica, events), in time order

    def publish(replica_id: str, kv_events: list[KVEvent], now_s: float) -> None:
        if not kv_events:
            return
        if cluster.kv_events_at_poll:
            unpolled.append((now_s, replica_id, kv_events))
        else:
            router.on_kv_events(replica_id, kv_events)

    def start(rep: SimReplica, req: TraceRequest, now_s: float) -> None:
        nonlocal seq
        num_hit_blocks = rep.cache.num_cached_prefix(req.prompt_hashes)
        publish(rep.replica_id, rep.cache.store(req.prompt_hashes), now_s)
        num_uncached = len(req.prompt_token_ids) - num_hit_blocks * bs
        prefill_s = cluster.prefill_s_per_token * num_uncached
        service_s = prefill_s + cluster.decode_s_per_token * req.num_output_tokens
        result.num_prompt_tokens += len(req.prompt_token_ids)
        result.num_hit_tokens += num_hit_blocks * bs
        result.ttft_s.append(now_s + prefill_s - req.arrival_s)
        rep.num_running += 1
        rep.num_running_blocks += len(req.full_hashes) + 1
        heapq.heappush(events, (now_s + service_s, seq, done, (rep, req)))
        seq += 1

    now_s = 0.0
    while events:
        now_s, _, kind, payload = heapq.heappop(events)
        if kind == arrival:
            req = trace[payload]
            rep = replicas[router.choose(req, now_s)]
            rep.account(now_s, +1)
            if rep.num_running < cluster.max_batch:
                start(rep, req, now_s)
            else:
                rep.queue.append(req)
        elif kind == done:
            rep, req = payload
            publish(rep.replica_id, rep.cache.store(req.full_hashes), now_s)
            rep.num_running -= 1
            rep.num_running_blocks -= len(req.full_hashes) + 1
            rep.account(now_s, -1)
            router.on_completed(req, now_s)
            num_pending -= 1
            if rep.queue:
                start(rep, rep.queue.popleft(), now_s)
        else:  # a poll: each replica's log events older than the delay, then its stats
            while unpolled and unpolled[0][0] <= now_s - cluster.kv_event_delay_s:
                _, replica_id, kv_events = unpolled.popleft()
                router.on_kv_events(replica_id, kv_events)
            for rep in replicas.values():
                total = cluster.kv_blocks_per_replica
                router.on_stats(
                    rep.replica_id,
                    EngineStats(
                        num_waiting=len(rep.queue),
                        num_running=rep.num_running,
                        num_kv_blocks_total=total,
                        num_kv_blocks_free=max(0, total - rep.num_running_blocks),
                    ),
                )
            if num_pending:
                heapq.heappush(events, (now_s + cluster.stats_period_s, -1, stats_tick, None))
    for rep in replicas.values():
        rep.account(now_s, 0)
        result.load_per_replica.append(rep.load_area / now_s if now_s > 0 else 0.0)
    return result


def oracle_hit_tokens(trace: Sequence[TraceRequest], total_blocks: int, block_size: int) -> tuple[int, int]:
    """(hit tokens, prompt tokens) of one global LRU cache of ``total_blocks`` fed in arrival order."""
    cache = EngineCache(total_blocks)
    hits = prompt = 0
    for req in trace:
        hits += cache.num_cached_prefix(req.prompt_hashes) * block_size
        prompt += len(req.prompt_token_ids)
        cache.store(req.full_hashes)
    return hits, prompt
