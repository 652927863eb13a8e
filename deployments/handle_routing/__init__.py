"""Serve request-router plugins (``ray.serve.request_router.RequestRouter``), which run inside
the caller's deployment handle, not in the Router deployment: ``pinned`` on engine handles (go to
the replica the Router chose), ``rendezvous`` on the Router's handle (a session's requests to one
Router replica), and ``replica_membership``, which the pinned plugin publishes Serve's running
replica sets through.
"""
