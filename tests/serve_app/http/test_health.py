"""A model can serve when a pool running whole requests (both / decode) has a running replica;
prefill-only pools and not-yet-heard pools do not count."""

from __future__ import annotations

from serve_app.http.health import model_can_serve, unhealthy_models
from tests.doubles.app_configs import app_config, pool_config


class Pool:
    def __init__(self, running):
        self._running = running

    def running_replicas(self):
        return self._running


def test_models_with_a_running_serving_replica():
    config = app_config(
        (
            pool_config("pre", "a", "vllm", "cpu", "prefill"),
            pool_config("dec", "a", "vllm", "cpu", "decode"),
            pool_config("tt", "b", "tt", "cpu", "both"),
        )
    )
    models = {m.name: m for m in config.models}
    engines = {"pre": Pool(frozenset({"p1"})), "dec": Pool(frozenset()), "tt": Pool(None)}
    assert not model_can_serve(models["a"], engines)  # only its prefill pool runs
    assert not model_can_serve(models["b"], engines)  # not heard of yet
    assert unhealthy_models(models, engines) == ["a", "b"]
    engines.update(dec=Pool(frozenset({"d1"})), tt=Pool(frozenset({"t1"})))
    assert unhealthy_models(models, engines) == []
