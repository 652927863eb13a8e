"""The Router deployment and nothing else named "router": its pure logic in ``logic/``
(``RouterLogic``: prefix index, sessions, load, policies; no Ray, no torch), its Serve deployment
(``deployment.RouterDeployment`` with the engine view it polls), its debug ``views`` and the
ingress's ``client``. What it exchanges with the replicas and the ingress lives in
``deployments.messages``; Serve's request-router plugins on the handles in
``deployments.handle_routing``.
"""
