"""The gateway's refusals in OpenAI's error shape, so every client library raises its usual exception type."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from envhub.server.guard import HTTPError

_TYPES = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error"}


class RequestError(HTTPError):
    """A request the gateway refuses: status, message with its fix, OpenAI `code` and `param`."""

    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None) -> None:
        super().__init__(status, message)
        self.code, self.param = code, param


def error_response(exc: HTTPError) -> web.Response:
    """`{"error": {message, type, param, code}}` with the refusal's status and headers."""
    message = f"{exc.error} ({exc.hint})" if exc.hint else exc.error
    body: dict[str, Any] = {
        "message": message,
        "type": _TYPES.get(exc.status, "invalid_request_error"),
        "param": getattr(exc, "param", None),
        "code": getattr(exc, "code", None),
    }
    return web.json_response({"error": body}, status=exc.status, headers=exc.headers)
