"""``EngineReplica.metrics_snapshot``: the vllm:* series the replica keeps for its engine (counts of
the requests it served), or, for an engine with vLLM's own stat logger, vLLM's series from the
process's prometheus_client registry under the served model's name."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml
from prometheus_client import REGISTRY, Counter

from accel.contract import GenerateRequest, SamplingParams
from deployments.config.load import load_app_config
from deployments.replicas.engine_replica import EngineReplica
from tests.doubles.hf_replay_engine import HFReplayEngine


@pytest.fixture(scope="module")
def pool(tiny_llama):
    args = yaml.safe_load((Path(__file__).parents[3] / "configs/tiny.yaml").read_text())["applications"][0]["args"]
    return load_app_config(args).pools[0]


def _engine(p):
    return HFReplayEngine(str(p.model_path), p.max_model_len, 0.0, block_size=p.block_size)


def _value(snapshot, name, **labels):
    family = snapshot.family(name)
    assert family is not None, name
    return sum(s.value for s in family.series if all(s.label(k) == v for k, v in labels.items()))


def test_the_replica_counts_what_it_served_under_vllms_names(pool):
    async def run():
        replica = EngineReplica(pool, _engine)
        for i, n in enumerate((3, 5)):
            req = GenerateRequest(f"r{i}", (0, 5, 6, 7), SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
            _ = [d async for d in replica.generate(req)]
        snap = replica.metrics_snapshot()
        await replica.shutdown()
        return snap

    snap = asyncio.run(run())
    assert _value(snap, "vllm:prompt_tokens", model_name="tiny-llama", engine="0") == 8
    assert _value(snap, "vllm:generation_tokens") == 8
    assert _value(snap, "vllm:request_success", finished_reason="length") == 2
    (ttft,) = snap.family("vllm:time_to_first_token_seconds").series
    assert ttft.count == 2


def test_an_engine_with_vllms_own_logger_is_read_from_the_process_registry(pool):
    counter = Counter("vllm:test_only_tokens", "Test.", ["model_name", "engine"], registry=REGISTRY)
    try:
        counter.labels("/path/to/checkpoint", "0").inc(4)
        replica = EngineReplica(pool, _engine, emit_vllm_metrics=False)
        snap = replica.metrics_snapshot()
        assert [f.name for f in snap.families if f.name == "vllm:test_only_tokens"] == ["vllm:test_only_tokens"]
        assert {s.label("model_name") for f in snap.families for s in f.series} <= {"tiny-llama", None}
        assert _value(snap, "vllm:test_only_tokens", model_name="tiny-llama", engine="0") == 4
        asyncio.run(replica.shutdown())
    finally:
        REGISTRY.unregister(counter)
