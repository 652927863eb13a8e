"""Fakes for driving ``RouterDeployment`` as a plain class (no Ray): pool handles whose
``broadcast`` answers with fabricated ``ReplicaSnapshot``s, and small request/decision helpers."""

from __future__ import annotations

from accel.block_hash import hash_prompt_blocks
from accel.contract import EngineStats
from deployments.config.router import RouterConfig
from deployments.messages.replica_snapshot import ReplicaSnapshot
from deployments.messages.routing import RouteRequest
from deployments.replicas.kv_event_log import KVEventLog
from deployments.router.deployment import RouterDeployment
from tests.doubles.app_configs import app_config, pool_config

BS = 4
POOLS = (pool_config("tt", "m", "tt", "cpu", "both", BS), pool_config("vllm", "m", "vllm", "cpu", "both", BS))


class Broadcast:
    def __init__(self, results, error=None):
        self._results, self._error = results, error

    async def results_async(self, return_exceptions=False):
        if self._error is not None:
            raise self._error
        return self._results


class FakePoolHandle:
    """``broadcast("routing_snapshot", cursors)``: each fake replica answers like
    ``EngineReplica.routing_snapshot`` (full blocks without a usable cursor, else the events of
    its log after the cursor). ``cursor_args`` records what the router sent."""

    def __init__(self, snapshots, error=None):
        self.snapshots = snapshots
        self.error = error
        self.cursor_args = []

    def broadcast(self, method, cursors=None):
        assert method == "routing_snapshot"
        self.cursor_args.append(dict(cursors or {}))
        return Broadcast([s(cursors or {}) if callable(s) else s for s in self.snapshots], self.error)


class FakeReplica:
    """An engine replica's routing answers over a real ``KVEventLog``; ``events`` are logged at
    the first poll (what the engine had pending), ``emit`` logs more later."""

    def __init__(self, rid, pool, running=0, blocks=None, events=(), publishes=False, num_inflight=0):
        self.rid, self.pool, self.running, self.publishes = rid, pool, running, publishes
        self.num_inflight = num_inflight
        self.blocks = list(blocks or ())
        self.log = KVEventLog(64)
        self.pending = list(events)

    def emit(self, *events):
        self.pending.extend(events)

    def __call__(self, cursors):
        stats = EngineStats(0, self.running, 64, 64)
        if not self.publishes:
            return ReplicaSnapshot(self.rid, self.pool, stats, self.num_inflight, BS)
        head = self.log.append(self.pending)
        self.pending = []
        cursor = cursors.get(self.rid)
        since = self.log.read(cursor)
        if since is None:
            return ReplicaSnapshot(
                self.rid, self.pool, stats, self.num_inflight, BS, True, (), tuple(self.blocks), kv_cursor=head
            )
        return ReplicaSnapshot(
            self.rid, self.pool, stats, self.num_inflight, BS, True, since, None, kv_cursor=head, kv_from_seq=cursor.seq
        )


def make_snap(rid, pool, running=0, blocks=None, events=(), publishes=False, num_inflight=0):
    return FakeReplica(rid, pool, running, blocks, events, publishes, num_inflight)


def prompt_ids(n, seed=0):
    return tuple(3 + (seed * 97 + i * 13) % 900 for i in range(n))


def route_request(rid, ids=(), session=None, pool=None, model="m"):
    return RouteRequest(rid, model, len(ids), pool, session, tuple(hash_prompt_blocks(ids, BS)))


def make_router(policy="prefix+session+load", tt=None, vllm=None, **kw):
    handles = {
        "tt": FakePoolHandle(tt if tt is not None else [make_snap("t1", "tt"), make_snap("t2", "tt")]),
        "vllm": FakePoolHandle(vllm if vllm is not None else [make_snap("v1", "vllm", running=3)]),
    }
    config = app_config(POOLS, RouterConfig(policy=policy, index_mode="precise", stats_period_s=60))
    return RouterDeployment(config, handles, **kw), handles


async def in_flight_counts(router):
    return {v.replica_id: v.load.num_in_flight for v in (await router.snapshot()).replicas}
