"""RouterLogic with LoRA adapter requests: only replicas that run adapters are candidates, a
replica holding the adapter is preferred the way a prefix hit is (within the load window),
``max_loras`` per replica is respected, and an adapter's prompt never matches another's blocks."""

from __future__ import annotations

import pytest

from accel.block_hash import hash_prompt_blocks, salted_root
from deployments.messages.routing import RouteRequest
from deployments.router.logic.router_logic import NoReplicaError, ReplicaInfo

from .logic_helpers import BS, SYSTEM, core_with


def _core(max_loras: int = 2, num_lora: int = 2):
    core = core_with(1)  # r0: a TT-like replica, no adapters
    for i in range(num_lora):
        core.add_replica(ReplicaInfo(f"v{i}", "lora", "m", 1000, max_loras=max_loras))
    return core


def _lora_req(request_id: str, tokens: tuple[int, ...], lora: str, **kw) -> RouteRequest:
    hashes = tuple(hash_prompt_blocks(tokens, BS, salted_root(None, lora)))
    return RouteRequest(request_id, "m", len(tokens), prompt_block_hashes=hashes, lora=lora, **kw)


def test_adapter_requests_only_reach_replicas_that_run_adapters():
    core = _core()
    chosen = {core.route(_lora_req(f"q{i}", (i,) * 8, "a")).replica_id for i in range(12)}
    assert chosen <= {"v0", "v1"}
    with pytest.raises(NoReplicaError):
        core.route(_lora_req("p", SYSTEM, "a", pool="pool"))  # pinned past the ingress's 400


def test_the_replica_holding_the_adapter_wins_a_cold_prompt():
    core = _core()
    first = core.route(_lora_req("q0", (1,) * 8, "a")).replica_id
    core.on_completed("q0")
    # Different prompts (no prefix hit anywhere), equal load: the adapter's holder, every time.
    for i in range(1, 6):
        decision = core.route(_lora_req(f"q{i}", (i + 1,) * 8, "a"))
        assert (decision.replica_id, decision.reason) == (first, "prefix")
        assert decision.num_matched_blocks == 0  # the credit is not reported as cached blocks
        core.on_completed(f"q{i}")


def test_affinity_yields_to_load_like_a_prefix_hit():
    core = _core(max_loras=4)
    holder = core.route(_lora_req("q0", (1,) * 8, "a")).replica_id
    for i in range(12):  # base requests in flight on the holder (every other replica excluded)
        core.on_dispatched(*_pinned(core, f"load{i}", holder))
    assert core.route(_lora_req("q1", (2,) * 8, "a")).replica_id != holder


def _pinned(core, request_id: str, replica_id: str):
    request = RouteRequest(
        request_id, "m", 8, excluded_replicas=tuple(r for r in ("v0", "v1", "r0") if r != replica_id)
    )
    return request, core.choose(request)


def test_max_loras_is_respected_while_another_replica_has_a_free_slot():
    core = _core(max_loras=1)
    a = core.route(_lora_req("qa", (1,) * 8, "a")).replica_id  # a in flight on one replica
    b = core.route(_lora_req("qb", (1,) * 8, "b")).replica_id
    assert b != a  # a's replica has its one slot taken
    assert core.route(_lora_req("qa2", (5,) * 8, "a")).replica_id == a
    core.on_completed("qa")
    core.on_completed("qa2")
    c = core.route(_lora_req("qc", (1,) * 8, "c")).replica_id
    assert c == a  # b still runs on the other replica; a's slot is free again


def test_two_adapters_never_share_prefix_blocks():
    core = _core(max_loras=4)
    first = core.route(_lora_req("q0", SYSTEM, "a"))
    core.on_completed("q0")
    again = core.route(_lora_req("q1", SYSTEM, "a"))
    other = core.route(_lora_req("q2", SYSTEM, "b"))
    assert again.replica_id == first.replica_id and again.num_matched_blocks == len(SYSTEM) // BS
    assert other.num_matched_blocks == 0


def test_base_requests_are_routed_as_before():
    core = _core()
    chosen = {
        core.route(
            RouteRequest(f"q{i}", "m", 8, prompt_block_hashes=tuple(hash_prompt_blocks((i,) * 8, BS)))
        ).replica_id
        for i in range(30)
    }
    assert chosen == {"r0", "v0", "v1"}
