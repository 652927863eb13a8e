"""TT lanes as prefix-cache domains, end to end: ``python bench/tt_lanes.py --json``.

Our Serve stack with one TT pool of two replicas (tiny-llama, torch mesh model) behind the
router at its defaults, in several lane layouts with the same KV per replica: ``1x8`` (one lane
of 8 sequences) and ``2x4`` (two lanes of 4; each lane holds half the replica's blocks and is its
own prefix cache). Each layout replays ``router_peers_traces.multi_turn`` (16 chat sessions x 4
turns in 4 groups sharing 512-token system prompts, ``x-session-id`` per session, fresh content
per run) through ``router_peers.replay``; figures as ``router_peers.figures``: ``hit_rate`` =
engines' ``cached_tokens`` / prompt tokens, ``hit_ratio_vs_oracle`` against an unlimited single
prefix cache fed the same prompts, max/mean load (the router's in-flight counts), TTFT p50/p99,
1-minute load average at start and end. Lanes that ignore the cache lose a session's history
whenever its next turn lands on the other lane; the figure to compare is ``2x4`` against ``1x8``.
Run under ``flock /tmp/meshserve-heavy.lock``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from router_peers import _load_avg, _warm, figures, replay  # noqa: E402
from router_peers_servers import OurStack  # noqa: E402
from router_peers_traces import FAMILIES  # noqa: E402

BLOCK_SIZE = 32
MAX_MODEL_LEN = 4096


def tt_app_args(model_path: str, num_lanes: int, seqs_per_lane: int, kv_blocks_per_replica: int) -> dict[str, Any]:
    return {
        "config_file": "bench/tt_lanes.py",
        "models": [{"name": "tiny-llama", "path": model_path}],
        "pools": [
            {
                "name": "tt",
                "engine": "tt",
                "accelerator": "cpu",
                "model": "tiny-llama",
                "replicas": 2,
                "max_ongoing_requests": 64,
                "resources": {"num_cpus": 0},
                "engine_args": {
                    "max_model_len": MAX_MODEL_LEN,
                    "data_parallel_size": num_lanes,
                    "max_num_seqs": seqs_per_lane,
                    "block_size": BLOCK_SIZE,
                    "enable_prefix_caching": True,
                    "num_gpu_blocks_override": kv_blocks_per_replica // num_lanes,  # per lane
                },
            }
        ],
        "ingress": {"replicas": 1, "max_concurrent_requests": 256, "access_log": False},
    }


class TTStack(OurStack):
    """``router_peers_servers.OurStack`` with a TT pool instead of the vLLM one."""

    def __init__(self, app_args: dict[str, Any]) -> None:
        super().__init__(spec=None, router=None)  # type: ignore[arg-type]
        self._app_args = app_args

    def app_args(self) -> dict[str, Any]:
        return self._app_args


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print the JSON object compactly")
    p.add_argument("--layouts", default="1x8,2x4", help="lanes x sequences per lane, comma-separated")
    p.add_argument("--kv-blocks", type=int, default=384, help="KV blocks per replica (split over its lanes)")
    p.add_argument("--seed", type=int, default=0, help="trace shape")
    p.add_argument("--scale", type=float, default=1.0, help="sessions per trace (x)")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--model", default=os.path.expanduser("~/.cache/meshserve/checkpoints/tiny-llama"))
    args = p.parse_args(argv)

    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))

    def tokenize(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=True).ids

    out: dict[str, Any] = {"bench": "tt_lanes", "trace": "multi_turn", "kv_blocks_per_replica": args.kv_blocks}
    out["load_average_start"] = _load_avg()
    layouts: dict[str, Any] = {}
    for index, layout in enumerate(x for x in args.layouts.split(",") if x):
        num_lanes, per_lane = (int(v) for v in layout.split("x"))
        stack = TTStack(tt_app_args(args.model, num_lanes, per_lane, args.kv_blocks))
        try:
            url = stack.start()
            asyncio.run(_warm(url, "tiny-llama"))
            content_seed = 7919 * (args.seed + 1) + index + int(time.time())
            sessions = FAMILIES["multi_turn"](args.seed, content_seed, args.scale, args.max_tokens)
            load_start = _load_avg()
            records, samples, wall_s = asyncio.run(replay(url, "tiny-llama", sessions, stack.loads))
            result = figures(records, samples, wall_s, tokenize, BLOCK_SIZE)
            result["load_average"] = [load_start, _load_avg()]
            layouts[layout] = result
        finally:
            stack.close()
    out["layouts"] = layouts
    out["load_average_end"] = _load_avg()
    print(json.dumps(out, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
