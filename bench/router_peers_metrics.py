"""What ``bench/router_peers.py`` reads off the systems' ``/metrics``: the engines' own TTFT
(vLLM's histogram, on the workers or on our stack), our router's decisions by reason, and a
worker's requests in its engine (the peers' load samples)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence

import httpx

_TTFT = re.compile(r"^vllm:time_to_first_token_seconds_(sum|count)(?:\{[^}]*\})?\s+([0-9.eE+-]+)$", re.MULTILINE)


def engine_ttft_totals(metrics_texts: Sequence[str]) -> tuple[float, float]:
    """(sum of seconds, count) of ``vllm:time_to_first_token_seconds`` over every label set of
    every text: the engines' own TTFT (a request's arrival in the engine's front to its first
    token), which leaves out whatever a router or stack adds before and after."""
    total = {"sum": 0.0, "count": 0.0}
    for text in metrics_texts:
        for kind, value in _TTFT.findall(text):
            total[kind] += float(value)
    return total["sum"], total["count"]


async def read_engine_ttft(metrics_urls: Sequence[str]) -> tuple[float, float]:
    """``engine_ttft_totals`` over every ``/metrics`` URL of one system (its engines, or our stack)."""
    async with httpx.AsyncClient(timeout=30) as http:
        texts = await asyncio.gather(*(http.get(u) for u in metrics_urls))
    return engine_ttft_totals([t.text for t in texts])


def engine_ttft_mean_s(before: tuple[float, float], after: tuple[float, float]) -> float | None:
    """The engines' mean TTFT between two ``read_engine_ttft`` scrapes (the histogram's sum and
    count deltas); None when no engine TTFT was observed between them."""
    count = after[1] - before[1]
    return (after[0] - before[0]) / count if count > 0 else None


_DECISIONS = re.compile(
    r'^meshserve:router_decisions_total\{[^}]*reason="([^"]+)"[^}]*\}\s+([0-9.eE+-]+)$', re.MULTILINE
)


def decision_counts(metrics_text: str) -> dict[str, float]:
    """Our router's decisions so far by reason (``meshserve:router_decisions``, summed over pools)."""
    out: dict[str, float] = {}
    for reason, value in _DECISIONS.findall(metrics_text):
        out[reason] = out.get(reason, 0.0) + float(value)
    return out


async def read_decisions(url: str) -> dict[str, float]:
    """``decision_counts`` of our stack's /metrics."""
    async with httpx.AsyncClient(timeout=30) as http:
        return decision_counts((await http.get(url + "/metrics")).text)


_GAUGE = re.compile(r"^vllm:num_requests_(running|waiting)\{[^}]*\}\s+([0-9.eE+-]+)$", re.MULTILINE)


async def worker_load(http: httpx.AsyncClient, worker_url: str) -> int:
    """Requests in the worker's engine now (running + waiting), from its /metrics gauges."""
    text = (await http.get(worker_url + "/metrics", timeout=5)).text
    return int(sum(float(v) for _, v in _GAUGE.findall(text)))
