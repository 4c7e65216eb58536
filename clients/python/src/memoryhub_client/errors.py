"""Exceptions: one class per kind of refusal, each carrying MemoryHub's error contract.

Every error answer of the API has the shape ``{"error": {"code", "message", "fields"}, "detail"}``
(the service's docs/api.md §1). :class:`ApiError` keeps all of it: ``status``, ``code``,
``message``, ``fields`` (field name → messages) and, on 429/503, ``retry_after`` in seconds.
"""

from __future__ import annotations

from typing import Any

import httpx


class MemoryHubError(Exception):
    """Base of every exception this client raises."""


class TransportError(MemoryHubError):
    """The service could not be reached (connection refused, timed out, reset)."""


class ApiError(MemoryHubError):
    """MemoryHub answered with an error (4xx or 5xx)."""

    def __init__(self, status: int, code: str, message: str, fields: dict[str, Any] | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(f"{status} {code}: {message}" + (f" {fields}" if fields else ""))
        self.status = status
        self.code = code
        self.message = message
        self.fields: dict[str, Any] = fields or {}
        self.retry_after = retry_after


class BadRequest(ApiError):
    """400: the request is invalid; ``fields`` names what is wrong."""


class UnknownField(BadRequest):
    """400 ``unknown_field``: a field the memory's kind does not have (``fields`` names it and
    suggests the closest known one). Fields of your own go under ``extra``."""


class Unauthorized(ApiError):
    """401: no key, or a key that is not valid (revoked, expired)."""


class QuotaExceeded(ApiError):
    """402: the school's plan does not allow it (stacks, storage)."""


class Forbidden(ApiError):
    """403: the key may see the stack but not do this (a read-only key writing, …)."""


class NotFound(ApiError):
    """404: there is no such thing, or the key may not see it (another school's stack)."""


class Conflict(ApiError):
    """409: the state forbids it (an archived stack refuses writes, …)."""


class PayloadTooLarge(ApiError):
    """413: the body is over the service's limits."""


class Unprocessable(ApiError):
    """422: well-formed, but the service refuses to store it."""


class RateLimited(ApiError):
    """429: still rate-limited after the client's retries; ``retry_after`` says when to try again."""


class ServiceUnavailable(ApiError):
    """503: the service cannot answer now (its database or Redis); still so after the retries."""


class ServerError(ApiError):
    """Any other 5xx."""


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest, 401: Unauthorized, 402: QuotaExceeded, 403: Forbidden, 404: NotFound,
    409: Conflict, 413: PayloadTooLarge, 422: Unprocessable, 429: RateLimited, 503: ServiceUnavailable,
}


def retry_after_seconds(response: httpx.Response) -> float | None:
    """The response's ``Retry-After`` in seconds (only the delay-seconds form MemoryHub sends)."""
    value = response.headers.get("Retry-After")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def error_from_response(response: httpx.Response) -> ApiError:
    """The exception for an error answer, read from the error contract (or made up from the
    status when the body is not one, e.g. a proxy's page)."""
    code, message = f"http_{response.status_code}", response.reason_phrase or "error"
    fields: dict[str, Any] = {}
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict):
            code = str(error.get("code") or code)
            message = str(error.get("message") or body.get("detail") or message)
            if isinstance(error.get("fields"), dict):
                fields = error["fields"]
        elif isinstance(body.get("detail"), str):
            message = body["detail"]
    status = response.status_code
    cls = _BY_STATUS.get(status, ServerError if status >= 500 else ApiError)
    if status == 400 and code == "unknown_field":
        cls = UnknownField
    return cls(status, code, message, fields, retry_after_seconds(response))
