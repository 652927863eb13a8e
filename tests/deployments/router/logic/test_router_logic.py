import os
import subprocess
import sys

import pytest

from accel.block_hash import hash_prompt_blocks
from accel.contract import ConfigError
from deployments.config.router import CostWeights, RouterConfig, SessionConfig
from deployments.messages.kv_events import BlockStored
from deployments.router.logic.router_logic import NoReplicaError, ReplicaInfo

from .logic_helpers import BS, SYSTEM, Clock, core_with, req


def test_the_policy_names_of_the_config_are_the_registered_policies():
    from typing import get_args

    from deployments.config.router import IndexMode, PolicyName
    from deployments.router.logic.index_modes import PREFIX_INDEX_MODES
    from deployments.router.logic.policies import policy_names

    assert set(policy_names()) == set(get_args(PolicyName))
    assert set(PREFIX_INDEX_MODES) == set(get_args(IndexMode))


def test_unknown_policy_or_mode_fails_at_construction():
    with pytest.raises(ConfigError, match="known: least_loaded, prefix, prefix\\+session\\+load"):
        RouterConfig(policy="random")
    with pytest.raises(ConfigError, match="index_mode"):
        RouterConfig(index_mode="exact")


def test_only_replicas_of_the_requested_model_are_candidates():
    core = core_with(2)
    core.add_replica(ReplicaInfo("other", "pool2", "m2", 1000))
    picks = {core.route(req(f"q{i}", (i,) * 8)).replica_id for i in range(20)}
    assert picks == {"r0", "r1"}
    assert core.route(req("x", SYSTEM, model="m2")).replica_id == "other"
    with pytest.raises(NoReplicaError):
        core.choose(req("y", SYSTEM, model="unknown"))


def test_repeated_prefix_returns_to_its_replica_and_completion_releases():
    core = core_with()
    first = core.route(req("q1", SYSTEM + (1, 2, 3, 4)))
    core.on_completed("q1")
    second = core.route(req("q2", SYSTEM + (5, 6, 7, 8)))
    assert second.replica_id == first.replica_id
    assert (second.num_matched_blocks, second.num_prompt_blocks, second.reason) == (16, 17, "prefix")
    core.on_completed("q2")
    core.on_completed("q2")  # completion and cancel both reported
    assert all(core.num_in_flight(f"r{i}") == 0 for i in range(4))


def test_never_collapses_when_engine_stats_are_missing():
    core = core_with()
    for i in range(40):  # a burst of the same system prompt, none completed, no stats ever
        core.route(req(f"q{i}", SYSTEM + (i,) * 4))
    counts = [core.num_in_flight(f"r{i}") for i in range(4)]
    assert sum(counts) == 40
    assert max(counts) - min(counts) <= core.config.weights.window_abs + 1


def test_multi_turn_session_stays_on_one_replica():
    core = core_with()
    history: tuple[int, ...] = SYSTEM
    replicas = set()
    for turn in range(6):
        history += tuple(range(1000 + 10 * turn, 1008 + 10 * turn))
        decision = core.route(req(f"t{turn}", history, session="conv-1"))
        replicas.add(decision.replica_id)
        core.on_completed(f"t{turn}")
        history += (7,) * 8  # the answer
    assert len(replicas) == 1
    assert core.session_replica("conv-1") in replicas


def test_dead_replica_is_removed_at_once():
    core = core_with()
    decision = core.route(req("q1", SYSTEM, session="s"))
    dead = decision.replica_id
    core.remove_replica(dead)
    assert dead not in core.index.replicas()
    assert core.session_replica("s") is None
    after = core.route(req("q2", SYSTEM, session="s"))
    assert after.replica_id != dead and after.num_matched_blocks == 0
    assert core.session_replica("s") == after.replica_id
    core.on_completed("q1")  # the dead replica's request ends: ignored
    core.remove_replica(dead)  # reported twice: idempotent
    # A replica dying between choose and dispatch: the request is dispatched nowhere dead.
    info = req("q3", SYSTEM)
    chosen = core.choose(info)
    core.remove_replica(chosen.replica_id)
    core.on_dispatched(info, chosen)
    assert chosen.replica_id not in {r.replica_id for r in core.replicas()}


