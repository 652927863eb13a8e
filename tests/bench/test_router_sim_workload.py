"""bench/router_sim_workload.py: the chat-prompt popularity knob skews sessions onto popular
system prompts, and leaves the default trace (the one the weights were chosen on) untouched."""

import collections
import hashlib
import os
import sys
from dataclasses import replace

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench")
sys.path.insert(0, os.path.abspath(BENCH))

from router_sim_workload import WorkloadConfig, make_trace  # noqa: E402

SMALL = WorkloadConfig(num_sessions=60, num_turns=1, num_chat_system_prompts=6, num_shared_requests=0)


def _sessions_per_system_prompt(cfg: WorkloadConfig) -> list[int]:
    system_len = cfg.chat_system_tokens
    counts = collections.Counter(r.prompt_token_ids[:system_len] for r in make_trace(cfg))
    return sorted(counts.values(), reverse=True)


def test_sessions_take_the_prompts_in_turn_by_default() -> None:
    assert _sessions_per_system_prompt(SMALL) == [10] * 6


def test_zipf_popularity_piles_sessions_onto_the_popular_prompts() -> None:
    counts = _sessions_per_system_prompt(replace(SMALL, chat_zipf_alpha=1.1))
    assert sum(counts) == 60
    assert counts[0] >= 2 * counts[-1]
    assert counts[0] > 10


# The default trace of this small config as the generator drew it before the popularity knob
# existed (sha256 over every request; ``accel.block_hash`` and ``random.Random`` are stable).
DEFAULT_TRACE_SHA256 = "3bc2d440f4b0433ccb3519fc3a6b007c4ae7564ea333185f93b1b17f3f7ff2f1"


def test_the_default_trace_does_not_change() -> None:
    """alpha 0 draws nothing extra from the seeded generator: every request is as before."""
    digest = hashlib.sha256()
    for r in make_trace(WorkloadConfig(num_sessions=20, num_shared_requests=50, duration_s=20.0)):
        fields = (round(r.arrival_s, 9), r.request_id, r.session_id, r.prompt_token_ids, r.num_output_tokens)
        digest.update(repr((*fields, r.prompt_hashes)).encode())
    assert digest.hexdigest() == DEFAULT_TRACE_SHA256


def test_chat_output_tokens_shortens_the_decode_but_not_the_history() -> None:
    """Light-load chat (router_peers' clients): a turn decodes few tokens while the next turn's
    prompt still carries the whole synthetic answer, and the engine caches only what it computed."""
    base = replace(SMALL, num_sessions=4, num_turns=3, answer_tokens=(96, 96), user_tokens=(32, 32))
    full, short = make_trace(base), make_trace(replace(base, chat_output_tokens=(16, 16)))
    assert [r.num_output_tokens for r in full] == [96] * 12
    assert [r.num_output_tokens for r in short] == [16] * 12
    assert [r.prompt_token_ids for r in short] == [r.prompt_token_ids for r in full]
    for r in short:
        assert len(r.full_hashes) == (len(r.prompt_token_ids) + 16) // base.block_size
