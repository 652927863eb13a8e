"""The application's config tree: one default per setting, frozen dataclasses every component takes.

- ``schema``: the pydantic edge (the YAML ``args``; unknown keys refused; defaults read from the
  dataclasses below);
- ``app``: ``AppConfig`` -> ``ModelConfig`` (routing block size and PD threshold derived once)
  -> ``PoolConfig`` (with its engine's typed config);
- ``router``, ``pd``, ``ingress``: the settings of each part (``pd`` also holds the rules of which
  prefill and decode pools pair);
- ``load``: ``load_app_config(args)``, schema -> dataclasses, once, errors naming file and key.

The bottom floor of ``deployments``: it imports only ``accel`` (``tests/test_layers.py``).
"""