def test_dispatch_requires_a_choice():
    core = core_with()
    with pytest.raises(KeyError):
        core.on_dispatched(req("q", SYSTEM), core.route(req("q", SYSTEM)))


def test_precise_mode_follows_engine_events_through_the_core():
    core = core_with(index_mode="precise")
    hashes = tuple(hash_prompt_blocks(SYSTEM, BS))
    core.apply_kv_events("r2", [BlockStored(hashes)])
    core.apply_kv_events("gone", [BlockStored(hashes)])  # unknown replica: ignored
    decision = core.route(req("q", SYSTEM + (1,) * 4))
    assert (decision.replica_id, decision.num_matched_blocks) == ("r2", 16)
    # Routing alone did not teach the precise index anything about other replicas.
    assert core.index.match(hashes, frozenset({"r0", "r1", "r3"})) == {}


def test_a_prefix_on_the_host_tier_is_credited_below_a_device_hit():
    """A replica whose engine evicted a prompt from its device but keeps it in host DRAM still
    draws the request (it loads the prefix back instead of recomputing it), credited at
    ``host_tier_credit`` (0.8) per block: 16 host blocks (12.8) beat 12 device blocks and lose to
    14 (and equal load, so only the credit decides)."""
    hashes = tuple(hash_prompt_blocks(SYSTEM, BS))
    prompt = SYSTEM + (1,) * 4
    for device_blocks, winner in ((0, "r0"), (12, "r0"), (14, "r1")):
        core = core_with(2, index_mode="precise")
        core.apply_kv_events("r0", [BlockStored(hashes), BlockStored(hashes, tier="host")])
        core.apply_kv_events("r1", [BlockStored(hashes[:device_blocks])] if device_blocks else [])
        decision = core.route(req("q", prompt))
        assert decision.replica_id == winner, device_blocks
    # With the host tier credited as a device hit (1.0), the longest prefix wins again.
    core = core_with(2, index_mode="precise", weights=CostWeights(host_tier_credit=1.0))
    core.apply_kv_events("r0", [BlockStored(hashes), BlockStored(hashes, tier="host")])
    core.apply_kv_events("r1", [BlockStored(hashes[:14])])
    assert core.route(req("q", prompt)).replica_id == "r0"
    with pytest.raises(ConfigError, match="host_tier_credit"):
        CostWeights(host_tier_credit=1.5)


def test_a_dispatch_queues_the_prompt_blocks_its_replica_lacks_until_it_ends():
    core = core_with(2, index_mode="precise")
    hashes = tuple(hash_prompt_blocks(SYSTEM, BS))
    core.apply_kv_events("r0", [BlockStored(hashes[:12])])
    decision = core.route(req("q", SYSTEM + (1,) * 8))  # 18 blocks, 12 cached on r0
    assert decision.replica_id == "r0" and core.load("r0").num_queued_prefill_blocks == 6
    core.on_completed("q")
    assert core.load("r0").num_queued_prefill_blocks == 0


def test_restarted_router_rebuilds_from_snapshots_and_agrees():
    before = core_with()
    prompts = [SYSTEM + tuple(range(1000 * k, 1000 * k + 16)) for k in range(6)]
    for k, p in enumerate(prompts):
        before.route(req(f"warm{k}", p))
        before.on_completed(f"warm{k}")  # in-flight counts do not survive a restart anyway
    restarted = core_with()
    for replica in before.replicas():
        lru = before.index._lru[replica.replica_id]  # what that engine would snapshot
        restarted.apply_snapshot(replica.replica_id, list(lru))
    for k, p in enumerate(prompts):
        a, b = before.choose(req(f"q{k}", p + (5,) * 4)), restarted.choose(req(f"q{k}", p + (5,) * 4))
        assert (a.replica_id, a.num_matched_blocks) == (b.replica_id, b.num_matched_blocks)
        assert b.num_matched_blocks == len(p) // BS


