"""One conversation turn as the router e2e tests send it: a greedy completion of the whole history
under an ``x-session-id``, and the synthetic user messages appended between turns."""

from __future__ import annotations

import httpx


def user_tokens(conversation: int, turn: int, n: int) -> list[int]:
    """``n`` token ids of conversation ``conversation``'s user message at ``turn`` (distinct per both)."""
    return [3 + (conversation * 131 + turn * 37 + i * 11) % 1000 for i in range(n)]


def session_turn(http: httpx.Client, base_url: str, session: str, history: list[int], max_tokens: int = 6) -> list[int]:
    """``POST /v1/completions`` of ``history`` (greedy, exactly ``max_tokens``) in ``session``;
    the answer's token ids."""
    r = http.post(
        f"{base_url}/v1/completions",
        headers={"x-session-id": session},
        json={
            "model": "tiny-llama",
            "prompt": history,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "return_token_ids": True,
        },
    )
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["token_ids"]
