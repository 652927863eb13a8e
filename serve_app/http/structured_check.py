"""The ingress's compile check of a request's structured-output spec (a 400 naming the field when
it does not compile), run off the event loop: parsing a large schema or an adversarial regex
takes time. Like vLLM (``VLLM_REGEX_COMPILATION_TIMEOUT_S``, 5 s), a check that runs longer is
refused; its thread is left to finish on its own (Python cannot stop it).

Results are cached per spec (specs are frozen and hashable): agents resend the same schema.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from accel.contract import InvalidRequestError, StructuredOutputSpec
from accel.structured.grammar import check_spec

CHECK_TIMEOUT_S = 5.0
_CACHE_SIZE = 1024
_passed: OrderedDict[StructuredOutputSpec, None] = OrderedDict()


async def check_structured_outputs(spec: StructuredOutputSpec | None) -> None:
    if spec is None:
        return
    if spec in _passed:
        _passed.move_to_end(spec)
        return
    try:
        await asyncio.wait_for(asyncio.to_thread(check_spec, spec), CHECK_TIMEOUT_S)
    except asyncio.TimeoutError:  # (TimeoutError only from Python 3.11)
        raise InvalidRequestError(
            spec.param, f"compiling the {spec.kind.value} constraint timed out after {CHECK_TIMEOUT_S:g}s"
        ) from None
    _passed[spec] = None
    if len(_passed) > _CACHE_SIZE:
        _passed.popitem(last=False)