def test_decisions_agree_across_processes():
    # Two router processes with different hash salts, fed the same events, decide the same.
    code = (
        "from deployments.router.logic.router_logic import *\n"
        "from accel.block_hash import hash_prompt_blocks\n"
        "from deployments.messages.routing import RouteRequest\n"
        "from deployments.config.router import ModelRouting, RouterConfig\n"
        "core = RouterLogic(RouterConfig(index_mode='approximate'), {'m': ModelRouting(4)}, clock=lambda: 0.0)\n"
        "for i in range(8): core.add_replica(ReplicaInfo(f'r{i}', 'pool', 'm', 100))\n"
        "out = []\n"
        "for i in range(30):\n"
        "    ids = tuple(range(i % 5, i % 5 + 12)) + (i,) * 4\n"
        "    d = core.route(RouteRequest(f'q{i}', 'm', len(ids), session_id=f's{i % 3}' if i % 2 else None,"
        " prompt_block_hashes=tuple(hash_prompt_blocks(ids, 4))))\n"
        "    out.append(d.replica_id)\n"
        "    if i % 4 == 0: core.on_completed(f'q{i - 2}')\n"
        "print(out)\n"
    )
    outs = set()
    for seed in ("1", "999"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        outs.add(
            subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True).stdout
        )
    assert len(outs) == 1
    assert len(set(eval(outs.pop()))) > 1


def test_precise_mode_learns_replicas_without_events_from_routing():
    core = core_with(0, index_mode="precise")
    core.add_replica(ReplicaInfo("tt", "tt", "m", 1000))
    core.add_replica(ReplicaInfo("vllm", "vllm", "m", 1000, publishes_kv_events=False))
    hashes = tuple(hash_prompt_blocks(SYSTEM, BS))
    first = core.route(req("q1", SYSTEM, session=None))
    learned = core.index.match(hashes, frozenset({"tt", "vllm"}))
    assert learned == ({"vllm": 16} if first.replica_id == "vllm" else {})
    core.add_replica(ReplicaInfo("vllm", "vllm", "m", 1000, publishes_kv_events=True))  # re-added: events now
    core.on_completed("q1")
    core.route(req("q2", (7,) * 64))
    assert core.index.match(tuple(hash_prompt_blocks((7,) * 64, BS)), frozenset({"vllm"})) == {}


def test_precise_mode_keeps_a_burst_of_siblings_together_before_the_engine_reports():
    # Four siblings of one document within a poll period: the first goes anywhere, the rest
    # follow it (speculative entries), not the load term's other replica.
    core = core_with(2, index_mode="precise")
    doc = tuple(range(500, 564))
    picks = {core.route(req(f"s{i}", doc + (i,) * 4)).replica_id for i in range(4)}
    assert len(picks) == 1
    # Without speculative entries the in-flight load spreads them (the index knows nothing yet).
    plain = core_with(2, index_mode="precise", speculative_ttl_s=0.0)
    assert len({plain.route(req(f"s{i}", doc + (i,) * 4)).replica_id for i in range(4)}) == 2


def test_pinned_pools_and_excluded_replicas_restrict_the_choice_and_disable_pd():
    core = core_with(3, pd_threshold_tokens=4)
    for i in range(6):
        d = core.route(req(f"q{i}", SYSTEM, excluded_replicas=("r0",)))  # a retry without r0
        assert d.replica_id in {"r1", "r2"}
    assert core.load("r1").num_in_flight + core.load("r2").num_in_flight == 6
    pd = core_with(0, pd_threshold_tokens=4)
    pd.add_replica(ReplicaInfo("p", "pre", "m", 1000, "prefill"))
    pd.add_replica(ReplicaInfo("d", "dec", "m", 1000, "decode"))
    assert pd.route(req("a", SYSTEM)).prefill_replica_id == "p"
    pinned = pd.route(req("b", SYSTEM, pool="dec"))
    assert (pinned.replica_id, pinned.prefill_replica_id, pinned.reason) == ("d", None, "pinned")
    retried = pd.route(req("c", SYSTEM, excluded_replicas=("p",)))
    assert (retried.replica_id, retried.prefill_replica_id) == ("d", None)
    with pytest.raises(NoReplicaError):
        pd.choose(req("x", SYSTEM, pool="pre"))


