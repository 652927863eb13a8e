"""The typed values the ingress, the Router deployment and the engine replicas exchange: route
request and decision (``routing``), a replica's self-report (``replica_snapshot``), KV events and
log cursors (``kv_events``), the session key (``sessions``).

Neutral ground, the bottom floor of ``deployments``: every other folder may import it; it imports
none of them (only ``accel`` and ``deployments.config``), so the router and the replicas never
import each other for their shared vocabulary.
"""
