"""The HTTP edge's settings (``ingress:`` in the YAML)."""

from __future__ import annotations

from dataclasses import dataclass

from accel.contract import ConfigError


@dataclass(frozen=True)
class IngressConfig:
    replicas: int = 1
    num_cpus: float = 0.0
    # Requests one ingress replica holds at once; past it new ones get 429 + Retry-After.
    max_concurrent_requests: int = 256
    retry_after_s: int = 1  # the Retry-After of a 429 / 503
    # Serve's per-request access log line of the ingress (the engines and router never log one).
    access_log: bool = True

    def __post_init__(self) -> None:
        for name in ("replicas", "max_concurrent_requests"):
            if getattr(self, name) < 1:
                raise ConfigError(f"ingress.{name}: must be >= 1, got {getattr(self, name)}")
