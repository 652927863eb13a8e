"""The sampler inside the torch mesh program (what tt-metal's on-device sampler does).

Two stages: ``prepare_sampling`` turns per-row ``TTSamplingParams`` lists into tensors on the host
(§6 normalization: ``top_k <= 0`` or ``>= vocab`` -> vocab, ``top_k == 1`` or temperature 0 ->
greedy); ``sample`` is the pure device-side function. Like the device, it draws from a fixed
candidate set of the ``max_top_k`` (32) largest logits, then applies per-row top-k, top-p and
temperature. Seeded rows (``seed`` not None) draw from a generator seeded by ``(seed, position)``, so a
seeded request reproduces regardless of slot, batch composition or host/device history; unseeded
rows share the program's generator. Logprobs are of the sampled token under the raw logits
(vLLM's default ``raw_logprobs``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from accel.tt.mesh_model import TTSamplingParams
from accel.tt.sampling_rules import normalize_top_k, row_seed

NO_LOGPROBS = -2


@dataclass(frozen=True)
class SampledOutput:
    """The program's sampler result (on its device): token ids int64 ``[rows]``; ``logprobs``
    float ``[rows]`` of the sampled tokens, or None when no row enabled log probs. The model
    hands it out in tt-metal's form (``tokens`` or ``(tokens, logprobs)``)."""

    token_ids: torch.Tensor
    logprobs: torch.Tensor | None = None

    def as_tt_output(self) -> Any:
        tokens = self.token_ids.cpu()
        return tokens if self.logprobs is None else (tokens, self.logprobs.float().cpu())


@dataclass(frozen=True)
class PreparedSampling:
    """Per-row tensors ``[rows]`` on the program's device; positions are host ints for seeding."""

    temperature: torch.Tensor  # float; 0 = greedy
    top_k: torch.Tensor  # int64, normalized
    top_p: torch.Tensor  # float
    is_greedy: torch.Tensor  # bool
    is_all_greedy: bool  # every row greedy: the program takes the argmax and skips the candidate draw
    seeds: tuple[int | None, ...]  # None = unseeded
    positions: tuple[int, ...]  # position of the token being sampled (seeds the row generator)
    wants_logprobs: bool


def prepare_sampling(
    params: TTSamplingParams, positions: Sequence[int], vocab_size: int, device: torch.device
) -> PreparedSampling:
    rows = len(positions)
    names = ("temperature", "top_k", "top_p", "seed", "num_logprobs", "enable_log_probs")
    fields = {name: list(getattr(params, name)) for name in names}
    for name, values in fields.items():
        if len(values) != rows:
            raise ValueError(f"sampling_params.{name} has {len(values)} rows, the batch has {rows}")
    _refuse_penalties(params, rows)
    top_k = [normalize_top_k(int(k), vocab_size) for k in fields["top_k"]]
    temperature = [float(t) for t in fields["temperature"]]
    greedy = [k == 1 or t <= 0.0 for k, t in zip(top_k, temperature)]
    seeds = tuple(None if s is None else int(s) for s in fields["seed"])
    return PreparedSampling(
        temperature=torch.tensor([1.0 if g else t for g, t in zip(greedy, temperature)], device=device),
        top_k=torch.tensor(top_k, dtype=torch.int64, device=device),
        # top_k == 1 collapses the nucleus (tt-metal #46827); greedy rows never reach top-p anyway.
        top_p=torch.tensor([0.0 if g else float(p) for g, p in zip(greedy, fields["top_p"])], device=device),
        is_greedy=torch.tensor(greedy, dtype=torch.bool, device=device),
        is_all_greedy=all(greedy),
        seeds=seeds,
        positions=tuple(int(p) for p in positions),
        wants_logprobs=any(bool(e) for e in fields["enable_log_probs"]),
    )


