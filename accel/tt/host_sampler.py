"""The host sampler: what the engine does with logits when the device does not sample.

Stage 0 (rows with a ``LogitsConstraint``): the grammar bitmask (before logprobs, as vLLM applies
it before its sampler), then allowed_token_ids and bad_words.
Stage 1 (logits processors, per row, in vLLM's order): logit_bias, min_tokens (eos and stop
token ids masked until ``min_tokens`` outputs exist), repetition / frequency / presence
penalties. Stage 2 (sampling): greedy rows take the argmax; random rows apply temperature,
min_p, top-k and top-p and draw with a generator seeded by ``(seed, position of the sampled
token)`` when the request has a seed (so a seeded request reproduces whatever else shares its
batches; the torch mesh program seeds its rows the same way), else with the engine's generator.
Logprobs are the model's raw log-softmax (vLLM's default ``raw_logprobs``), with the top-k
alternatives best first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from accel.contract import SamplingParams, TokenLogprob
from accel.structured.constraint import LogitsConstraint, mask_grammar, mask_token_lists
from accel.tt.sampling_rules import normalize_top_k, row_seed
from accel.tt.step_plan import PENDING_TOKEN, RowPlan


@dataclass(frozen=True)
class HostSample:
    token_ids: tuple[int, ...]  # one per input row
    logprobs: tuple[TokenLogprob | None, ...] | None  # None when no row asked for them


def _needs_processing(sp: SamplingParams, num_output_tokens: int) -> bool:
    return bool(sp.logit_bias) or sp.has_penalties or num_output_tokens < sp.min_tokens


def row_generator(seed: int, position: int) -> torch.Generator:
    gen = torch.Generator()
    gen.manual_seed(row_seed(seed, position))
    return gen


def sample_on_host(
    logits: torch.Tensor,
    rows: Sequence[RowPlan],
    default_generator: torch.Generator,
    eos_token_ids: frozenset[int],
    constraints: Sequence[LogitsConstraint | None] | None = None,
) -> HostSample:
    """Sample one token per row from ``logits`` float ``[n, vocab]`` (row i <-> ``rows[i]``);
    ``constraints[i]`` masks row i (None: no row is constrained)."""
    assert logits.dim() == 2 and logits.shape[0] == len(rows)
    logits = logits.float()
    if constraints is not None:
        logits = logits.clone()  # never write into the program's output
        mask_grammar(logits, constraints)
    raw_logprobs = None
    if any(r.sampling.logprobs is not None for r in rows):
        raw_logprobs = torch.log_softmax(logits, dim=-1)
    if constraints is not None:
        mask_token_lists(logits, constraints)
    if any(_needs_processing(r.sampling, r.num_output_tokens) for r in rows):
        logits = logits if constraints is not None else logits.clone()
        for i, r in enumerate(rows):
            _apply_processors(logits[i], r, eos_token_ids)
    token_ids = logits.argmax(dim=-1)
    random_idx = [i for i, r in enumerate(rows) if not r.sampling.is_greedy]
    if random_idx:
        probs = _filtered_probs(logits[random_idx], [rows[i].sampling for i in random_idx])
        for j, i in enumerate(random_idx):
            seed = rows[i].sampling.seed
            gen = default_generator if seed is None else row_generator(seed, rows[i].end_pos)
            token_ids[i] = torch.multinomial(probs[j], 1, generator=gen)[0]
    ids = tuple(int(t) for t in token_ids.tolist())
    if raw_logprobs is None:
        return HostSample(ids, None)
    return HostSample(
        ids,
        tuple(
            _token_logprob(raw_logprobs[i], ids[i], r.sampling.logprobs) if r.sampling.logprobs is not None else None
            for i, r in enumerate(rows)
        ),
    )


def _apply_processors(x: torch.Tensor, row: RowPlan, eos_token_ids: frozenset[int]) -> None:
    """In place on one row's logits ``[vocab]``."""
    sp = row.sampling
    vocab = x.shape[0]
    for token_id, bias in sp.logit_bias:
        if token_id < vocab:
            x[token_id] += bias
    if row.num_output_tokens < sp.min_tokens:
        banned = set(sp.stop_token_ids) | (set() if sp.ignore_eos else set(eos_token_ids))
        banned_ids = [t for t in banned if t < vocab]
        if banned_ids:
            x[banned_ids] = float("-inf")
    if sp.has_penalties and row.history_token_ids is not None:
        history = [t for t in row.history_token_ids if t != PENDING_TOKEN]
        num_prompt = len(history) - row.num_output_tokens
        _apply_penalties(x, history, max(num_prompt, 0), sp)


def _apply_penalties(x: torch.Tensor, history: Sequence[int], num_prompt: int, sp: SamplingParams) -> None:
    vocab = x.shape[0]
    if sp.repetition_penalty != 1.0 and history:
        seen = torch.tensor(sorted(set(history)), dtype=torch.long)
        seen = seen[seen < vocab]
        vals = x[seen]
        x[seen] = torch.where(vals > 0, vals / sp.repetition_penalty, vals * sp.repetition_penalty)
    outputs = history[num_prompt:]
    if outputs and (sp.frequency_penalty != 0 or sp.presence_penalty != 0):
        counts = torch.bincount(torch.tensor(outputs, dtype=torch.long), minlength=vocab)[:vocab]
        x -= sp.frequency_penalty * counts.float() + sp.presence_penalty * (counts > 0).float()


def _filtered_probs(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Probabilities ``[m, vocab]`` after temperature, min_p, top-k and top-p."""
    vocab = logits.shape[-1]
    temp = torch.tensor([sp.temperature for sp in params], dtype=logits.dtype)
    x = logits / temp[:, None]
    min_p = torch.tensor([sp.min_p for sp in params], dtype=x.dtype)
    if bool((min_p > 0).any()):
        p = torch.softmax(x, dim=-1)
        x = x.masked_fill(p < min_p[:, None] * p.max(dim=-1, keepdim=True).values, float("-inf"))
    sorted_x, order = x.sort(dim=-1, descending=True)
    top_k = torch.tensor([normalize_top_k(sp.top_k, vocab) for sp in params])
    ranks = torch.arange(vocab)[None, :]
    sorted_x = sorted_x.masked_fill(ranks >= top_k[:, None], float("-inf"))
    top_p = torch.tensor([sp.top_p for sp in params], dtype=x.dtype)
    if bool((top_p < 1).any()):
        p = torch.softmax(sorted_x, dim=-1)
        beyond = (p.cumsum(dim=-1) - p) > top_p[:, None]  # always keeps the first token
        sorted_x = sorted_x.masked_fill(beyond, float("-inf"))
    probs_sorted = torch.softmax(sorted_x, dim=-1)
    return torch.zeros_like(probs_sorted).scatter_(-1, order, probs_sorted)


def _token_logprob(logprobs: torch.Tensor, token_id: int, num_top: int) -> TokenLogprob:
    top: tuple[tuple[int, float], ...] = ()
    if num_top > 0:
        vals, idx = logprobs.topk(num_top)
        top = tuple(zip((int(i) for i in idx.tolist()), (float(v) for v in vals.tolist())))
    return TokenLogprob(token_id=token_id, logprob=float(logprobs[token_id]), top=top)
