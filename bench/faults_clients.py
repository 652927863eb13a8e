"""The fault suite's HTTP clients (``bench/faults.py``): request bodies, the uninterrupted
reference run of a prompt, a stream that records its outcome (completed / failed / hung) and
tokens, a client that leaves mid-stream, and distinct prompts inside the tiny vocabulary.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx


def body(prompt: list[int], max_tokens: int, stream: bool) -> dict[str, Any]:
    return {
        "model": "tiny-llama",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
        "stream": stream,
        **({"stream_options": {"include_usage": True}} if stream else {}),
    }


def _pinned(pool: str | None) -> dict[str, str]:
    return {"x-meshserve-pool": pool} if pool else {}  # None: the router decides (PD apps)


async def reference(
    client: httpx.AsyncClient, url: str, pool: str | None, prompt: list[int], max_tokens: int
) -> list[int]:
    r = await client.post(url, json=body(prompt, max_tokens, False), headers=_pinned(pool))
    r.raise_for_status()
    ids: list[int] = r.json()["choices"][0]["token_ids"]
    return ids


async def stream(
    client: httpx.AsyncClient,
    url: str,
    pool: str | None,
    prompt: list[int],
    max_tokens: int,
    started: asyncio.Event,
    hang_s: float,
) -> dict[str, Any]:
    tokens: list[int] = []
    usage = None
    try:
        async with client.stream("POST", url, json=body(prompt, max_tokens, True), headers=_pinned(pool)) as r:
            if r.status_code != 200:
                return {"outcome": "failed", "status": r.status_code, "tokens": tokens}
            lines = r.aiter_lines()
            while True:
                try:
                    line = await asyncio.wait_for(lines.__anext__(), hang_s)
                except StopAsyncIteration:
                    break
                except asyncio.TimeoutError:
                    return {"outcome": "hung", "tokens": tokens}
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    return {"outcome": "failed", "error": event["error"].get("message"), "tokens": tokens}
                if event.get("usage"):
                    usage = event["usage"]
                for choice in event.get("choices", []):
                    tokens.extend(choice.get("token_ids") or [])
                if tokens:
                    started.set()
    except httpx.HTTPError as exc:
        return {"outcome": "failed", "error": type(exc).__name__, "tokens": tokens}
    finally:
        started.set()  # a stream that ended (or never began) does not hold the kill back
    return {"outcome": "completed", "tokens": tokens, "usage": usage}


def prompts(n: int) -> list[list[int]]:
    # Distinct prompts whose token ids stay inside the tiny model's vocabulary (1,024).
    return [
        [1, (100 + 7 * i) % 1000 + 3, (200 + 11 * i) % 1000 + 3, 31 * i % 1000 + 3, 42, i % 1000 + 3] for i in range(n)
    ]


async def disconnecting_client(
    client: httpx.AsyncClient, url: str, pool: str, prompt: list[int], max_tokens: int, leave_after: int | None
) -> str:
    """One streamed request; ``leave_after`` chunks then the client goes away (None: read it all)."""
    try:
        async with client.stream(
            "POST", url, json=body(prompt, max_tokens, True), headers={"x-meshserve-pool": pool}
        ) as r:
            if r.status_code != 200:
                return f"status_{r.status_code}"
            n = 0
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    n += 1
                    if leave_after is not None and n >= leave_after:
                        return "disconnected"
        return "completed"
    except httpx.HTTPError as exc:
        return type(exc).__name__
