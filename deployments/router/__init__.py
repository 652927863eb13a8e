"""The router's pure logic: prefix index, sessions, load, policies and ``RouterCore``.

No Ray or torch imports here; the Ray deployment wrapping ``RouterCore`` lives elsewhere.
"""
