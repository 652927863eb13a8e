"""Prefill/decode disaggregation settings (``pd:`` in the YAML) and which prefill and decode
pools can hand KV to each other: the KV path of a pool.

These are config-level rules: the config loader refuses a prefill pool that could never get a
request (``pairing_problem``), ``ModelConfig.pd_threshold_tokens`` turns PD on for a model whose
pools pair, and the deployments read them from here (the router's roles, the PD wiring).

A prefill/decode pool moves a prompt's KV along one of two paths:

- ``meshserve``: our canonical transfer format through the application's KV-connector actor
  (``accel.kv_transfer``). TT engines (``accel.tt.kv_hooks``) and vLLM engines off TPU that load
  our ``MeshServeConnector`` (wired by ``deployments.pd.wiring`` when the pool's engine_args set no
  ``kv_transfer_config``). Any two such pools pair, across engine kinds: the KV is re-laid-out
  in flight.
- ``native:<Connector>``: the pool's engine_args configure the engine's own vLLM connector
  (``kv_transfer_config.kv_connector``; on TPU it must be the backend's, e.g. ``TPUConnector``).
  That connector moves the KV engine to engine; the KV-connector actor is only the control plane,
  carrying the ``kv_transfer_params`` the prefill engine returned to the decode engine unchanged
  (``deployments.pd.native_handoff``). Only pools with the same connector pair.

A TPU pool without its own connector has no path: TPU backends refuse every other connector, so
no KV leaves or enters a TPU engine any other way. The router plans PD for a model only when all
its prefill and decode pools share one path (``pairing_problem`` is None for its prefill pools);
the config builder refuses the rest with ``pairing_problem``'s reason. Pure logic, no Ray.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from accel.contract import ConfigError
from accel.vllm.tpu.backends import all_tpu_connectors


@dataclass(frozen=True)
class PDConfig:
    # Prompts whose uncached part (on the chosen decode replica) is at least this long are planned
    # as prefill-on-one-pool, decode-on-another; a mostly cached prompt prefills where it decodes.
    threshold_tokens: int = 512
    # Shorter prompts too (uncached part at least this long) while the chosen decode replica has
    # requests in flight and a prefill replica has none, for TT decode pools: their phase-only
    # steps pause every decoding row for a local prefill step, whatever its length (a short prompt
    # still runs a full prefill bucket), while an idle prefill replica costs the prompt only the
    # KV hand-off (vLLM decode pools mix short prefills into decode steps: not applied there).
    # Measured: bench/kv_transfer.py. None = threshold_tokens alone decides.
    busy_decode_threshold_tokens: int | None = 1

    def __post_init__(self) -> None:
        if self.threshold_tokens < 1:
            raise ConfigError(f"pd.threshold_tokens: must be >= 1, got {self.threshold_tokens}")
        if self.busy_decode_threshold_tokens is not None and self.busy_decode_threshold_tokens < 1:
            raise ConfigError(
                f"pd.busy_decode_threshold_tokens: must be >= 1 or null, got {self.busy_decode_threshold_tokens}"
            )


PD_ROLES = ("prefill", "decode")
MESHSERVE_PATH = "meshserve"
# The connectors TPU backends accept (each backend its own, with its role: accel.vllm.tpu.backends).
TPU_CONNECTORS = all_tpu_connectors()
# The vLLM kv_role each pool role needs from a native connector.
KV_ROLES = {"prefill": ("kv_producer", "kv_both"), "decode": ("kv_consumer", "kv_both")}


class PDPool(Protocol):
    """What pairing reads of a pool (``deployments.config.app.PoolConfig``; a protocol so this module
    stays below the pool config, which derives its PD threshold from these rules)."""

    @property
    def name(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def engine(self) -> str: ...
    @property
    def accelerator(self) -> str: ...
    @property
    def role(self) -> str: ...
    @property
    def kv_connector(self) -> str | None: ...


def kv_connector_name(kv_transfer_config: Mapping[str, Any] | None) -> str | None:
    """``kv_connector`` of a vLLM engine's ``kv_transfer_config``; None if not configured."""
    name = kv_transfer_config.get("kv_connector") if kv_transfer_config is not None else None
    return name if isinstance(name, str) and name else None


def kv_path(engine: str, accelerator: str, kv_connector: str | None) -> str | None:
    """The pool's KV path (module docstring); None = no KV can leave or enter its engine."""
    if kv_connector is not None:
        return f"native:{kv_connector}"
    if accelerator == "tpu":
        return None
    return MESHSERVE_PATH


def path_of(pool: PDPool) -> str | None:
    return kv_path(pool.engine, pool.accelerator, pool.kv_connector)


def is_native(pool: PDPool) -> bool:
    """A prefill/decode pool whose engine's own connector moves the KV."""
    return pool.role in PD_ROLES and pool.kv_connector is not None


def pairing_problem(pool: PDPool, pools: Sequence[PDPool]) -> str | None:
    """Why prefill pool ``pool`` cannot hand its KV to the decode pools of its model; None when
    it can (every prefill and decode pool of the model shares one KV path)."""
    decode = [p for p in pools if p.model == pool.model and p.role == "decode"]
    if not decode:
        return f"no pool of model {pool.model!r} has role decode to take its KV"
    path = path_of(pool)
    if path is None:
        return (
            "its TPU engine has no KV connector of its own: TPU backends accept only their own "
            "(set engine_args.kv_transfer_config to TPUConnector, kv_role kv_producer)"
        )
    peers = [p for p in pools if p.model == pool.model and p.role in PD_ROLES and path_of(p) != path]
    if peers:
        other = peers[0]
        return (
            f"its KV path ({path}) differs from pool {other.name!r}'s ({path_of(other) or 'none'}): "
            f"{_why(pool, other)}; such requests would run whole on the decode pool, leaving this "
            f"pool idle"
        )
    return None


def _why(pool: PDPool, other: PDPool) -> str:
    if "tpu" in (pool.accelerator, other.accelerator):
        return (
            "TPU backends accept only their own KV connectors, so KV moves only between TPU engines "
            "that load the same one (TPUConnector), never to or from a TT engine or meshserve's connector"
        )
    return (
        "a pool with its own kv_transfer_config hands KV only to pools loading the same connector "
        "(leave kv_transfer_config out on both sides to use meshserve's, which pairs any engine kinds)"
    )
