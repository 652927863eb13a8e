"""Where a pool's engines run, as the config loader checks it: ``placement: ingress`` (the engine
inside each ingress replica) and the TT engine-core process, each refused where it would lose
something, the refusal naming the file and the key."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from accel.contract import ConfigError
from deployments.config.load import load_app_config


def _args(name: str = "local") -> dict:
    path = Path(__file__).parents[3] / "configs" / f"{name}.yaml"
    return yaml.safe_load(path.read_text())["applications"][0]["args"]


def _placed_in_ingress(args: dict, only: bool = False, **changes) -> None:
    """Pool 0 placed in the ingress (``only``: the model's only pool)."""
    if only:
        del args["pools"][1:]
    args["pools"][0].update(placement="ingress", **changes)


def test_a_pool_placed_in_the_ingress_parses():
    args = _args("vllm_cpu")
    (pool,) = load_app_config(args).pools
    assert pool.placement == "ingress"  # as the config sets it
    del args["pools"][0]["placement"]
    assert load_app_config(args).pools[0].placement == "own"  # the default


@pytest.mark.parametrize(
    "mutate, message",
    [
        # tiny.yaml serves tiny-llama from two pools: nothing would route between them.
        (
            lambda a: _placed_in_ingress(a),
            r"pools\[0\].placement: an engine inside the ingress must be its model's only",
        ),
        (
            lambda a: _placed_in_ingress(a, only=True, replicas=2),
            r"pools\[0\].replicas: placement ingress runs one engine per ingress replica: set replicas to "
            r"ingress.replicas \(1\), not 2",
        ),
        (
            lambda a: _placed_in_ingress(
                a, only=True, replicas=None, autoscaling={"min_replicas": 1, "max_replicas": 2}
            ),
            r"pools\[0\].replicas: .* not autoscaling",
        ),
        (lambda a: a["pools"][0].__setitem__("placement", "node"), r"pools\[0\].placement: Input should be 'own' or"),
    ],
)
def test_placement_in_the_ingress_cross_checks(mutate, message):
    args = copy.deepcopy(_args())
    mutate(args)
    with pytest.raises(ConfigError, match=message):
        load_app_config(args)


def test_a_tpu_pool_cannot_be_placed_in_the_ingress():
    args = copy.deepcopy(_args("tpu_v6e"))
    args["pools"] = [p for p in args["pools"] if p["model"] == args["pools"][0]["model"]][:1]
    args["pools"][0].update(placement="ingress", replicas=args.get("ingress", {}).get("replicas", 1))
    args["pools"][0].pop("autoscaling", None)
    with pytest.raises(ConfigError, match=r"pools\[0\].placement: a TPU slice replica needs its own placement group"):
        load_app_config(args)


def test_a_tt_engine_core_process_is_refused_on_a_pd_pool(tiny_llama):
    from tests.doubles.app_args import app_args, tt_pool, vllm_pool

    prefill = tt_pool("tt-prefill", role="prefill", additional_config={"tt": {"engine_core_process": True}})
    pools = [prefill, vllm_pool("vllm-decode", role="decode", enable_prefix_caching=True)]
    with pytest.raises(
        ConfigError, match=r"pools\[0\].engine_args.additional_config.tt.engine_core_process: a prefill/decode pool"
    ):
        load_app_config(app_args("pd.yaml", tiny_llama, pools))
    both = dict(prefill, role="both", name="tt")
    assert load_app_config(app_args("one.yaml", tiny_llama, [both])).pools[0].engine_config.tt.engine_core_process


def test_the_stream_interval_defaults_by_placement():
    """Windows only where a message is a Ray message: 15 ms for an own deployment, none inside the
    ingress; a value the YAML sets is kept for either."""
    args = _args("vllm_cpu")
    assert "stream_interval_ms" not in args["pools"][0]
    assert load_app_config(args).pools[0].stream_interval_s == 0.0  # placement: ingress
    own = copy.deepcopy(args)
    del own["pools"][0]["placement"]
    assert load_app_config(own).pools[0].stream_interval_s == 0.015
    for placement, ms in (("ingress", 5), ("own", 0)):
        set_ = copy.deepcopy(args)
        set_["pools"][0].update(placement=placement, stream_interval_ms=ms)
        assert load_app_config(set_).pools[0].stream_interval_s == ms / 1000
