"""What an engine replica call's failure means to the ingress: the replica's death (retry, fail
over, tell the routers) or an answer for the client (``APIError``: a 400 naming the field, a 503
with Retry-After, a 500 whose details stay in the log)."""

from __future__ import annotations

import logging

from ray.exceptions import RayActorError, RayTaskError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError, ReplicaUnavailableError

from accel.contract import InvalidRequestError
from serve_app.http.protocol.errors import APIError

logger = logging.getLogger(__name__)


def dead_replica_actor(exc: BaseException) -> tuple[bool, str | None]:
    """(whether ``exc`` says the engine replica's actor is gone, that actor's id if known).

    Only the replica's own death counts: a ``RayTaskError`` raised inside a live replica (e.g.
    an actor it depends on died) is that replica's answer, not its death."""
    if isinstance(exc, RayTaskError):
        return False, None
    if isinstance(exc, RayActorError):
        return True, getattr(exc, "actor_id", None)
    return isinstance(exc, ReplicaUnavailableError), None


class ReplicaDied(Exception):
    """The engine replica serving an attempt is gone (``error``: what the call raised)."""

    def __init__(self, error: Exception, actor_id: str | None):
        super().__init__(str(error))
        self.error, self.actor_id = error, actor_id


def died_error(retry_after_s: int) -> APIError:
    """The 503 of a request whose replica died and that cannot be retried or failed over."""
    return APIError(503, "The engine replica serving this request died; retry.", None, retry_after_s)


def as_api_error(exc: Exception, retry_after_s: int) -> APIError:
    """What the client gets for an engine call that failed without the replica dying."""
    cause = getattr(exc, "cause", None) or exc  # a RayTaskError's cause: what the replica raised
    invalid = exc if isinstance(exc, InvalidRequestError) else cause
    if isinstance(invalid, InvalidRequestError):
        return APIError(400, invalid.message, invalid.field)
    if isinstance(exc, BackPressureError):
        status = int(getattr(exc, "args", (0, 0, 503))[2] or 503)
        return APIError(status, "The engines are at capacity; retry later.", None, retry_after_s)
    if isinstance(exc, DeploymentUnavailableError):
        return APIError(503, "No engine replica is available; retry later.", None, retry_after_s)
    # The details (type, message, traceback) go to the log only: clients never see internals.
    logger.error("engine request failed: %s: %s", type(cause).__name__, cause, exc_info=exc)
    return APIError(500, "The engine failed to serve this request; see the server log.")
