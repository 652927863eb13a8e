"""The router's settings (``router:`` in the YAML), as the router logic and its deployment read them.

One default per setting, here: the pydantic schema (``schema.py``) takes its defaults from these
dataclasses, and ``deployments.router.logic.RouterLogic`` takes them as they are. Defaults of the
weights were chosen on ``bench/router_sim.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Literal, get_args

from accel.cache_affinity import AffinityWeights
from accel.contract import ConfigError

# The routing policies (``deployments.router.logic.policies`` registers one class per name) ...
PolicyName = Literal["prefix+session+load", "round_robin", "least_loaded", "prefix", "session"]
# ... and the prefix index modes (``deployments.router.logic.prefix_index``): ``precise`` follows the
# engines' KV events where they publish them (others are learned from routing), ``approximate``
# learns every replica from routing.
IndexMode = Literal["precise", "approximate"]
# Where the router runs: "own" = its deployment (router.replicas of them, each polled and called
# over Serve), "ingress" = inside the ingress replica, called in-process: no Serve call per request
# (choose, release) and no router process on a small host; one ingress replica then.
RouterPlacement = Literal["own", "ingress"]


@dataclass(frozen=True)
class CostWeights(AffinityWeights):
    """Weights of ``prefix+session+load`` (and the load score every policy uses): the rule of
    ``accel.cache_affinity`` (one rule for replicas here and for the TT lanes inside a replica),
    with its defaults, validated.

    ``cost = w_prefill * uncached_prompt_blocks + w_load_blocks * load_score`` over the replicas
    whose load score is within ``min_score + max(window_abs, window_rel * min_score)``; replicas
    outside that window are overloaded (never chosen, and a session bound to one moves).
    When a new session is placed, each session active on a replica (``SessionConfig.active_s``)
    adds ``w_session`` to that replica's load score in the cost (not in the window), unless the
    pool's mean KV usage is at least ``session_max_kv_usage`` (``cost_policy`` says why).
    Chosen on ``bench/router_sim.py``'s light-load chat family (``router_sim_validate``).

    Tiers: a prompt block the replica's engine holds only on its host (or storage) tier counts
    ``host_tier_credit`` (``storage_tier_credit``) of a device block in ``uncached_prompt_blocks``:
    it is loaded back, not recomputed, which still costs a transfer (vllm-router's
    ``--kv-penalty-host`` / ``--kv-penalty-disk`` defaults, 0.8 and 0.3).
    """

    w_session: float = 2.0
    session_max_kv_usage: float = 0.9
    # Load score per prompt block queued for prefill on a replica, in the cost only (cost_policy's
    # step 5); 0.25 = one block of prefill per block (w_prefill / w_load_blocks).
    w_queued_prefill: float = 0.0
    host_tier_credit: float = 0.8
    storage_tier_credit: float = 0.3

    def __post_init__(self) -> None:
        for f in fields(self):
            if getattr(self, f.name) < 0:
                raise ConfigError(f"router.weights.{f.name}: must be >= 0, got {getattr(self, f.name)}")
        for name in ("host_tier_credit", "storage_tier_credit"):
            if getattr(self, name) > 1:
                raise ConfigError(f"router.weights.{name}: must be <= 1 (a device hit is 1), got {getattr(self, name)}")


@dataclass(frozen=True)
class SessionConfig:
    ttl_s: float = 600.0  # idle time after which a session binding is forgotten
    # Concurrent requests of one session on its replica; more spill elsewhere (binding kept).
    max_in_flight_per_session: int = 2
    # A session used within this long counts as load on its replica when a new session is placed
    # (``CostWeights.w_session``): it is likely to send its next turn there soon.
    active_s: float = 30.0

    def __post_init__(self) -> None:
        if not self.ttl_s > 0:
            raise ConfigError(f"router.session_ttl_s: must be positive, got {self.ttl_s}")
        if not self.active_s >= 0:
            raise ConfigError(f"router.session_active_s: must be >= 0, got {self.active_s}")
        if self.max_in_flight_per_session < 1:
            raise ConfigError(f"router.max_in_flight_per_session: must be >= 1, got {self.max_in_flight_per_session}")


@dataclass(frozen=True)
class LoadConfig:
    # Engine stats older than this are ignored (load falls back to the router's in-flight counts).
    stats_max_age_s: float = 5.0
    peer_max_age_s: float = 1.0  # a peer router's in-flight counts older than this are ignored

    def __post_init__(self) -> None:
        if not self.stats_max_age_s > 0:
            raise ConfigError(f"router.stats_max_age_s: must be positive, got {self.stats_max_age_s}")
        if not self.peer_max_age_s > 0:
            raise ConfigError(f"router.peer_max_age_s: must be positive, got {self.peer_max_age_s}")


@dataclass(frozen=True)
class RouterConfig:
    policy: PolicyName = "prefix+session+load"
    index_mode: IndexMode = "precise"
    weights: CostWeights = field(default_factory=CostWeights)
    sessions: SessionConfig = field(default_factory=SessionConfig)
    load: LoadConfig = field(default_factory=LoadConfig)
    # Router replicas. Several agree: each follows every engine's KV event log (identical precise
    # indexes); a session's requests go to one of them by rendezvous hashing (its binding and
    # in-flight cap live there); each broadcasts its in-flight counts to the others every 0.1 s.
    replicas: int = 1
    num_cpus: float = 0.0
    placement: RouterPlacement = "own"
    stats_period_s: float = 0.5  # how often the router polls every engine replica (membership, load, KV)
    decision_timeout_s: float = 0.2  # the ingress waits this long for a decision, then chooses locally
    # KV events each engine replica keeps for router polls; a router further behind resyncs from
    # the replica's full block snapshot.
    kv_event_log_size: int = 8192
    # precise index: how long a routed prompt's blocks count as held on the chosen replica before
    # its KV events confirm them (they arrive a poll or more later; 0 = only confirmed blocks).
    # A few poll periods, as a prefill under load can take seconds.
    speculative_ttl_s: float = 2.0

    def __post_init__(self) -> None:
        _check_choice("router.policy", self.policy, get_args(PolicyName))
        _check_choice("router.index_mode", self.index_mode, get_args(IndexMode))
        _check_choice("router.placement", self.placement, get_args(RouterPlacement))
        for name in ("replicas", "kv_event_log_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"router.{name}: must be >= 1, got {getattr(self, name)}")
        for name in ("stats_period_s", "decision_timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"router.{name}: must be positive, got {getattr(self, name)}")
        if not self.speculative_ttl_s >= 0:
            raise ConfigError(f"router.speculative_ttl_s: must be >= 0, got {self.speculative_ttl_s}")


@dataclass(frozen=True)
class ModelRouting:
    """What the router logic needs of one served model, derived once from its pools
    (``ModelConfig.routing``)."""

    block_size: int  # tokens per block of the prompt hashes (the model's routing block size)
    # Prompts whose uncached part on the chosen decode replica is at least this long are prefilled
    # on a prefill pool and decoded on a decode pool; None = no disaggregation for this model.
    pd_threshold_tokens: int | None = None
    # With PD on: shorter prompts (uncached part at least this long) are disaggregated too while
    # their decode replica has requests in flight and a prefill replica has none
    # (``PDConfig.busy_decode_threshold_tokens``); None = never.
    pd_busy_decode_threshold_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ConfigError(f"block_size: must be >= 1, got {self.block_size}")
        if self.pd_threshold_tokens is not None and self.pd_threshold_tokens < 1:
            raise ConfigError(f"pd.threshold_tokens: must be >= 1, got {self.pd_threshold_tokens}")
        if self.pd_busy_decode_threshold_tokens is not None and self.pd_busy_decode_threshold_tokens < 1:
            raise ConfigError(
                f"pd.busy_decode_threshold_tokens: must be >= 1, got {self.pd_busy_decode_threshold_tokens}"
            )


def _check_choice(key: str, value: str, known: tuple[str, ...]) -> None:
    if value not in known:
        raise ConfigError(f"{key}: unknown {value!r}; known: {', '.join(sorted(known))}")
