"""End to end: ``GET /metrics`` on the API port against a bare vLLM 0.32 server on the same tiny
checkpoint. Our stack is ``configs/tiny.yaml`` (two TT-engine replicas and one vLLM-CPU replica);
the same completions go to each (ours: some pinned to each pool, some routed), and both are
scraped before and after.

Equal: every ``vllm:`` family bare vLLM exports exists in ours with the same type and at least
its label names; what the requests added to ``vllm:prompt_tokens``, ``vllm:generation_tokens``,
``vllm:request_success`` and the count of ``vllm:e2e_request_latency_seconds`` (ours summed over
the replicas of both engine kinds) equals bare vLLM's and the requests' usage. Both bodies are
read with prometheus_client's text parser.
"""

from __future__ import annotations

import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.doubles.app_args import MODEL, local_app_args, pin
from tests.doubles.deployed_app import deployed_app
from tests.e2e.bare_vllm import bare_vllm_server

pytestmark = pytest.mark.slow

APP = "meshserve-e2e-metrics"
BARE_ARGS = {
    "max_model_len": 512,
    "max_num_seqs": 8,
    "dtype": "float32",
    "enforce_eager": True,
    "enable_prefix_caching": True,
    "block_size": 32,
}
# (prompt token ids, max_tokens): ignore_eos, so each answer has max_tokens tokens.
REQUESTS = [((5, 6, 7, 8), 3), ((9, 10, 11, 12, 13, 14), 5), ((20, 21), 1), ((30, 31, 32, 33, 34), 4)]
POOL_PINS = [pin("tt"), pin("vllm"), {}, pin("tt")]  # ours: both engine kinds, and the router's choice
COUNTED = ("vllm:prompt_tokens", "vllm:generation_tokens", "vllm:request_success", "vllm:e2e_request_latency_seconds")


def _scrape(url: str) -> dict[str, dict]:
    """Family name -> {"type", "labels" (label names, ``le`` aside), "samples" [(name, labels, value)]}."""
    body = httpx.get(f"{url}/metrics", timeout=30)
    assert body.status_code == 200, body.text
    out: dict[str, dict] = {}
    for family in text_string_to_metric_families(body.text):
        labels = {k for s in family.samples for k in s.labels if k != "le"}
        out[family.name] = {"type": family.type, "labels": labels, "samples": family.samples}
    return out


def _totals(scrape: dict[str, dict]) -> dict[str, float]:
    """What the counted families hold for the model: tokens and successes summed over series;
    the e2e histogram's count."""
    want = {
        "vllm:prompt_tokens": "vllm:prompt_tokens_total",
        "vllm:generation_tokens": "vllm:generation_tokens_total",
        "vllm:request_success": "vllm:request_success_total",
        "vllm:e2e_request_latency_seconds": "vllm:e2e_request_latency_seconds_count",
    }
    out = {}
    for family, sample_name in want.items():
        samples = scrape.get(family, {"samples": []})["samples"]
        out[family] = sum(s.value for s in samples if s.name == sample_name and s.labels.get("model_name") == MODEL)
    return out


def _send(url: str, headers: list[dict[str, str]]) -> dict[str, float]:
    """The completions, and what they should add: prompt and generated tokens from the usage."""
    prompt = generated = 0
    for (ids, max_tokens), extra in zip(REQUESTS, headers):
        body = {"model": MODEL, "prompt": list(ids), "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
        r = httpx.post(f"{url}/v1/completions", json=body, headers=extra, timeout=120)
        assert r.status_code == 200, r.text
        prompt += r.json()["usage"]["prompt_tokens"]
        generated += r.json()["usage"]["completion_tokens"]
    n = len(REQUESTS)
    return {COUNTED[0]: prompt, COUNTED[1]: generated, COUNTED[2]: n, COUNTED[3]: n}


def _added(url: str, headers: list[dict[str, str]]) -> tuple[dict[str, float], dict[str, float], dict[str, dict]]:
    """(expected from usage, what the scrapes show was added, the last scrape); the counts of
    a request may land a moment after its response (vLLM records them after the output), so the
    scrape is repeated for up to 15 s until they match."""
    before = _totals(_scrape(url))
    expected = _send(url, headers)
    deadline = time.monotonic() + 15
    while True:
        scrape = _scrape(url)
        added = {k: v - before[k] for k, v in _totals(scrape).items()}
        if added == expected or time.monotonic() > deadline:
            return expected, added, scrape
        time.sleep(0.5)


@pytest.fixture(scope="module")
def reference(tiny_llama, tmp_path_factory) -> tuple[dict, dict, dict]:
    log = tmp_path_factory.mktemp("bare") / "vllm.log"
    with bare_vllm_server(tiny_llama, MODEL, BARE_ARGS, log) as url:
        return _added(url, [{}] * len(REQUESTS))


@pytest.fixture(scope="module")
def ours(serve_session, reference) -> tuple[dict, dict, dict, str]:
    with deployed_app(serve_session, APP, local_app_args(), "/e2e-metrics", engine_replicas=3) as url:
        yield (*_added(url, POOL_PINS), url)


def test_every_vllm_family_of_bare_vllm_is_ours_with_its_labels(reference, ours):
    theirs, mine = reference[2], ours[2]
    vllm_families = {name: f for name, f in theirs.items() if name.startswith("vllm:")}
    assert len(vllm_families) > 20
    missing = sorted(name for name in vllm_families if name not in mine)
    assert not missing, missing
    for name, family in vllm_families.items():
        assert mine[name]["type"] == family["type"], name
        assert family["labels"] <= mine[name]["labels"], (name, family["labels"] - mine[name]["labels"])


def test_requests_add_the_same_counts_as_on_bare_vllm(reference, ours):
    expected_bare, added_bare, _ = reference
    expected_ours, added_ours = ours[0], ours[1]
    assert expected_ours == expected_bare  # the same requests, the same usage
    assert added_bare == expected_bare
    assert added_ours == expected_ours


def _tt_steps(scrape: dict[str, dict]) -> float:
    samples = scrape["meshserve:engine_steps"]["samples"]
    return sum(s.value for s in samples if s.name == "meshserve:engine_steps_total")


def test_both_engine_kinds_report_and_meshserve_series_follow(ours):
    """Replicas that answered the scrape, TT step statistics, the router's decisions and view."""
    scrape, url = ours[2], ours[3]
    replicas = {
        (s.labels["pool"], s.labels["outcome"]): s.value for s in scrape["meshserve:metrics_replicas"]["samples"]
    }
    assert replicas == {("tt", "ok"): 2, ("tt", "failed"): 0, ("vllm", "ok"): 1, ("vllm", "failed"): 0}
    deadline = time.monotonic() + 10  # (TT step statistics are published once a second)
    while _tt_steps(scrape) == 0 and time.monotonic() < deadline:
        time.sleep(0.5)
        scrape = _scrape(url)
    assert _tt_steps(scrape) > 0  # summed over the TT replicas
    decisions = scrape["meshserve:router_decisions"]["samples"]
    assert (
        sum(s.value for s in decisions if s.name == "meshserve:router_decisions_total") >= 3
    )  # (a TT pin decides too)
    known = {s.labels["pool"]: s.value for s in scrape["meshserve:router_known_replicas"]["samples"]}
    assert known == {"tt": 2, "vllm": 1}
    engines = {s.labels["engine"] for s in scrape["vllm:num_requests_running"]["samples"]}
    assert engines == {"0"}  # one series per engine index, summed over replicas as vLLM names it