class DecodeSamplingCache:
    """``prepare_sampling`` for decode, reusing the last result while the params stay the same.

    A steady decode batch passes the same per-slot params every step and only the positions move;
    rebuilding the tensors each step sits on the critical path between two device steps. The
    params' values (not their identity: the lists are mutable) are compared each call."""

    def __init__(self, vocab_size: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self._key: tuple[tuple[Any, ...], ...] | None = None
        self._prep: PreparedSampling | None = None

    def prepare(self, params: TTSamplingParams, positions: Sequence[int]) -> PreparedSampling:
        key = tuple(tuple(getattr(params, f.name)) for f in fields(params))
        if key != self._key or self._prep is None:
            self._prep = prepare_sampling(params, positions, self.vocab_size, self.device)
            self._key = key
            return self._prep
        if len(positions) != len(self._prep.positions):
            raise ValueError(f"sampling params have {len(self._prep.positions)} rows, the batch has {len(positions)}")
        return replace(self._prep, positions=tuple(int(p) for p in positions))


def _refuse_penalties(params: TTSamplingParams, rows: int) -> None:
    # The program has no token history (no prompt_tokens/output_tokens inputs), so penalties are
    # the host sampler's job; silently ignoring them would sample the wrong distribution.
    for name in ("presence_penalty", "frequency_penalty", "repetition_penalty"):
        default = TTSamplingParams.PAD_DEFAULTS[name]
        values = list(getattr(params, name))
        if len(values) != rows:
            raise ValueError(f"sampling_params.{name} has {len(values)} rows, the batch has {rows}")
        if any(float(v) != default for v in values):
            raise ValueError(f"the torch mesh program does not apply {name}; sample those batches on the host")


def sample(logits: torch.Tensor, prep: PreparedSampling, generator: torch.Generator, max_top_k: int) -> SampledOutput:
    """``logits`` ``[rows, vocab]`` -> token ids int64 ``[rows]`` (+ logprobs ``[rows]``)."""
    logits = logits.float()
    if prep.is_all_greedy:
        # Same token as the candidate path's rank 0 (the largest logit; on an exact tie the
        # first index, as HF's argmax), without top-k, softmax or noise.
        token_ids = logits.argmax(dim=-1)
        logprobs = None
        if prep.wants_logprobs:
            logprobs = logits.log_softmax(dim=-1).gather(1, token_ids[:, None]).squeeze(1)
        return SampledOutput(token_ids=token_ids, logprobs=logprobs)
    num_candidates = min(max_top_k, logits.shape[-1])
    values, indices = logits.topk(num_candidates, dim=-1)  # sorted, descending
    rank = torch.arange(num_candidates, device=logits.device)
    scaled = values / prep.temperature[:, None]
    scaled = scaled.masked_fill(rank[None, :] >= prep.top_k[:, None], float("-inf"))
    probs = scaled.softmax(dim=-1)
    # Nucleus: drop a candidate once the mass before it already reaches top_p (the first one stays).
    mass_before = probs.cumsum(dim=-1) - probs
    probs = probs.masked_fill((mass_before > prep.top_p[:, None]) & (rank[None, :] > 0), 0.0)
    # Exponential race (argmax p / E) == sampling from p; E drawn per row.
    noise = _exponential_noise(probs.shape, prep, generator, logits.device)
    choice = (probs / noise).argmax(dim=-1)
    choice = torch.where(prep.is_greedy, torch.zeros_like(choice), choice)
    token_ids = indices.gather(1, choice[:, None]).squeeze(1)
    logprobs = None
    if prep.wants_logprobs:
        logprobs = logits.log_softmax(dim=-1).gather(1, token_ids[:, None]).squeeze(1)
    return SampledOutput(token_ids=token_ids, logprobs=logprobs)


def _exponential_noise(
    shape: torch.Size, prep: PreparedSampling, generator: torch.Generator, device: torch.device
) -> torch.Tensor:
    noise = torch.empty(shape, device=device).exponential_(generator=generator)
    seeded = [(i, s) for i, s in enumerate(prep.seeds) if s is not None]
    if seeded:
        row_gen = torch.Generator(device=device)
        for i, seed in seeded:
            row_gen.manual_seed(row_seed(seed, prep.positions[i]))
            noise[i] = torch.empty(shape[1], device=device).exponential_(generator=row_gen)
    return noise.clamp_min_(1e-10)
