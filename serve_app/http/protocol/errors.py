"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}`` with an HTTP status.

Types are spelled as vLLM's server spells them (``BadRequestError``, ``NotFoundError``, ...), so
clients that handle vLLM errors handle ours.
"""

from __future__ import annotations

from http import HTTPStatus

from pydantic import BaseModel

_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    429: "RateLimitError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(BaseModel):
    error: ErrorInfo


class APIError(Exception):
    """An error the ingress answers with ``status`` and an OpenAI error body.

    ``retry_after_s`` (429/503 only) becomes a ``Retry-After`` header.
    """

    def __init__(self, status: int, message: str, param: str | None = None, retry_after_s: int | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.retry_after_s = retry_after_s

    @property
    def error_type(self) -> str:
        return _TYPES.get(self.status, HTTPStatus(self.status).phrase.replace(" ", "") + "Error")

    def to_response(self) -> ErrorResponse:
        return ErrorResponse(
            error=ErrorInfo(message=self.message, type=self.error_type, param=self.param, code=self.status)
        )

    def headers(self) -> dict[str, str]:
        return {} if self.retry_after_s is None else {"Retry-After": str(self.retry_after_s)}


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param)


def model_not_found(model: str | None) -> APIError:
    return APIError(404, f"The model `{model}` does not exist.", "model")
