"""One error contract for the whole API.

Domain code raises the typed errors below; `api_exception_handler` (DRF's EXCEPTION_HANDLER) turns
them, DRF's own exceptions and infrastructure failures into

    {"error": {"code": "...", "message": "...", "fields": {...}}, "detail": "..."}

`detail` repeats the message because the kernle CLI prints `detail` (docs/kernle-protocol.md §1.4).
An unreachable database or Redis is a 503 with Retry-After (fail closed), never a 500; for the views
that are not DRF's (the dashboard, sign-in) `ServiceUnavailableMiddleware` answers the same.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, cast

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import DatabaseError, DataError, InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponseBase, JsonResponse
from psycopg.errors import LockNotAvailable
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rest_framework import exceptions as drf
from rest_framework.response import Response

from memoryhub.outage import retry_after_seconds
from memoryhub.renderers import FastJSONRenderer

logger = logging.getLogger(__name__)



class DomainError(Exception):
    """Base of every error domain code raises on purpose. Subclasses fix status and code."""

    status = 400
    code = "bad_request"
    retry_after: int | None = None  # seconds, sent as Retry-After when set

    def __init__(self, message: str, *, code: str | None = None, fields: dict[str, Any] | None = None):
        super().__init__(message)
        self.message = message
        if code:
            self.code = code
        self.fields = fields or {}


class InvalidInput(DomainError):
    status = 400
    code = "invalid"


class NotAuthenticated(DomainError):
    status = 401
    code = "not_authenticated"


class Forbidden(DomainError):
    status = 403
    code = "forbidden"


class NotFound(DomainError):
    status = 404
    code = "not_found"


class Conflict(DomainError):
    status = 409
    code = "conflict"


class PayloadTooLarge(DomainError):
    status = 413
    code = "too_large"


class Unprocessable(DomainError):
    """Well-formed input the service refuses to store (e.g. a secret redaction cannot make safe)."""

    status = 422
    code = "unprocessable"


class QuotaExceeded(DomainError):
    status = 402
    code = "quota_exceeded"


class ServiceUnavailable(DomainError):
    status = 503
    code = "service_unavailable"


class BillingUnavailable(ServiceUnavailable):
    """Payments are not configured (no chain RPC or no treasury address): billing refuses rather
    than accept a transfer it cannot check or one sent to nobody in particular (fail closed)."""

    code = "billing_unavailable"


class ChainUnavailable(ServiceUnavailable):
    """The chain's RPC node did not answer; the payment routes say so with Retry-After, nothing
    else is affected."""

    code = "chain_unavailable"


def error_body(code: str, message: str, fields: dict[str, Any] | None = None) -> dict[str, Any]:
    body = {"error": {"code": code, "message": message, "fields": fields or {}}, "detail": message}
    return utf8_encodable(body)


def utf8_encodable(value: Any) -> Any:
    """A JSON value that echoes the client's input, made renderable. Field errors echo the client's
    value ("'x' is not a valid choice") and sync answers echo its names; a lone surrogate in one
    would make the JSON renderer fail while rendering — outside any handler, so a 500. Replace
    what UTF-8 cannot carry; everything else passes through unchanged."""
    if isinstance(value, str):
        return value if value.isascii() else value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, dict):
        return {utf8_encodable(k): utf8_encodable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [utf8_encodable(v) for v in value]
    return value


def _drf_fields(detail: Any) -> dict[str, Any]:
    """Flatten DRF's nested ValidationError detail into {field: [messages]}."""
    if isinstance(detail, dict):
        return {str(key): _drf_fields(value) if isinstance(value, dict) else _as_messages(value)
                for key, value in detail.items()}
    return {"non_field_errors": _as_messages(detail)}


def _as_messages(value: Any) -> list[Any]:
    if isinstance(value, list):
        return [_drf_fields(v) if isinstance(v, dict) else str(v) for v in value]
    return [str(value)]


# A statement of this request waited for a row or table lock longer than the process's
# `lock_timeout` (DB_LOCK_TIMEOUT_MS, docs/operations.md §6 "Lock waits"): another change holds it.
BUSY = "busy"


def unavailable_part(exc: BaseException) -> str | None:
    """The backing service `exc` says is unreachable ("the database": down, or no pooled connection
    free within the pool's timeout; "the cache": Redis), `BUSY` for a lock wait cut short, or None
    for any other error."""
    if isinstance(exc, OperationalError) and isinstance(exc.__cause__, LockNotAvailable):
        return BUSY
    if isinstance(exc, (OperationalError, InterfaceError)):
        return "the database"
    if isinstance(exc, (RedisConnectionError, RedisTimeoutError)):
        return "the cache"
    return None


def _unavailable(part: str, exc: BaseException, response_class: Callable[..., HttpResponseBase]) -> HttpResponseBase:
    if part == BUSY:
        logger.warning("a lock wait passed the lock timeout (%s)", type(exc).__name__)
        body = error_body(BUSY, "Another change to the same data is still in progress; retry after the time in "
                                "Retry-After. Nothing of this request was applied.")
    else:
        logger.warning("%s unavailable: %s", part, type(exc).__name__)
        body = error_body("service_unavailable", f"{part} is unavailable; retry shortly")
    response = response_class(body, status=503)
    response["Retry-After"] = str(retry_after_seconds(part))
    # Logged above as a WARNING naming the part; Django would add an ERROR line per request.
    response._has_been_logged = True  # type: ignore[attr-defined]
    return response


