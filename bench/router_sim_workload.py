"""Seeded synthetic traces for the router simulator.

Two shapes, merged into one timeline:
- multi-turn chat: sessions (each with an ``x-session-id``) share one of a few system prompts;
  turn k's prompt is the system prompt plus the whole history (user and assistant messages) plus
  a new user message, so it extends turn k-1's prompt and answer;
- shared system prompt (generated-shared-prefix): groups with a long system prompt, many short
  questions per group, no session key.
Token ids are random (vocabulary 32000); block hashes are ``accel.block_hash`` chained hashes.

Shape knobs beyond those two (all off by default, so the default trace is the one the router's
default weights were chosen on): ``session_context_tokens`` gives each chat session a private
context after its system prompt (long histories: KV pressure), ``group_zipf_alpha`` makes group
popularity Zipf-skewed instead of uniform, ``chat_zipf_alpha`` does the same for the chat
sessions' system prompts (each session draws one instead of taking them in turn: sessions pile
onto a popular prompt, as in ``router_peers``' ``kv_pressure`` trace), and ``burst_size`` sends
shared-prompt requests in bursts of siblings that arrive at the same instant.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from accel.block_hash import hash_prompt_blocks

VOCAB = 32000


@dataclass(frozen=True)
class WorkloadConfig:
    seed: int = 0
    block_size: int = 16
    duration_s: float = 120.0  # sessions start and shared-prefix requests arrive over this span
    # multi-turn chat
    num_sessions: int = 240
    num_turns: int = 8
    num_chat_system_prompts: int = 4
    chat_system_tokens: int = 384
    user_tokens: tuple[int, int] = (32, 192)
    answer_tokens: tuple[int, int] = (64, 256)
    think_s: float = 6.0  # mean pause after an answer before the next turn
    # shared system prompt
    num_groups: int = 24
    group_system_tokens: int = 1536
    num_shared_requests: int = 3000
    question_tokens: tuple[int, int] = (48, 160)
    shared_answer_tokens: tuple[int, int] = (32, 128)
    est_turn_s: float = 2.5  # a turn's expected latency, to space a session's turns
    session_context_tokens: tuple[int, int] = (0, 0)  # private context per chat session
    group_zipf_alpha: float = 0.0  # 0: groups equally popular; > 0: Zipf(alpha) over groups
    chat_zipf_alpha: float = 0.0  # 0: sessions take the chat system prompts in turn; > 0: Zipf draw
    burst_size: tuple[int, int] = (1, 1)  # shared-prompt requests per arrival instant
    # (0, 0): a chat turn decodes its whole answer; else it decodes this many tokens while the
    # next turn's history still carries the answer's length (router_peers' clients send a
    # synthetic answer and ask for few tokens: light load, prefill-dominated requests)
    chat_output_tokens: tuple[int, int] = (0, 0)


@dataclass(frozen=True)
class TraceRequest:
    arrival_s: float
    request_id: str
    session_id: str | None
    prompt_token_ids: tuple[int, ...]
    num_output_tokens: int
    prompt_hashes: tuple[int, ...]  # full blocks of the prompt
    full_hashes: tuple[int, ...]  # full blocks of prompt + answer (what the engine caches at the end)

    def text(self) -> str:
        """The prompt as characters, one per token (for char-level peers)."""
        return "".join(map(chr, (0x10000 + t for t in self.prompt_token_ids)))


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, VOCAB) for _ in range(n)]


def _request(
    cfg: WorkloadConfig, arrival_s: float, request_id: str, session: str | None, prompt: list[int], answer: list[int]
) -> TraceRequest:
    full = prompt + answer
    full_hashes = hash_prompt_blocks(full, cfg.block_size)
    num_prompt_blocks = len(prompt) // cfg.block_size
    return TraceRequest(
        arrival_s,
        request_id,
        session,
        tuple(prompt),
        len(answer),
        tuple(full_hashes[:num_prompt_blocks]),
        tuple(full_hashes),
    )


def make_trace(cfg: WorkloadConfig) -> list[TraceRequest]:
    """All requests of both shapes, sorted by arrival time."""
    rng = random.Random(cfg.seed)
    # Decode lengths of chat_output_tokens come from their own stream: the knob changes them only.
    output_rng = random.Random(f"{cfg.seed}/chat_output_tokens")
    trace: list[TraceRequest] = []
    chat_systems = [_tokens(rng, cfg.chat_system_tokens) for _ in range(cfg.num_chat_system_prompts)]
    chat_weights = [1.0 / (rank**cfg.chat_zipf_alpha) for rank in range(1, len(chat_systems) + 1)]
    for s in range(cfg.num_sessions):
        t = rng.uniform(0.0, cfg.duration_s)
        # (alpha 0 draws nothing here: the default trace stays what the weights were chosen on)
        system = (
            rng.choices(chat_systems, chat_weights)[0]
            if cfg.chat_zipf_alpha > 0
            else chat_systems[s % len(chat_systems)]
        )
        history = list(system)
        if cfg.session_context_tokens[1] > 0:
            history += _tokens(rng, rng.randint(*cfg.session_context_tokens))
        for k in range(cfg.num_turns):
            history += _tokens(rng, rng.randint(*cfg.user_tokens))
            answer = _tokens(rng, rng.randint(*cfg.answer_tokens))
            output = answer
            if cfg.chat_output_tokens[1] > 0:
                output = answer[: output_rng.randint(*cfg.chat_output_tokens)]
            trace.append(_request(cfg, t, f"chat-{s}-{k}", f"session-{s}", list(history), output))
            history += answer
            t += cfg.est_turn_s + rng.expovariate(1.0 / cfg.think_s)
    groups = [_tokens(rng, cfg.group_system_tokens) for _ in range(cfg.num_groups)]
    weights = [1.0 / (rank**cfg.group_zipf_alpha) for rank in range(1, cfg.num_groups + 1)]
    mean_burst = (cfg.burst_size[0] + cfg.burst_size[1]) / 2
    rate = cfg.num_shared_requests / cfg.duration_s / mean_burst  # bursts per second
    t, i = 0.0, 0
    while i < cfg.num_shared_requests:
        t += rng.expovariate(rate)
        # (the default shape draws exactly what it drew before these knobs: same trace, same seed)
        if cfg.group_zipf_alpha > 0:
            group = groups[rng.choices(range(cfg.num_groups), weights)[0]]
        else:
            group = groups[rng.randrange(cfg.num_groups)]
        size = rng.randint(*cfg.burst_size) if cfg.burst_size != (1, 1) else 1
        for _ in range(min(size, cfg.num_shared_requests - i)):
            prompt = group + _tokens(rng, rng.randint(*cfg.question_tokens))
            answer = _tokens(rng, rng.randint(*cfg.shared_answer_tokens))
            trace.append(_request(cfg, t, f"shared-{i}", None, prompt, answer))
            i += 1
    trace.sort(key=lambda r: (r.arrival_s, r.request_id))
    return trace
