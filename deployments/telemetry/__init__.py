"""Ray metrics (``metrics``) emitted by the replicas, the Router and the ingress."""
