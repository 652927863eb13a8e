"""Every config builds into a Serve application graph without hardware; options land where
Serve reads them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from accel.contract import ConfigError
from deployments.config.load import load_app_config
from serve_app.app import INGRESS_NAME, PINNED_REQUEST_ROUTER, ROUTER_NAME, build_app, build_from_config

CONFIGS = sorted((Path(__file__).parents[2] / "configs").glob("*.yaml"))


def _args(path: Path) -> dict:
    return yaml.safe_load(path.read_text())["applications"][0]["args"]


def _graph(app):
    """{deployment name: Deployment} of the bound graph (ingress -> router, pools)."""
    from ray.serve.deployment import Application

    found = {}

    def walk(obj):
        if isinstance(obj, Application):
            d = obj._bound_deployment
            if d.name not in found:
                found[d.name] = d
                for a in list(d.init_args) + list(d.init_kwargs.values()):
                    walk(a)
        elif isinstance(obj, dict):
            for v in obj.values():
                walk(v)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                walk(v)

    walk(app)
    return found


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_config_builds(path):
    from ray.serve.deployment import Application

    app = build_app(_args(path))
    assert isinstance(app, Application)
    graph = _graph(app)
    cfg_pools = _args(path)["pools"]
    router_own = _args(path).get("router", {}).get("placement", "own") == "own"
    assert INGRESS_NAME in graph and (ROUTER_NAME in graph) == router_own
    own = [p for p in cfg_pools if p.get("placement", "own") == "own"]
    assert len(graph) == 1 + router_own + len(own)
    for pool in own:
        kind = "TTMeshReplica" if pool["engine"] == "tt" else "VllmReplica"
        d = graph[f"{kind}-{pool['name']}"]
        router_cfg = d._deployment_config.request_router_config
        assert router_cfg.request_router_class == PINNED_REQUEST_ROUTER
        assert d.max_ongoing_requests == pool.get("max_ongoing_requests", 64)


def test_several_router_replicas_get_the_rendezvous_router():
    from serve_app.app import RENDEZVOUS_REQUEST_ROUTER

    args = _args(CONFIGS[[p.stem for p in CONFIGS].index("tiny")])
    args["router"] = dict(args.get("router") or {}, replicas=3, kv_event_log_size=100)
    graph = _graph(build_app(args))
    router = graph[ROUTER_NAME]
    assert router.num_replicas == 3
    assert router._deployment_config.request_router_config.request_router_class == RENDEZVOUS_REQUEST_ROUTER


def test_local_graph_is_cpu_only():
    graph = _graph(build_app(_args(CONFIGS[[p.stem for p in CONFIGS].index("tiny")])))
    assert graph["TTMeshReplica-tt"].num_replicas == 2
    assert graph["VllmReplica-vllm"].num_replicas == 1
    for d in graph.values():
        opts = d.ray_actor_options
        assert opts.get("num_cpus", 1) == 0
        assert "resources" not in opts or "TTNPU" not in opts["resources"]


def test_tt_pools_ask_for_ttnpu_and_mesh_device():
    graph = _graph(build_app(_args(Path(CONFIGS[0]).parent / "tt_galaxy.yaml")))
    opts = graph["TTMeshReplica-galaxy"].ray_actor_options
    assert opts["resources"]["TTNPU"] == 32
    assert opts["runtime_env"]["env_vars"]["MESH_DEVICE"] == "TG"
    t3k = _graph(build_app(_args(Path(CONFIGS[0]).parent / "tt_t3k.yaml")))["TTMeshReplica-t3k"]
    assert t3k.ray_actor_options["resources"]["TTNPU"] == 8


def test_tpu_pools_get_slice_placement():
    v7x = _graph(build_app(_args(Path(CONFIGS[0]).parent / "tpu_v7x.yaml")))["VllmReplica-v7x"]
    # 2x2x2 = 2 hosts: deferred placement (the replica reserves a whole slice at start).
    assert v7x._replica_config.placement_group_bundles is None
    v6e = _graph(build_app(_args(Path(CONFIGS[0]).parent / "tpu_v6e.yaml")))["VllmReplica-v6e"]
    assert v6e._deployment_config.autoscaling_config.max_replicas == 4


def test_single_host_tpu_pool_is_a_static_placement_group():
    args = _args(Path(CONFIGS[0]).parent / "tpu_v6e.yaml")
    args["pools"][0]["tpu"]["topology"] = "2x4"
    d = _graph(build_app(args))["VllmReplica-v6e"]
    bundles = d._replica_config.placement_group_bundles
    assert len(bundles) == 1 and bundles[0]["TPU"] == 8
    assert d._replica_config.placement_group_bundle_label_selector == [{"ray.io/accelerator-type": "TPU-V6E"}]


def test_engine_args_checked_by_the_engine_config():
    args = _args(Path(CONFIGS[0]).parent / "tiny.yaml")
    args["pools"][1]["engine_args"]["max_num_seqz"] = 3
    with pytest.raises(ConfigError, match=r"configs/tiny.yaml: pools\[1\].engine_args: max_num_seqz"):
        build_app(args)
    args = _args(Path(CONFIGS[0]).parent / "tiny.yaml")
    args["pools"][0]["engine_args"]["additional_config"] = {"tt": {"trace_mode": "sometimes"}}
    with pytest.raises(ConfigError, match=r"pools\[0\].engine_args: additional_config.tt.trace_mode"):
        build_app(args)


def test_bad_tpu_topology_is_a_config_error():
    args = _args(Path(CONFIGS[0]).parent / "tpu_v6e.yaml")
    args["pools"][0]["tpu"]["topology"] = "3x3"
    with pytest.raises(ConfigError, match=r"configs/tpu_v6e.yaml: pools\[0\].tpu: topology"):
        build_app(args)


def test_unknown_mesh_device_is_a_config_error():
    args = _args(Path(CONFIGS[0]).parent / "tt_t3k.yaml")
    args["pools"][0]["tt"]["mesh_device"] = "T9K"
    with pytest.raises(ConfigError, match=r"configs/tt_t3k.yaml: pools\[0\].tt: unknown MESH_DEVICE"):
        build_app(args)


def test_a_router_placed_in_the_ingress_has_no_deployment():
    args = _args(CONFIGS[[p.stem for p in CONFIGS].index("tiny")])
    args["router"] = dict(args.get("router") or {}, placement="ingress")
    graph = _graph(build_app(args))
    assert ROUTER_NAME not in graph and INGRESS_NAME in graph
    assert len(graph) == 1 + len(args["pools"])  # the ingress and every pool's own deployment


def test_a_pool_placed_in_the_ingress_has_no_deployment_and_the_ingress_reserves_its_resources():
    args = _args(Path(CONFIGS[0]).parent / "tt_t3k.yaml")
    (pool,) = [p for p in args["pools"] if p["name"] == "t3k"]
    args["pools"] = [dict(pool, placement="ingress", replicas=2, graceful_shutdown_timeout_s=45)]
    args["ingress"] = dict(args.get("ingress", {}), replicas=2, num_cpus=0.5)
    graph = _graph(build_app(args))
    assert set(graph) == {INGRESS_NAME, ROUTER_NAME}
    ingress = graph[INGRESS_NAME]
    opts = ingress.ray_actor_options
    # One engine per ingress replica: the mesh's chips, its MESH_DEVICE, the pool's CPUs on top
    # of the ingress's own.
    assert opts["resources"]["TTNPU"] == 8
    assert opts["runtime_env"]["env_vars"]["MESH_DEVICE"] == "T3K"
    assert opts["num_cpus"] == 0.5 + pool.get("resources", {}).get("num_cpus", 1.0)
    assert ingress.num_replicas == 2
    assert ingress._deployment_config.graceful_shutdown_timeout_s == 45


# The application's runtime_env as a Serve config gives it (serve run builds the app under it).
APP_ENV = {"env_vars": {"EXTRA_MODELS_DIR": "/opt/my_models", "MESH_DEVICE": "N150"}, "working_dir": "gcs://_app.zip"}


def test_a_tt_pool_keeps_the_applications_runtime_env_under_its_mesh_device():
    # Serve gives the app's runtime_env only to deployments that set none; a TT pool sets
    # MESH_DEVICE, so before this its replicas lost the app's EXTRA_MODELS_DIR (issue 39).
    config = load_app_config(_args(Path(CONFIGS[0]).parent / "tt_t3k.yaml"))
    graph = _graph(build_from_config(config, app_runtime_env=APP_ENV))
    env = graph["TTMeshReplica-t3k"].ray_actor_options["runtime_env"]
    assert env["env_vars"] == {"EXTRA_MODELS_DIR": "/opt/my_models", "MESH_DEVICE": "T3K"}  # the pool's wins
    assert env["working_dir"] == "gcs://_app.zip"
    # deployments setting no runtime_env of their own are left to Serve's default
    assert "runtime_env" not in graph[ROUTER_NAME].ray_actor_options


def test_an_ingress_holding_a_tt_pool_keeps_the_applications_runtime_env():
    args = _args(Path(CONFIGS[0]).parent / "tt_t3k.yaml")
    args["pools"] = [dict(p, placement="ingress", replicas=1) for p in args["pools"] if p["name"] == "t3k"]
    args["ingress"] = dict(args.get("ingress", {}), replicas=1)
    graph = _graph(build_from_config(load_app_config(args), app_runtime_env=APP_ENV))
    env = graph[INGRESS_NAME].ray_actor_options["runtime_env"]
    assert env["env_vars"] == {"EXTRA_MODELS_DIR": "/opt/my_models", "MESH_DEVICE": "T3K"}