def test_rebalancing_keeps_as_many_sessions_in_place_as_possible():
    """Adding a replica moves no session; an overloaded replica loses only the sessions whose
    requests arrive while it is overloaded (each follows its newest request and stays there);
    removing a replica moves only its own sessions."""
    core = core_with(2)
    sessions = [f"s{i}" for i in range(12)]
    history = {s: tuple(range(2000 + 100 * i, 2064 + 100 * i)) for i, s in enumerate(sessions)}
    for s in sessions:
        core.route(req(f"{s}-0", history[s], session=s))
        core.on_completed(f"{s}-0")
    bound = {s: core.session_replica(s) for s in sessions}
    assert set(bound.values()) == {"r0", "r1"}

    core.add_replica(ReplicaInfo("r2", "pool", "m", 1000))  # scale out: every session stays
    for s in sessions:
        assert core.route(req(f"{s}-1", history[s] + (1,) * 4, session=s)).replica_id == bound[s]
        core.on_completed(f"{s}-1")
    assert {s: core.session_replica(s) for s in sessions} == bound

    # r0 becomes overloaded by other traffic (12 requests in flight, none finishing).
    for i in range(12):
        core.route(req(f"bg{i}", (9000 + i,) * 8, excluded_replicas=("r1", "r2")))
    on_r0 = [s for s in sessions if bound[s] == "r0"]
    movers, stayers = on_r0[:2], on_r0[2:]
    assert stayers
    for s in movers:  # only these sessions send a turn while r0 is overloaded
        d = core.route(req(f"{s}-2", history[s] + (2,) * 4, session=s))
        assert d.replica_id != "r0" and d.reason == "overloaded"
        core.on_completed(f"{s}-2")
    for i in range(12):
        core.on_completed(f"bg{i}")
    moved = {s for s in sessions if core.session_replica(s) != bound[s]}
    assert moved == set(movers)
    for s in sessions:  # after the overload: moved sessions stay where they went, others never moved
        expected = core.session_replica(s)
        assert core.route(req(f"{s}-3", history[s] + (3,) * 4, session=s)).replica_id == expected
        core.on_completed(f"{s}-3")
    assert all(core.session_replica(s) == bound[s] for s in stayers)

    before = {s: core.session_replica(s) for s in sessions}
    core.remove_replica("r1")
    for s in sessions:
        assert core.session_replica(s) == (None if before[s] == "r1" else before[s])


def test_sessions_on_one_popular_system_prompt_spread_at_light_load():
    """Eight chat sessions share one system prompt (16 blocks) and each waits for its answer
    before the next turn, so no replica ever has more than one request in flight: the window (in
    requests) never sees a skew. New sessions count the sessions active on each replica
    (``w_session``), so they split over both replicas instead of all binding where the prompt is
    cached; without the term every one of them lands on the first session's replica."""

    def place(**config) -> dict[str, str]:
        core = core_with(2, **config)
        clock = core._clock
        assert isinstance(clock, Clock)
        for i in range(8):
            clock.now_s += 1.0  # a session starts every second
            s = f"chat-{i}"
            core.route(req(f"{s}-0", SYSTEM + tuple(range(5000 + 100 * i, 5032 + 100 * i)), session=s))
            core.on_completed(f"{s}-0")
        return {f"chat-{i}": core.session_replica(f"chat-{i}") for i in range(8)}

    spread = place()
    assert sorted(list(spread.values()).count(r) for r in ("r0", "r1")) == [4, 4]
    gathered = place(weights=CostWeights(w_session=0.0))
    assert len(set(gathered.values())) == 1
    # Sessions idle longer than sessions.active_s no longer count: with active_s 0 they gather.
    assert len(set(place(sessions=SessionConfig(active_s=0.0)).values())) == 1
