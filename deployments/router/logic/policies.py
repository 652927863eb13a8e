"""The routing policies by config name (``router.policy``): the registry over the built-ins.

Adding a policy: subclass ``policy.RoutingPolicy`` with a unique ``name`` and list it here.
"""

from __future__ import annotations

from accel.contract import ConfigError
from deployments.config.router import CostWeights

from .cost_policy import PrefixSessionLoadPolicy
from .policy import RoutingPolicy
from .simple_policies import LeastLoadedPolicy, PrefixPolicy, RoundRobinPolicy, SessionPolicy

POLICIES: dict[str, type[RoutingPolicy]] = {
    cls.name: cls for cls in (PrefixSessionLoadPolicy, RoundRobinPolicy, LeastLoadedPolicy, PrefixPolicy, SessionPolicy)
}


def policy_names() -> tuple[str, ...]:
    return tuple(sorted(POLICIES))


def make_policy(name: str, weights: CostWeights | None = None) -> RoutingPolicy:
    """The policy registered as ``name``; unknown names raise ``ConfigError`` listing the known."""
    cls = POLICIES.get(name)
    if cls is None:
        raise ConfigError(f"router.policy: unknown policy {name!r}; known: {', '.join(policy_names())}")
    return cls(weights or CostWeights())
