"""The Serve deployments below the HTTP edge, in floors (bottom first, ``tests/test_layers.py``):
config, messages, telemetry, handle_routing, kv, pd, replicas, router."""
