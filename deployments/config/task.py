"""Which requests a pool's engine serves: ``generate`` (completions, chat, responses) or
``embed`` (embeddings: a vLLM pool running vLLM's pooling runner).

A vLLM pool is a pooling pool when its engine args say so as ``vllm serve`` spells them:
``runner: pooling`` (for an embedding checkpoint, or with ``convert: embed`` on a decoder one)
or ``convert: embed`` alone. A ``convert: classify`` pool runs pooling too but serves no
embeddings, so it takes neither task here. TT pools run generative models only.
"""

from __future__ import annotations

from typing import Literal

from accel.tt.config import TTEngineConfig
from accel.vllm.config import VllmEngineConfig

PoolTask = Literal["generate", "embed"]


def pool_tasks(engine_config: TTEngineConfig | VllmEngineConfig) -> frozenset[PoolTask]:
    """The tasks a pool with ``engine_config`` serves."""
    if isinstance(engine_config, TTEngineConfig):
        return frozenset({"generate"})
    extra = engine_config.extra_args or {}
    runner, convert = extra.get("runner"), extra.get("convert")
    if runner == "pooling" or convert in ("embed", "classify"):
        return frozenset({"embed"}) if convert in (None, "auto", "none", "embed") else frozenset()
    return frozenset({"generate"})
