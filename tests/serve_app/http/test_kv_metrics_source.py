"""The KV-connector actor as a /metrics source: nothing before the actor exists, its stats as
meshserve:kv_* series, a failed call answered with its error and the actor looked up again."""

from __future__ import annotations

import asyncio

from serve_app.http.kv_metrics_source import KVConnectorSource

STATS = {
    "registry": {
        "num_transfers": 0,
        "num_bytes_used": 0,
        "capacity_bytes": 10,
        "num_expired": 0,
        "num_rejected": 0,
        "num_completed": 4,
        "recomputes": {},
    }
}


class _Method:
    def __init__(self, answers):
        self.answers = answers

    def remote(self):
        answer = self.answers.pop(0)

        async def call():
            if isinstance(answer, Exception):
                raise answer
            return answer

        return call()


class _Client:
    def __init__(self, answers):
        self.handle = type("Handle", (), {"stats": _Method(answers)})()


def test_no_actor_yet_answers_nothing():
    def lookup(app):
        raise ValueError(f"no actor for {app}")

    assert asyncio.run(KVConnectorSource("app", lookup).metrics_snapshots(1.0)) == []


def test_stats_become_series_and_a_failure_looks_the_actor_up_again():
    lookups = []
    clients = [_Client([STATS, RuntimeError("actor died")]), _Client([STATS])]

    def lookup(app):
        lookups.append(app)
        return clients[len(lookups) - 1]

    source = KVConnectorSource("app", lookup)

    async def scrape():
        return [await source.metrics_snapshots(1.0) for _ in range(3)]

    first, failed, again = asyncio.run(scrape())
    completed = first[0].family("meshserve:kv_transfers").series[0]
    assert (completed.label("outcome"), completed.value) == ("completed", 4.0)
    assert isinstance(failed[0], RuntimeError)
    assert again[0].family("meshserve:kv_transfers") is not None
    assert lookups == ["app", "app"]
