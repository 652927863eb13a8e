"""The router's pure logic: prefix index, sessions, load, policies and ``RouterLogic``.

No Ray or torch imports here (``tests/test_layers.py``); of ``deployments`` only the neutral
``deployments.messages``. The Serve deployment wrapping ``RouterLogic`` is
``deployments.router.deployment``.
"""
