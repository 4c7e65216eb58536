"""A request id on every log line of a request, and of the Celery tasks it queued (docs/configuration.md,
`LOG_FORMAT`).

The id comes from the client's `X-Request-ID` when it is a plain token (8 to 64 of [A-Za-z0-9._-]),
so a load balancer's id carries through; otherwise it is made here. It is sent back in the
response's `X-Request-ID`, set on every log record as `request_id` (`RequestIdFilter`, in
settings.LOGGING), and travels with each task the request sends as a message header: the worker
sets it again while that task runs, so its log lines carry the same id. Ids only: a request id
never holds anything the client wrote but the token itself.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from django.http import HttpRequest, HttpResponseBase

NO_REQUEST = "-"
HEADER = "X-Request-ID"
TASK_HEADER = "memoryhub_request_id"
_TOKEN = re.compile(r"[A-Za-z0-9._-]{8,64}")

current_request_id: ContextVar[str] = ContextVar("current_request_id", default=NO_REQUEST)


def request_id_from(value: str | None) -> str:
    return value if value and _TOKEN.fullmatch(value) else uuid.uuid4().hex


class RequestIdMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        token = current_request_id.set(request_id_from(request.headers.get(HEADER)))
        try:
            response = self.get_response(request)
            response[HEADER] = current_request_id.get()
            return response
        finally:
            current_request_id.reset(token)


class RequestIdFilter(logging.Filter):
    """Every record gets `request_id` (the current request's or task's, else "-")."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = current_request_id.get()
        return True


# --- Celery: the id rides along with the task message ----------------------------------------------

def add_to_task_headers(headers: dict[str, Any] | None = None, **_: Any) -> None:
    """before_task_publish: a task sent while serving a request carries its id."""
    request_id = current_request_id.get()
    if headers is not None and request_id != NO_REQUEST:
        headers[TASK_HEADER] = request_id


_task_tokens: dict[str, Any] = {}


def enter_task(task_id: str | None = None, task: Any = None, **_: Any) -> None:
    """task_prerun: the worker runs the task under the id of the request that sent it."""
    context = getattr(task, "request", None)
    # Celery puts a message's own headers on the request, or under `headers` (by protocol version).
    request_id = getattr(context, TASK_HEADER, None) or (getattr(context, "headers", None) or {}).get(TASK_HEADER)
    if task_id and isinstance(request_id, str) and _TOKEN.fullmatch(request_id):
        _task_tokens[task_id] = current_request_id.set(request_id)


def leave_task(task_id: str | None = None, **_: Any) -> None:
    """task_postrun."""
    token = _task_tokens.pop(task_id or "", None)
    if token is not None:
        current_request_id.reset(token)
