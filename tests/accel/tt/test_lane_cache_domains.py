"""Lanes as prefix-cache domains: the lane coordinator's pick (``accel.cache_affinity``'s rule over
each lane's cached prefix and load) and session binding. Pure logic: no model, no torch."""

from __future__ import annotations

from accel.cache_affinity import AffinityWeights
from accel.contract import GenerateRequest, SamplingParams
from accel.tt.block_allocator import BlockAllocator
from accel.tt.lane_coordinator import LaneCoordinator
from accel.tt.request_state import RequestState
from accel.tt.scheduler import LaneScheduler

BS = 4


def make_coord(num_lanes=2, per_lane=4, num_blocks=256, budget=256, max_model_len=512, weights=None):
    lanes = [
        LaneScheduler(i, per_lane, BlockAllocator(num_blocks, BS, True, lane=i), budget, max_model_len)
        for i in range(num_lanes)
    ]
    return LaneCoordinator(lanes, weights)


def req(rid, tokens, max_tokens=4, session=None):
    sampling = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return RequestState.new(GenerateRequest(rid, tuple(tokens), sampling, session_id=session))


class Driver:
    """Plays the engine: each sampled token is ``1000 + step``; finishes at max_tokens."""

    def __init__(self, coord):
        self.coord = coord
        self.live: dict[str, RequestState] = {}
        self.done: dict[str, RequestState] = {}
        self.n = 0

    def add(self, r):
        self.live[r.req_id] = r
        self.coord.add_request(r)
        return r

    def run(self):
        while self.coord.has_work():
            plan = self.coord.schedule()
            self.n += 1
            for row in plan.rows:
                r = self.live.get(row.req_id)
                if r is None or not row.samples:
                    continue
                r.num_pending -= 1
                r.token_ids.append(1000 + self.n)
            for r in list(self.live.values()):  # as EngineCore.update: finish, then cache the rest
                if len(r.token_ids) - r.num_prompt_tokens >= r.sampling.max_tokens:
                    self.coord.lanes[r.lane].cache_finishing_blocks(r)
                    self.coord.finish_request(r)
                    self.done[r.req_id] = self.live.pop(r.req_id)
            for lane in self.coord.lanes:
                lane.cache_computed_blocks(r for r in self.live.values() if r.lane == lane.lane)


def test_a_request_goes_to_the_lane_that_caches_its_prefix_even_with_more_load():
    coord = make_coord()
    d = Driver(coord)
    d.add(req("cold0", range(10, 50)))  # lane 0
    d.add(req("cold1", range(100, 140)))  # lane 1
    d.run()
    assert (d.done["cold0"].lane, d.done["cold1"].lane) == (0, 1)
    d.add(req("busy", range(500, 520)))  # lane 0 (tie)
    d.add(req("busy2", range(600, 620)))  # lane 1
    d.add(req("busy3", range(700, 720)))  # lane 0: lane 1 is the less loaded now ...
    follow = d.add(req("follow", list(range(10, 50)) + [7]))
    # 41 tokens: blocks 0-9 looked up (not the last token's), all cached on lane 0
    assert coord.cached_prefix_blocks(follow) == [10, 0]
    # ... yet 1 more waiting request there (2 units of load = 8 blocks, + KV) costs less than 10
    assert follow.lane == 0
    follow2 = d.add(req("follow2", list(range(100, 140)) + [7, 8, 9]))
    assert follow2.lane == 1
    d.run()
    assert d.done["follow"].num_prefix_hit_tokens == 40 and d.done["follow2"].num_prefix_hit_tokens == 40


def test_cold_requests_spread_by_load_and_a_small_hit_does_not_outweigh_load():
    coord = make_coord()
    d = Driver(coord)
    d.add(req("a", range(10, 19)))
    d.run()
    for i in range(3):
        d.add(req(f"x{i}", range(100 * (i + 1), 100 * (i + 1) + 9)))
    # lane loads now 2 requests on lane 0 (x0, x2), 1 on lane 1 (x1); a 2-block hit on lane 0 is
    # worth less than its extra load (w_load_blocks = 4 blocks per request, waiting counts twice)
    r = d.add(req("b", list(range(10, 19)) + [1]))
    assert coord.cached_prefix_blocks(r) == [2, 0] and r.lane == 1


