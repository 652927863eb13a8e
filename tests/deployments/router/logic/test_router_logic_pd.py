"""RouterLogic's prefill/decode decisions: when a prompt is disaggregated and where each phase goes."""

import pytest

from accel.block_hash import hash_prompt_blocks
from deployments.config.router import ModelRouting, RouterConfig
from deployments.messages.routing import RouteRequest
from deployments.router.logic.router_logic import NoReplicaError, ReplicaInfo, RouterLogic

from .logic_helpers import BS, SYSTEM, Clock, req


def pd_core(threshold: int | None, block_size: int = BS, busy_threshold: int | None = None) -> RouterLogic:
    routing = ModelRouting(block_size, threshold, busy_threshold)
    core = RouterLogic(RouterConfig(index_mode="approximate"), {"m": routing}, clock=Clock())
    core.add_replica(ReplicaInfo("p0", "pre", "m", 1000, "prefill"))
    core.add_replica(ReplicaInfo("p1", "pre", "m", 1000, "prefill"))
    core.add_replica(ReplicaInfo("d0", "dec", "m", 1000, "decode"))
    return core


def test_pd_pair_only_at_or_above_threshold():
    core = pd_core(threshold=64)
    long = core.route(req("long", SYSTEM))  # 64 tokens: at the threshold
    assert long.is_disaggregated
    assert long.prefill_replica_id in {"p0", "p1"} and long.replica_id == "d0"  # d0 decodes
    assert (long.pool, long.prefill_pool, long.reason) == ("dec", "pre", "prefill_decode")
    assert (long.ticket, long.prefill_ticket) == ("long", "long#prefill")
    assert core.num_in_flight(long.prefill_replica_id) == 1 and core.num_in_flight("d0") == 1
    core.on_prefill_done("long", long.prefill_replica_id)
    assert core.num_in_flight(long.prefill_replica_id) == 0 and core.num_in_flight("d0") == 1
    short = core.route(req("short", SYSTEM[:63]))
    assert not short.is_disaggregated and short.replica_id == "d0" and short.prefill_replica_id is None
    # The prefill replica that holds the prefix is preferred next time (64 uncached tokens: PD).
    again = core.route(req("again", SYSTEM + (1,) * 64))
    assert again.prefill_replica_id == long.prefill_replica_id and again.num_matched_blocks == 16


def test_pd_is_decided_on_the_uncached_part_of_the_prompt():
    core = pd_core(threshold=64)
    turn1 = SYSTEM + (5,) * 8  # 72 tokens, nothing cached: disaggregated
    first = core.route(req("t1", turn1, session="conv"))
    assert first.is_disaggregated
    core.on_prefill_done("t1", first.prefill_replica_id)
    core.on_completed("t1")
    # The next turn repeats the 72 tokens (cached on the decode replica, which imported them) and
    # adds 16: only 16 uncached tokens, so the decode replica prefills them itself.
    turn2 = turn1 + (6,) * 16
    second = core.route(req("t2", turn2, session="conv"))
    assert not second.is_disaggregated and second.replica_id == "d0"
    assert second.num_matched_blocks == 18 and second.num_prompt_blocks == 22
    core.on_completed("t2")
    # A long new part is disaggregated again, even with the cached prefix.
    third = core.route(req("t3", turn2 + (7,) * 64, session="conv"))
    assert third.is_disaggregated and third.replica_id == "d0"
    # The uncached count uses the model's routing block size (hashes at 8 tokens per block: 9
    # blocks of 72 tokens cached -> 16 uncached of 88).
    other = pd_core(threshold=64, block_size=8)
    hashes8 = tuple(hash_prompt_blocks(turn1, 8))
    d = other.route(RouteRequest("a", "m", 72, prompt_block_hashes=hashes8))
    assert d.is_disaggregated
    other.on_completed("a")
    hashes8b = tuple(hash_prompt_blocks(turn2, 8))
    d2 = other.route(RouteRequest("b", "m", 88, prompt_block_hashes=hashes8b))
    assert not d2.is_disaggregated and d2.num_matched_blocks == 9


