"""App config, TPU pools: both backends, their own prefill/decode and offload connectors, and
the refusals naming the file and the key."""

from __future__ import annotations

import pytest

from accel.contract import ConfigError
from deployments.config.load import load_app_config
from tests.deployments.config.config_files import config_args as _args
from tests.deployments.config.config_files import tpu_pd_args


def test_tpu_pd_pools_take_their_own_connector():
    cfg = load_app_config(tpu_pd_args())
    prefill, decode = cfg.pools
    assert (prefill.role, prefill.kv_connector) == ("prefill", "TPUConnector")
    assert (decode.role, decode.kv_connector) == ("decode", "TPUConnector")
    assert load_app_config(_args()).pools[0].kv_connector is None


@pytest.mark.parametrize(
    "mutate, message",
    [
        # a TT mesh decode pool: PD on ttnn is refused at config time (KV moves as torch tensors)
        (
            lambda a: a["pools"][1].update(
                engine="tt", accelerator="tt", tt={"mesh_device": "TG"}, tpu=None, engine_args={"max_model_len": 32768}
            ),
            r"configs/tpu_pd.yaml: pools\[1\].role: prefill/decode disaggregation is not supported on a "
            r"Tenstorrent mesh yet .*use role: both for pool 'v6e-decode'",
        ),
        # TPU prefill -> TT (torch program) decode: no KV path between them (the prefill slice would idle)
        (
            lambda a: a["pools"][1].update(
                engine="tt", accelerator="cpu", tpu=None, engine_args={"max_model_len": 256}
            ),
            r"configs/tpu_pd.yaml: pools\[0\].role: prefill pool 'v6e-prefill' cannot take part in prefill/decode "
            r"disaggregation: its KV path \(native:TPUConnector\) differs from pool 'v6e-decode'"
            r".*TPU backends accept only",
        ),
        # a TPU prefill/decode pool without TPUConnector
        (
            lambda a: a["pools"][1]["engine_args"].pop("kv_transfer_config"),
            r"configs/tpu_pd.yaml: pools\[1\].engine_args.kv_transfer_config: a TPU pool with role decode needs its "
            r"backend's own prefill/decode connector .*kv_role: kv_consumer\}; got none",
        ),
        (
            lambda a: a["pools"][0]["engine_args"]["kv_transfer_config"].update(kv_connector="MeshServeConnector"),
            r"configs/tpu_pd.yaml: pools\[0\].engine_args.kv_transfer_config.kv_connector: 'MeshServeConnector' "
            r"is not a KV connector the tpu-inference backend loads; accepted: TPUConnector, TPUConnectorHMA, "
            r"TPUOffloadConnector, RaidenOffloadConnector",
        ),
        (
            lambda a: a["pools"][0]["engine_args"]["kv_transfer_config"].update(kv_role="kv_consumer"),
            r"pools\[0\].engine_args.kv_transfer_config.kv_role: a prefill pool's connector needs kv_role "
            r"kv_producer or kv_both, got 'kv_consumer'",
        ),
        (
            lambda a: a["pools"][1].update(role="both"),
            r"pools\[0\].role: prefill pool 'v6e-prefill' .*no pool of model .* has role decode",
        ),
        (
            lambda a: a["pools"][1].update(role="both", accelerator="cpu", tpu=None),
            r"pools\[1\].engine_args.kv_transfer_config.kv_connector: TPUConnector loads only on TPU backends",
        ),
    ],
)
def test_tpu_pd_refusals_name_file_and_key(mutate, message):
    args = tpu_pd_args()
    mutate(args)
    with pytest.raises(ConfigError, match=message):
        load_app_config(args)


def test_tt_prefill_to_tpu_decode_is_refused_too():
    args = tpu_pd_args()
    # accelerator cpu (the torch program): PD on a Tenstorrent mesh is refused earlier, on its own
    args["pools"][0].update(engine="tt", accelerator="cpu", tpu=None, engine_args={"max_model_len": 32768})
    with pytest.raises(ConfigError, match=r"pools\[0\].role: prefill pool 'v6e-prefill' .*its KV path \(meshserve\)"):
        load_app_config(args)


@pytest.mark.parametrize("name", ["tpu_v6e", "tpu_v7x"])
@pytest.mark.parametrize("backend", ["tpu-inference", "torchtpu"])
def test_tpu_configs_build_for_both_backends(name, backend):
    from serve_app.app import build_app

    args = _args(name)
    args["pools"][0]["tpu_backend"] = backend
    cfg = load_app_config(args)
    assert cfg.pools[0].tpu_backend == backend
    assert build_app(args) is not None  # the Serve application graph, with the slice placement