def test_an_overloaded_lane_is_never_chosen_even_when_it_holds_the_whole_prompt():
    weights = AffinityWeights(window_abs=2.0)
    coord = make_coord(weights=weights)
    d = Driver(coord)
    long = list(range(1, 200))
    d.add(req("warm", long))
    d.run()
    assert d.done["warm"].lane == 0
    for i in range(2):  # lane 0: 2 waiting (score 4), lane 1 empty -> limit 2: overloaded
        coord.lanes[0].add(req(f"q{i}", range(300 + 10 * i, 305 + 10 * i)))
    r = d.add(req("again", long + [5]))
    assert coord.cached_prefix_blocks(r)[0] == 49 and r.lane == 1


def test_a_session_stays_on_its_lane_and_moves_when_that_lane_is_overloaded():
    weights = AffinityWeights(window_abs=3.0)
    coord = make_coord(weights=weights)
    d = Driver(coord)
    d.add(req("other", range(900, 920)))  # lane 0
    first = d.add(req("s-1", range(10, 14), session="s"))  # lane 1 (load)
    d.run()
    assert first.lane == 1 and coord.session_lane("s") == 1
    # nothing of this prompt is cached anywhere and lane 1 is busier: the session keeps it there
    d.add(req("busy", range(600, 610)))  # lane 0
    d.add(req("busy2", range(700, 710)))  # lane 1
    d.add(req("busy3", range(800, 810)))  # lane 0
    second = d.add(req("s-2", range(40, 60), session="s"))
    assert second.lane == 1
    for i in range(3):  # lane 1 far above lane 0 now: the session moves and rebinds
        coord.lanes[1].add(req(f"q{i}", range(300 + 10 * i, 305 + 10 * i)))
    third = d.add(req("s-3", range(70, 80), session="s"))
    assert third.lane == 0 and coord.session_lane("s") == 0


def test_multi_turn_sessions_hit_their_own_history_on_every_later_turn():
    """8 sessions x 4 turns, 2 groups sharing a system prompt, 2 lanes of 4: every turn after the
    first finds the whole previous conversation (prompt + answer) cached on its lane."""
    coord = make_coord(num_lanes=2, per_lane=4)
    d = Driver(coord)
    system = {g: list(range(2000 + 100 * g, 2000 + 100 * g + 40)) for g in range(2)}
    history = {s: system[s % 2] + [3000 + s] * 6 for s in range(8)}
    prev_len: dict[int, int] = {}
    for turn in range(4):
        order = [(s + turn) % 8 for s in range(8)]  # arrivals rotate: a least-loaded pick would swap lanes
        reqs = {s: d.add(req(f"s{s}-t{turn}", history[s], max_tokens=8, session=f"s{s}")) for s in order}
        d.run()
        for s, r in reqs.items():
            if turn > 0:
                # every full block of the previous turn's computed tokens (all but its last
                # sampled token) came from the lane's cache
                assert r.num_prefix_hit_tokens == (prev_len[s] - 1) // BS * BS, (s, turn)
            history[s] = list(r.token_ids) + [4000 + 10 * s + turn] * 5  # answer + next user message
        prev_len = {s: len(r.token_ids) for s, r in reqs.items()}
    lanes_of = {s: {d.done[f"s{s}-t{t}"].lane for t in range(4)} for s in range(8)}
    assert all(len(lanes) == 1 for lanes in lanes_of.values())
    assert sorted(next(iter(v)) for v in lanes_of.values()) == [0] * 4 + [1] * 4


def test_without_session_ids_the_prefix_alone_keeps_turns_on_their_lane():
    coord = make_coord(num_lanes=2, per_lane=4)
    d = Driver(coord)
    history = {s: [5000 + s] * 30 for s in range(6)}
    prev_len: dict[int, int] = {}
    for turn in range(3):
        order = [(s + turn) % 6 for s in range(6)]
        reqs = {s: d.add(req(f"s{s}-t{turn}", history[s], max_tokens=6)) for s in order}
        d.run()
        for s, r in reqs.items():
            if turn > 0:
                assert r.num_prefix_hit_tokens == (prev_len[s] - 1) // BS * BS
            history[s] = list(r.token_ids) + [6000 + s] * 3
        prev_len = {s: len(r.token_ids) for s, r in reqs.items()}


def test_the_block_a_finishing_step_fills_is_cached_for_the_next_turn():
    coord = make_coord(num_lanes=1)
    d = Driver(coord)
    first = d.add(req("t1", range(10, 23), max_tokens=4))  # 13 + 4 tokens: 16 fed, 4 full blocks
    d.run()
    second = d.add(req("t2", list(first.token_ids) + [5, 6, 7]))
    d.run()
    assert d.done["t2"].num_prefix_hit_tokens == 16 and second.lane == 0
