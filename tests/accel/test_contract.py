import pytest

from accel.contract import (
    Engine,
    EngineStats,
    GenerateRequest,
    InvalidRequestError,
    KVTransferParams,
    SamplingParams,
)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"stop": 5}, "stop"),
        ({"stop": ["ok", 3]}, "stop"),
        ({"logprobs": 21}, "logprobs"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"logit_bias": {"5": "x"}}, "logit_bias"),
        ({"min_tokens": 20, "max_tokens": 10}, "min_tokens"),
        ({"seed": 1.5}, "seed"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ],
)
def test_invalid_sampling_params_name_the_field(kwargs, field):
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams(**kwargs)
    assert err.value.field == field
    assert field in str(err.value)


def test_sampling_normalization():
    sp = SamplingParams(top_k=-1, stop="END", logit_bias={"7": -100, "3": 2.5})
    # Out-of-range biases are clamped, as vLLM's SamplingParams.from_optional does.
    assert SamplingParams(logit_bias={"5": 1e9, "6": -300}).logit_bias == ((5, 100.0), (6, -100.0))
    assert sp.top_k == 0
    assert sp.stop == ("END",)
    assert sp.logit_bias == ((3, 2.5), (7, -100.0))
    assert SamplingParams(temperature=0).is_greedy and not SamplingParams().is_greedy
    hash(sp)  # frozen and hashable


def test_generate_request_validation():
    with pytest.raises(InvalidRequestError) as err:
        GenerateRequest("r1", ())
    assert err.value.field == "prompt"
    with pytest.raises(InvalidRequestError):
        GenerateRequest("", (1, 2))
    with pytest.raises(InvalidRequestError):
        GenerateRequest("r1", (1, -3))
    req = GenerateRequest("r1", [5, 6, 7])
    assert req.prompt_token_ids == (5, 6, 7) and req.num_prompt_tokens == 3


def test_kv_transfer_params_validation():
    with pytest.raises(InvalidRequestError):
        KVTransferParams(do_remote_decode=True, do_remote_prefill=True)
    with pytest.raises(InvalidRequestError):
        KVTransferParams(do_remote_prefill=True)
    assert KVTransferParams(do_remote_prefill=True, transfer_id="t").transfer_id == "t"


def test_kv_transfer_connector_params_are_an_opaque_json_like_copy():
    tpu = {"uuid": 1234, "remote_host": "10.0.0.7", "remote_port": 9100}
    params = KVTransferParams(do_remote_prefill=True, transfer_id="t", connector_params=tpu)
    tpu["remote_port"] = 1
    assert params.connector_params == {"uuid": 1234, "remote_host": "10.0.0.7", "remote_port": 9100}
    assert KVTransferParams().connector_params is None
    with pytest.raises(InvalidRequestError, match="string keys"):
        KVTransferParams(connector_params={1: "x"})
    with pytest.raises(InvalidRequestError, match="JSON-like"):
        KVTransferParams(connector_params={"blocks": object()})


def test_engine_stats_usage():
    assert EngineStats(0, 0, 100, 25).kv_usage == pytest.approx(0.75)
    assert EngineStats(0, 0, 0, 0).kv_usage == 0.0


ENGINE_METHODS = sorted(n for n, v in vars(Engine).items() if not n.startswith("_") and callable(v))


@pytest.mark.parametrize(
    "engine_class",
    [
        "accel.tt.engine:TTMeshEngine",
        "accel.vllm.engine:VllmEngine",
        "tests.doubles.hf_replay_engine:HFReplayEngine",
    ],
)
def test_every_engine_implements_every_engine_method(engine_class):
    """Optional capabilities are declared on the protocol (answered None where unsupported), so
    each engine class has every method; ``block_size`` is checked on live engines."""
    import importlib

    module, _, name = engine_class.partition(":")
    cls = getattr(importlib.import_module(module), name)
    assert {"check_health", "extra_stats", "kv_block_snapshot", "take_kv_events"} <= set(ENGINE_METHODS)
    assert [m for m in ENGINE_METHODS if not callable(getattr(cls, m, None))] == []