def test_tpu_backend_defaults_to_tpu_inference():
    assert load_app_config(_args("tpu_v6e")).pools[0].tpu_backend == "tpu-inference"


@pytest.mark.parametrize(
    "backend, connector, message",
    [
        (
            "torchtpu",
            {"kv_connector": "TPUOffloadConnector", "kv_role": "kv_both"},
            r"configs/tpu_v6e.yaml: pools\[0\].engine_args.kv_transfer_config.kv_connector: 'TPUOffloadConnector' "
            r"is not a KV connector the torchtpu backend loads; accepted: TPUConnector, TPURaidenConnector, "
            r"TPUMultiConnector, TPURaidenOffloadingConnector$",
        ),
        (
            "tpu-inference",
            {"kv_connector": "TPURaidenOffloadingConnector", "kv_role": "kv_both"},
            r"kv_transfer_config.kv_connector: 'TPURaidenOffloadingConnector' is not a KV connector the "
            r"tpu-inference backend loads; accepted: TPUConnector, TPUConnectorHMA, TPUOffloadConnector, "
            r"RaidenOffloadConnector",
        ),
        (
            "torchtpu",
            {"kv_connector": "DecodeBenchConnector", "kv_role": "kv_both"},
            r"'DecodeBenchConnector' is not a KV connector the torchtpu backend loads",
        ),
        (
            "torchtpu",
            {
                "kv_connector": "TPUConnector",
                "kv_connector_module_path": "tpu_inference.distributed.tpu_connector",
                "kv_role": "kv_both",
            },
            r"pools\[0\].engine_args.kv_transfer_config.kv_connector_module_path: the torchtpu backend defines "
            r"TPUConnector in 'vllm_torchtpu.distributed.kv_transfer.tpu_connector'",
        ),
    ],
)
def test_connector_of_the_other_backend_is_a_config_error(backend, connector, message):
    args = _args("tpu_v6e")
    args["pools"][0].update(tpu_backend=backend)
    args["pools"][0]["engine_args"]["kv_transfer_config"] = connector
    with pytest.raises(ConfigError, match=message):
        load_app_config(args)


def test_torchtpu_pd_pools_take_torchtpu_connectors():
    args = tpu_pd_args()
    for pool in args["pools"]:
        pool["tpu_backend"] = "torchtpu"
        pool["engine_args"]["kv_transfer_config"]["kv_connector_module_path"] = (
            "vllm_torchtpu.distributed.kv_transfer.tpu_connector"
        )
    assert {p.kv_connector for p in load_app_config(args).pools} == {"TPUConnector"}
    args["pools"][0]["engine_args"]["kv_transfer_config"] = {
        "kv_connector": "TPUMultiConnector",
        "kv_role": "kv_producer",
    }
    with pytest.raises(ConfigError, match=r"one of TPUConnector, TPURaidenConnector for torchtpu"):
        load_app_config(args)


@pytest.mark.parametrize(
    "backend, connector, module",
    [
        ("tpu-inference", "TPUOffloadConnector", "tpu_inference.offload.tpu_offload_connector"),
        ("torchtpu", "TPURaidenOffloadingConnector", "vllm_torchtpu.offload.raiden_connector"),
    ],
)
def test_host_dram_kv_offload_is_the_backends_own_connector(backend, connector, module):
    args = _args("tpu_v6e")
    args["pools"][0].update(tpu_backend=backend, tpu_kv_offload=True)
    pool = load_app_config(args).pools[0]
    assert pool.engine_config.kv_transfer_config == {
        "kv_connector": connector,
        "kv_connector_module_path": module,
        "kv_role": "kv_both",
    }


def test_kv_offload_refusals():
    args = tpu_pd_args()
    args["pools"][0]["tpu_kv_offload"] = True
    with pytest.raises(ConfigError, match=r"pools\[0\].tpu_kv_offload: the engine already loads TPUConnector"):
        load_app_config(args)
    args = _args()
    args["pools"][0]["tpu_kv_offload"] = True
    with pytest.raises(ConfigError, match=r"pools\[0\].tpu_kv_offload: only pools on accelerator tpu"):
        load_app_config(args)
    args = _args()
    args["pools"][0]["tpu_backend"] = "torchtpu"
    with pytest.raises(ConfigError, match=r"pools\[0\].tpu_backend: only pools on accelerator tpu"):
        load_app_config(args)
