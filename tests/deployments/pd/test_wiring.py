"""What a prefill/decode replica is wired with, by KV path (the Ray-free cases)."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from deployments.config.load import load_app_config
from deployments.pd.native_handoff import NativeKVHandoff
from deployments.pd.wiring import native_kv_handoff, vllm_kv_transfer_config

CONFIGS = Path(__file__).parents[3] / "configs"


def _config(name):
    return copy.deepcopy(yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())["applications"][0]["args"])


def test_tpu_pools_load_their_own_connector_and_hand_params_through_the_actor():
    prefill, decode = load_app_config(_config("tpu_pd")).pools
    assert vllm_kv_transfer_config(prefill) == {
        "kv_connector": "TPUConnector",
        "kv_role": "kv_producer",
        "kv_connector_module_path": "tpu_inference.distributed.tpu_connector",
    }
    assert vllm_kv_transfer_config(decode)["kv_role"] == "kv_consumer"
    assert isinstance(native_kv_handoff(prefill), NativeKVHandoff)
    assert isinstance(native_kv_handoff(decode), NativeKVHandoff)


def test_colocated_pools_get_neither():
    pools = load_app_config(_config("local")).pools
    assert all(p.role == "both" for p in pools)
    assert all(vllm_kv_transfer_config(p) is None and native_kv_handoff(p) is None for p in pools)
    tt_galaxy = load_app_config(_config("hetero_pd")).pool("tt-galaxy")
    assert native_kv_handoff(tt_galaxy) is None