def test_short_prompts_are_disaggregated_while_the_decode_replica_is_busy():
    core = pd_core(threshold=64, busy_threshold=2)
    # Decode replica idle: a short prompt prefills where it decodes (no hand-off, no TTFT cost).
    idle = core.route(req("idle", (1,) * 8))
    assert not idle.is_disaggregated and idle.replica_id == "d0"
    # d0 now decodes "idle": the next short prompt would pause it, so an idle prefill replica takes it.
    busy = core.route(req("busy", (2,) * 8))
    assert busy.is_disaggregated and busy.replica_id == "d0" and busy.reason == "prefill_decode"
    first_prefill = busy.prefill_replica_id
    # Only idle prefill replicas qualify: the other one takes the next, then none is left.
    second = core.route(req("second", (3,) * 8))
    assert second.is_disaggregated and {first_prefill, second.prefill_replica_id} == {"p0", "p1"}
    third = core.route(req("third", (4,) * 8))
    assert not third.is_disaggregated and third.replica_id == "d0"
    core.on_prefill_done("busy", first_prefill)
    assert core.route(req("fourth", (5,) * 8)).prefill_replica_id == first_prefill
    # Below the busy threshold (1 token < 2): never disaggregated.
    assert not core.route(req("tiny", (6,))).is_disaggregated
    # Long prompts go PD whatever the load, to a busy prefill replica too.
    assert core.route(req("long", SYSTEM)).is_disaggregated
    # Without the busy rule a short prompt never goes PD.
    plain = pd_core(threshold=64)
    plain.route(req("a", (1,) * 8))
    assert not plain.route(req("b", (2,) * 8)).is_disaggregated
    # With a colocated pool short prompts run there, not on the decode replica: nothing to spare it.
    mixed = pd_core(threshold=64, busy_threshold=1)
    mixed.add_replica(ReplicaInfo("both", "both", "m", 1000))
    mixed.route(req("long", SYSTEM))  # d0 decodes it
    short = mixed.route(req("short", (3,) * 8))
    assert not short.is_disaggregated and short.replica_id == "both"


def test_busy_rule_counts_other_routers_requests_and_respects_pins():
    core = pd_core(threshold=64, busy_threshold=1)
    core.apply_peer_in_flight("router-2", {"d0": 1})  # a peer's request decodes on d0
    assert core.route(req("s", (1,) * 8)).is_disaggregated
    core.apply_peer_in_flight("router-2", {"d0": 1, "p0": 1, "p1": 1})  # ... and both prefill replicas are busy
    assert not core.route(req("t", (2,) * 8)).is_disaggregated
    pinned = pd_core(threshold=64, busy_threshold=1)
    pinned.route(req("a", (1,) * 8))
    assert not pinned.route(req("b", (2,) * 8, pool="dec")).is_disaggregated


def test_no_pd_for_a_model_without_a_threshold():
    # A model whose prefill pools cannot pair (or that has none) has no PD threshold.
    core = pd_core(threshold=None)
    decision = core.route(req("long", SYSTEM * 4))
    assert not decision.is_disaggregated and decision.replica_id == "d0"


def test_pd_falls_back_to_colocated_replicas_for_short_prompts():
    core = pd_core(threshold=64)
    core.add_replica(ReplicaInfo("both", "both", "m", 1000))
    assert core.route(req("short", SYSTEM[:8])).replica_id == "both"
    assert core.route(req("long", SYSTEM)).prefill_replica_id is not None
    only_prefill = RouterLogic(RouterConfig(index_mode="approximate"), {"m": ModelRouting(BS, 64)}, clock=Clock())
    only_prefill.add_replica(ReplicaInfo("p", "pre", "m", 100, "prefill"))
    with pytest.raises(NoReplicaError):
        only_prefill.choose(req("x", SYSTEM))
