"""The router: its pure logic in ``core/`` (``RouterCore``: prefix index, sessions, load, policies;
no Ray, no torch), its Serve deployment (``deployment.RouterDeployment`` with the engine view it
polls), the typed messages both speak (``messages``, ``kv_events``), the ingress's ``client``, and
the Serve request routers on the engine and router handles.
"""
