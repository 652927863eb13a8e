"""The router's pure logic: prefix index, sessions, load, policies and ``RouterCore``.

No Ray or torch imports here (``tests/test_layers.py``); of ``deployments`` only the router's
messages. The Serve deployment wrapping ``RouterCore`` is ``deployments.router.deployment``.
"""
