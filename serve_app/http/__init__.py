"""The one HTTP edge: the OpenAI-compatible ingress deployment (FastAPI app, auth, limits,
streaming, failover, tokenize routes) and, in ``protocol/``, the pydantic request/response models
and their conversion to the engine contract. Pydantic lives only here and in the config schema.

Above every deployment it calls (router, replicas, PD orchestrator) and below only the builder
``serve_app.app`` (``tests/test_layers.py``).
"""
