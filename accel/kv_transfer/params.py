"""Our ``KVTransferParams`` <-> the ``kv_transfer_params`` dict vLLM carries per request.

vLLM keeps a request's params in ``SamplingParams.extra_args["kv_transfer_params"]`` (the scheduler
connector reads ``request.kv_transfer_params``) and returns the producer's answer as
``RequestOutput.kv_transfer_params``. Key names follow vLLM's NIXL convention
(``do_remote_decode`` / ``do_remote_prefill``) plus ours (``transfer_id``, ``num_tokens``).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from accel.contract import KVTransferParams


def to_dict(params: KVTransferParams) -> dict[str, Any]:
    return {
        "do_remote_decode": params.do_remote_decode,
        "do_remote_prefill": params.do_remote_prefill,
        "transfer_id": params.transfer_id,
        "num_tokens": params.num_tokens,
    }


def from_dict(values: Mapping[str, Any] | None) -> KVTransferParams | None:
    if not values:
        return None
    return KVTransferParams(
        do_remote_decode=bool(values.get("do_remote_decode")),
        do_remote_prefill=bool(values.get("do_remote_prefill")),
        transfer_id=values.get("transfer_id") or None,
        num_tokens=int(values.get("num_tokens") or 0),
    )


def new_transfer_id(request_id: str) -> str:
    """Unique per prefill, readable in logs; never vLLM's internal (suffixed) request id."""
    return f"{request_id}.{uuid.uuid4().hex[:12]}"


def exported(transfer_id: str, num_tokens: int) -> KVTransferParams:
    """What a prefill returns and the decode request carries."""
    return KVTransferParams(do_remote_prefill=True, transfer_id=transfer_id, num_tokens=num_tokens)
