"""Which prefill and decode pools can hand KV to each other (pure logic)."""

from deployments.config.pd import is_native, kv_connector_name, kv_path, pairing_problem
from tests.doubles.app_configs import pool_config


def _pool(name, engine, accelerator, role, kv_connector=None, model="m"):
    return pool_config(name, model, engine, accelerator, role, 16, kv_connector)


def test_kv_path_of_each_kind():
    assert kv_path("tt", "tt", None) == kv_path("vllm", "cpu", None) == "meshserve"
    assert kv_path("vllm", "tpu", None) is None  # TPU backends load no connector of ours
    assert kv_path("vllm", "tpu", "TPUConnector") == "native:TPUConnector"
    assert kv_path("vllm", "cpu", "MeshServeConnector") == "native:MeshServeConnector"


def test_kv_connector_name_reads_vllm_engine_args_only():
    args = {"kv_transfer_config": {"kv_connector": "TPUConnector", "kv_role": "kv_producer"}}
    assert kv_connector_name(args["kv_transfer_config"]) == "TPUConnector"
    assert _pool("t", "tt", "cpu", "prefill").kv_connector is None  # a TT engine loads no vLLM connector
    assert _pool("v", "vllm", "tpu", "prefill", "TPUConnector").kv_connector == "TPUConnector"
    assert kv_connector_name(None) is None and kv_connector_name({"kv_connector": ""}) is None


def test_pairs_share_one_path():
    tpu_pre, tpu_dec = (
        _pool("p", "vllm", "tpu", "prefill", "TPUConnector"),
        _pool("d", "vllm", "tpu", "decode", "TPUConnector"),
    )
    tt_pre, tt_dec, cpu_dec = (
        _pool("tp", "tt", "tt", "prefill"),
        _pool("td", "tt", "tt", "decode"),
        _pool("cd", "vllm", "cpu", "decode"),
    )
    assert pairing_problem(tpu_pre, [tpu_pre, tpu_dec]) is None
    assert pairing_problem(tt_pre, [tt_pre, cpu_dec]) is None  # cross kind through the actor
    assert pairing_problem(tt_pre, [tt_pre, tt_dec, _pool("x", "tt", "tt", "both")]) is None  # "both" pools don't count
    assert "TPU backends accept only" in pairing_problem(tpu_pre, [tpu_pre, tt_dec])
    assert "TPU backends accept only" in pairing_problem(tt_pre, [tt_pre, tpu_dec])
    # one decode pool off the path is enough: the router plans PD per model, over all its pools
    assert "differs from pool 'td'" in pairing_problem(tpu_pre, [tpu_pre, tpu_dec, tt_dec])
    assert "no KV connector of its own" in pairing_problem(_pool("p", "vllm", "tpu", "prefill"), [tpu_dec])
    assert "same connector" in pairing_problem(
        _pool("np", "vllm", "cpu", "prefill", "MeshServeConnector"),
        [_pool("np", "vllm", "cpu", "prefill", "MeshServeConnector"), cpu_dec],
    )
    assert "has role decode" in pairing_problem(
        tpu_pre, [tpu_pre, _pool("d2", "vllm", "tpu", "decode", "TPUConnector", model="other")]
    )


def test_native_means_own_connector_on_a_pd_pool():
    assert is_native(_pool("p", "vllm", "tpu", "prefill", "TPUConnector"))
    assert not is_native(_pool("p", "vllm", "cpu", "decode"))
    assert not is_native(_pool("b", "vllm", "cpu", "both", "MeshServeConnector"))
