"""``KVTransport`` over the KV-connector actor, for engines (blocking calls, deadlines).

Usable from any process of the cluster: a Serve replica (Ray already initialized) or a vLLM child
process (``connect`` joins the running cluster with ``ray.init(address="auto")``). A dead or
restarted actor surfaces as ``KVTransferError``; the next call looks the actor up again.
"""

from __future__ import annotations

import logging

import torch

from accel.kv_transfer.payload import KVPayload, tensor_from_wire, tensor_to_wire
from accel.kv_transfer.transport import KVTransferError
from deployments.kv_connector_actor import actor_namespace, get_kv_connector

logger = logging.getLogger(__name__)

RPC_GRACE_S = 5.0  # on top of a call's own deadline, for the round trip


def connect_to_cluster(app_name: str, address: str | None = None) -> None:
    """Join the running Ray cluster from a process Ray did not start (idempotent). Pass the GCS
    address the replica saw (``ray.get_runtime_context().gcs_address``): "auto" picks whatever
    cluster this machine started last, which is wrong when several run side by side."""
    import ray

    if not ray.is_initialized():
        ray.init(address=address or "auto", namespace=actor_namespace(app_name), log_to_driver=False,
                 configure_logging=False)


class RayKVTransport:
    """``address``: the cluster's GCS address, for processes Ray did not start (vLLM children);
    None inside a Ray worker or driver that already called ``ray.init``."""

    def __init__(self, app_name: str, address: str | None = None):
        self.app_name = app_name
        self.address = address
        self._handle = None

    def put(self, transfer_id: str, payload: KVPayload, timeout_s: float) -> None:
        """One copy into the object store, then one RPC that waits for capacity and commits.
        We own the object; once the actor holds its borrowed reference we drop ours, so the
        actor's reference alone keeps the payload alive (freed on completion or expiry)."""
        import ray

        self._actor()  # joins the cluster first: a bare ray.put would auto-start a private one
        ref = ray.put(payload.to_wire())
        for attempt in (0, 1):  # a handle cached before the actor was recreated fails once
            handle = self._actor()
            try:
                ray.get(handle.store.remote(transfer_id, payload.descriptor, [ref], timeout_s),
                        timeout=timeout_s + RPC_GRACE_S)
                return
            except KVTransferError:
                raise
            except Exception as e:
                self._handle = None
                if attempt == 1 or not isinstance(e, ray.exceptions.RayActorError):
                    try:
                        handle.cancel.remote(transfer_id)
                    except Exception:
                        pass
                    raise KVTransferError(f"KV connector failed to store {transfer_id!r}: {e}") from e

    def fetch(self, transfer_id: str, timeout_s: float) -> KVPayload:
        import ray

        try:
            descriptor, refs = ray.get(self._actor().claim.remote(transfer_id), timeout=timeout_s)
            array = ray.get(refs[0], timeout=timeout_s)
        except KVTransferError:
            raise
        except Exception as e:
            self._handle = None
            raise KVTransferError(f"KV transfer {transfer_id!r} unreadable: {e}") from e
        return KVPayload.from_wire(descriptor, array)

    def contains(self, transfer_id: str, timeout_s: float) -> bool:
        """Whether the actor holds a committed, unexpired ``transfer_id`` (False if unreachable)."""
        import ray

        try:
            return bool(ray.get(self._actor().contains.remote(transfer_id), timeout=timeout_s))
        except Exception:
            self._handle = None
            logger.warning("KV connector unreachable while looking up %s", transfer_id, exc_info=True)
            return False

    # -- host-memory prefix tier (deployments/kv_prefix_tier.py) --------------------------------

    def offer_prefix(self, key: str, block_size: int, hashes: list[int], blocks: list[torch.Tensor]) -> int:
        """Offer full blocks (each ``[L, 2, block_size, Hkv, D]``) under their chained hashes;
        ``key`` = model fingerprint and dtype. Returns how many the tier took; 0 if unreachable."""
        import ray

        try:
            self._actor()
            refs = [ray.put(tensor_to_wire(b)) for b in blocks]
            nbytes = blocks[0].numel() * blocks[0].element_size() if blocks else 0
            return int(ray.get(self._actor().offer_prefix.remote(key, block_size, hashes, refs, nbytes),
                               timeout=RPC_GRACE_S))
        except Exception:
            self._handle = None
            logger.warning("prefix tier: offer failed", exc_info=True)
            return 0

    def match_prefix(self, key: str, block_size: int, hashes: list[int], dtype: torch.dtype,
                     timeout_s: float) -> list[torch.Tensor]:
        """Blocks of the longest leading run of ``hashes`` the tier holds (read-only tensors)."""
        import ray

        try:
            refs = ray.get(self._actor().match_prefix.remote(key, block_size, hashes), timeout=timeout_s)
            return [tensor_from_wire(a, dtype) for a in ray.get(refs, timeout=timeout_s)] if refs else []
        except Exception:
            self._handle = None
            logger.warning("prefix tier: lookup failed", exc_info=True)
            return []

    def complete(self, transfer_id: str) -> None:
        try:
            self._actor().complete.remote(transfer_id)
        except Exception:  # the lease frees it anyway
            logger.debug("complete(%s) not delivered", transfer_id, exc_info=True)

    def report_recompute(self, reason: str) -> None:
        try:
            self._actor().report_recompute.remote(reason)
        except Exception:
            logger.warning("KV connector unreachable; recompute (%s) not counted", reason)

    def _actor(self):
        if self._handle is None:
            try:
                connect_to_cluster(self.app_name, self.address)
                self._handle = get_kv_connector(self.app_name)
            except Exception as e:
                raise KVTransferError(f"no KV connector for application {self.app_name!r}: {e}") from e
        return self._handle
