"""The JSON edge of the ingress's endpoints: a request's body as a JSON object (400 otherwise)
and an ``APIError`` as its OpenAI error response."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from serve_app.http.protocol.errors import APIError, bad_request


async def read_body(request: Request) -> dict[str, Any]:
    """The body as a JSON object; 400 for invalid JSON or another JSON value."""
    try:
        body = await request.json()
    except Exception:
        raise bad_request("the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.to_response().model_dump(), status_code=err.status, headers=err.headers())