class ServiceUnavailableMiddleware:
    """The API's 503 for every other view: a dashboard page, a sign-in page (docs/architecture.md §8.3).

    DRF views map an unreachable database or Redis in `api_exception_handler`; any other view's
    exception reaches Django's 500 handler instead. This middleware's `process_exception` answers
    such a view's database or Redis failure (a pool exhausted included) with the same 503, the
    error contract and Retry-After; every other exception passes on untouched."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponseBase | None:
        part = unavailable_part(exception)
        return None if part is None else _unavailable(part, exception, JsonResponse)


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response:
    _render_errors_as_json(context.get("request"))
    if isinstance(exc, DomainError):
        response = Response(error_body(exc.code, exc.message, exc.fields), status=exc.status)
        if exc.retry_after is not None:
            response["Retry-After"] = str(exc.retry_after)
            # A refusal the service chose (memoryhub.lanes), counted by /metrics: not an error to log.
            response._has_been_logged = True  # type: ignore[attr-defined]
        elif exc.status == 503:
            response["Retry-After"] = str(retry_after_seconds(exc.code))
        if exc.status == 401:
            response["WWW-Authenticate"] = "Bearer"
        return response
    part = unavailable_part(exc)
    if part is not None:
        return cast(Response, _unavailable(part, exc, Response))
    if isinstance(exc, Http404):
        return Response(error_body("not_found", "Not found."), status=404)
    if isinstance(exc, DjangoPermissionDenied):
        return Response(error_body("forbidden", "Permission denied."), status=403)
    if isinstance(exc, drf.APIException):
        if isinstance(exc, drf.ValidationError):
            body = error_body("invalid", "The request is invalid.", _drf_fields(exc.detail))
        else:
            detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
            body = error_body(_drf_code(exc), detail)
        response = Response(body, status=exc.status_code)
        wait = getattr(exc, "wait", None)  # set by DRF's Throttled; absent from the type stubs
        if isinstance(exc, drf.Throttled) and wait is not None:
            response["Retry-After"] = str(max(1, int(wait + 0.999)))
        if exc.status_code == 401:
            response["WWW-Authenticate"] = "Bearer"
        return response
    if isinstance(exc, DjangoValidationError):
        # A model field refusing a client-supplied value on the request path, e.g. a tampered
        # pagination cursor whose position is not a timestamp: the client's input, not our bug.
        return Response(error_body("invalid", "The request contains an invalid value.",
                                   {"non_field_errors": [str(m) for m in exc.messages]}), status=400)
    if isinstance(exc, RecursionError):
        # Python's JSON decoder gives up on ~1000 levels of nesting with RecursionError (not the
        # ValueError DRF's parser maps to 400). Only a hostile body gets there.
        return Response(error_body("invalid", "The JSON body is nested too deeply."), status=400)
    if isinstance(exc, UnicodeEncodeError):
        # JSON may spell a lone UTF-16 surrogate ("\ud800"); it decodes to a str that cannot be
        # encoded as UTF-8, so any later encode() or database write fails. Invalid client text.
        return Response(error_body("invalid", "The request contains text that is not valid Unicode."), status=400)
    if isinstance(exc, DataError):
        # A value Postgres cannot hold (NUL bytes, out-of-range numbers) that slipped past
        # validation is still the client's bad input: a 400, and the statement stored nothing.
        return Response(error_body("invalid", "The request contains a value that cannot be stored."), status=400)
    if isinstance(exc, DatabaseError):
        # Any other database error on the request path is a bug or a constraint we did not map;
        # it must still not leak a trace. Logged with the type only: no memory text in logs.
        logger.error("database error on API path: %s", type(exc).__name__, exc_info=True)
        return Response(error_body("internal_error", "Internal error."), status=500)
    logger.error("unhandled API error: %s", type(exc).__name__, exc_info=True)
    return Response(error_body("internal_error", "Internal error."), status=500)


def _render_errors_as_json(request: Any) -> None:
    """Errors are JSON even where the endpoint's success body is not (e.g. MEMORY.md as markdown)."""
    if request is not None and hasattr(request, "accepted_renderer"):
        request.accepted_renderer = FastJSONRenderer()
        request.accepted_media_type = FastJSONRenderer.media_type


def _drf_code(exc: drf.APIException) -> str:
    codes = exc.get_codes()
    return codes if isinstance(codes, str) else exc.default_code


def json_not_found(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return JsonResponse(error_body("not_found", "Not found."), status=404)


def json_server_error(request: HttpRequest) -> JsonResponse:
    return JsonResponse(error_body("internal_error", "Internal error."), status=500)


def json_bad_request(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return JsonResponse(error_body("bad_request", "Bad request."), status=400)


def json_forbidden(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return JsonResponse(error_body("forbidden", "Permission denied."), status=403)
