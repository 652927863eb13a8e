"""The routing messages between the ingress, the router deployment and the engine handles.

The router's decision API is deliberately small: ``RouteRequest`` in, ``RouteDecision`` out,
``release(ticket)`` when the request ends (completed, failed or cancelled). The router's logic
(``deployments.router.logic.router_logic.RouterLogic``) takes and returns these same types, so a
request has one shape from the ingress to the decision (pools by name). Neutral ground: the
router, the replicas, the handle routing and the ingress import this; it imports none of them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from accel.block_hash import BlockHash
from deployments.config.app import PoolConfig
from deployments.config.task import PoolTask


@dataclass(frozen=True)
class PoolNeeds:
    """What a request needs of a pool (``eligible_pools``): its model, the pool the client pinned
    (x-meshserve-pool; None: any), the task its engine must serve and the LoRA adapter it runs
    with. Known before the prompt is tokenized, unlike the rest of a ``RouteRequest``."""

    model: str
    pool: str | None = None
    task: PoolTask = "generate"
    lora: str | None = None


@dataclass(frozen=True)
class RouteRequest:
    """One engine request to place (what ``RouterLogic.route`` takes). ``pool`` set = the client
    pinned a pool (x-meshserve-pool)."""

    request_id: str
    model: str
    num_prompt_tokens: int
    pool: str | None = None
    session_id: str | None = None  # GenerateRequest.session_id: binds the request's session
    # Chained block hashes of the prompt's full blocks (accel.block_hash.hash_prompt_blocks at
    # the model's ModelConfig.routing_block_size); may be empty.
    prompt_block_hashes: tuple[BlockHash, ...] = ()
    # Engine replicas not to choose (a retry after the first choice died).
    excluded_replicas: tuple[str, ...] = ()
    # What the request needs the pool's engine to serve (deployments.config.task).
    task: PoolTask = "generate"
    # The LoRA adapter it runs with (its served name; ``model`` is then the adapter's base model):
    # only replicas of pools with enable_lora can run it, and its block hashes are rooted at the
    # adapter (accel.block_hash.salted_root).
    lora: str | None = None

    @property
    def needs(self) -> PoolNeeds:
        return PoolNeeds(self.model, self.pool, self.task, self.lora)

    @property
    def affinity_key(self) -> str:
        """Which router replica decides this request (``deployments.handle_routing.rendezvous``):
        every request of a session, else of a prompt head, goes to the same one, so its session
        binding and in-flight counts live in one place."""
        if self.session_id:
            return "s:" + self.session_id
        if self.prompt_block_hashes:
            return f"b:{self.prompt_block_hashes[0]}"
        return "r:" + self.request_id


def stable_hash64(text: str) -> int:
    """A 64-bit hash every process agrees on (Python's ``hash`` is salted per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


PREFILL_TICKET_SUFFIX = "#prefill"  # a disaggregated decision's prefill ticket: request id + this


def prefill_ticket_of(request_id: str) -> str:
    return request_id + PREFILL_TICKET_SUFFIX


@dataclass(frozen=True)
class RouteDecision:
    """Where to send it (what ``RouterLogic.route`` returns). ``replica_id`` None = the router knows
    no replica of ``pool`` yet; the engine handle then picks the least-loaded one itself.
    ``ticket`` (the request id) goes back in ``release``, to ``router_replica_id`` (the router
    replica that issued it and counts the request); "" = nothing to release."""

    pool: str
    replica_id: str | None
    ticket: str
    reason: str  # "pinned", "prefill_decode", a policy's reason (``policy.Choice``), or a fallback's
    # Prefill/decode disaggregation (deployments/pd/orchestrator.py): set when the prompt is prefilled on
    # ``prefill_pool`` and decoded on ``pool``; ``prefill_ticket`` is released when prefill ends.
    prefill_pool: str | None = None
    prefill_replica_id: str | None = None
    prefill_ticket: str = ""
    router_replica_id: str | None = None
    num_matched_blocks: int = 0  # leading prompt blocks cached on the replica doing the prefill
    num_prompt_blocks: int = 0  # full blocks of the prompt

    @property
    def is_disaggregated(self) -> bool:
        return self.prefill_pool is not None


class RoutingError(Exception):
    """A request the router cannot place (unknown pool, pool serving another model).
    ``param`` names the offending request field; ``status``: 400, or 404 for a model none of whose
    pools serves the request's task (vLLM's server has no such route for that model)."""

    def __init__(self, message: str, param: str, status: int = 400):
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status


WHOLE_REQUEST_ROLES = ("both", "decode")


def eligible_pools(request: RouteRequest | PoolNeeds, pools: Sequence[PoolConfig]) -> list[PoolConfig]:
    """Pools that may run the whole request: the pinned one, else every pool of the model whose
    role can (``both``, or ``decode``, which prefills locally when no PD plan is made), whose
    engine serves the request's task (``deployments.config.task``) and, for a request with a LoRA
    adapter, runs adapters (``PoolConfig.max_loras``; a pin to a pool that cannot: 400 naming model).
    Raises ``RoutingError`` for an unknown pin, a pin to another model, or an unserved model."""
    if request.pool is not None:
        pool = next((p for p in pools if p.name == request.pool), None)
        if pool is None:
            raise RoutingError(f"unknown pool {request.pool!r} (pools: {[p.name for p in pools]})", "x-meshserve-pool")
        if pool.model != request.model:
            raise RoutingError(f"pool {pool.name!r} serves {pool.model!r}, not {request.model!r}", "x-meshserve-pool")
        if request.task not in pool.tasks:
            message = f"pool {pool.name!r} cannot serve {request.task} requests for {request.model!r}"
            raise RoutingError(message, "model")
        if request.lora is not None and not pool.max_loras:
            raise RoutingError(f"pool {pool.name!r} cannot run LoRA adapter {request.lora!r} (no enable_lora)", "model")
        return [pool]
    found = [p for p in pools if p.model == request.model and p.role in WHOLE_REQUEST_ROLES and request.task in p.tasks]
    if not found:
        if any(p.model == request.model for p in pools):
            raise RoutingError(f"model {request.model!r} serves no {request.task} requests", "model", 404)
        raise RoutingError(f"no pool serves model {request.model!r}", "model")
    if request.lora is not None:
        found = [p for p in found if p.max_loras]
        if not found:
            raise RoutingError(f"no pool of {request.model!r} runs LoRA adapter {request.lora!r}", "model")
    return found
