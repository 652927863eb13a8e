"""``bench/chunk_timing.py``'s split of the client's TTFT: the engines' own share (from the
difference of two ``/metrics`` scrapes) and what the rest of the path added."""

from __future__ import annotations

from bench.chunk_timing import engine_split, summary
from bench.router_peers_metrics import engine_ttft_totals

METRICS = """# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_sum{{engine="0",model_name="m"}} {sum}
vllm:time_to_first_token_seconds_count{{engine="0",model_name="m"}} {count}
"""


def test_engine_share_is_the_mean_over_the_load_and_the_rest_is_outside():
    before = engine_ttft_totals([METRICS.format(sum=1.0, count=10)])  # earlier requests (the warm-up)
    after = engine_ttft_totals([METRICS.format(sum=1.3, count=13)])  # 3 requests of 100 ms in the engine
    split = engine_split([0.12, 0.13, 0.14], before, after)
    assert split == {"ttft_mean_ms": 130.0, "engine_ttft_mean_ms": 100.0, "outside_engine_ttft_mean_ms": 30.0}


def test_no_engine_series_leaves_the_split_empty():
    nothing = engine_ttft_totals(["# no vllm series here\n"])
    split = engine_split([0.1], nothing, nothing)
    assert split == {"ttft_mean_ms": 100.0, "engine_ttft_mean_ms": None, "outside_engine_ttft_mean_ms": None}


def test_fewer_chunks_than_tokens_is_what_held_tokens_look_like():
    runs = [[0.10, 0.11, 0.12, 0.13], [0.10, 0.20]]  # the second request's tokens came as 2 chunks
    s = summary(runs, wall=1.0, max_tokens=4)
    assert (s["chunks_per_request"], s["ttft_p50_ms"], s["first_gap_p50_ms"]) == (3.0, 100.0, 10.0)
