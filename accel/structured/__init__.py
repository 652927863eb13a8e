"""Constrained decoding on the host: structured-output grammars (xgrammar, as vLLM's xgrammar
backend builds them), ``allowed_token_ids`` and ``bad_words``.

``grammar``: spec -> xgrammar (the edge's compile check, the engine's cached compiler);
``constraint``: one request's masks and their state, advanced per sampled token.
"""
