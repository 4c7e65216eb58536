"""Shared API pagination: opaque cursors, stable under concurrent inserts, and one rule for cursors.

The rule (docs/architecture.md §8.1): a cursor is either absent (or empty), meaning the first page,
or one this API returned; anything else is a 400 `invalid_cursor` naming `cursor`. Never a silent
restart from the first page: a client resuming a walk with a damaged cursor would re-read (and
re-process) everything without knowing. It holds for every cursor-paginated list
(`StableCursorPagination`: memories, stacks, members, the audit log) and for the native sync pull,
whose cursor is its own (memories.sync.protocol.cursor_decode) but whose refusal is `invalid_cursor()`.
"""

from __future__ import annotations

import base64
import binascii
from datetime import UTC, datetime
from typing import Any
from urllib import parse

from django.core.exceptions import FieldDoesNotExist, ValidationError
from django.db.models import Field, QuerySet
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request

from memoryhub.errors import InvalidInput

# The keys of DRF's cursor query string: offset, reverse, position (CursorPagination.encode_cursor).
_CURSOR_KEYS = frozenset({"o", "r", "p"})


def invalid_cursor() -> InvalidInput:
    """The one refusal of a cursor this API did not issue (400 `invalid_cursor`)."""
    return InvalidInput("Invalid cursor: pass back a cursor this API returned, or none for the first page.",
                        code="invalid_cursor", fields={"cursor": ["Not a cursor this API returned."]})


class StableCursorPagination(CursorPagination):
    page_size = 50
    page_size_query_param = "limit"
    max_page_size = 500
    ordering = "-created_at"

    def paginate_queryset(self, queryset: QuerySet[Any], request: Request, view: Any = None) -> list[Any] | None:
        # Checked before DRF reads it: what passes is read by DRF's own decoder exactly as written.
        try:
            position_field = queryset.model._meta.get_field(self.ordering.lstrip("-"))
        except FieldDoesNotExist:
            position_field = None
        check_cursor(request.query_params.get(self.cursor_query_param), position_field)
        return super().paginate_queryset(queryset, request, view)


def check_cursor(encoded: str | None, position_field: Field[Any, Any] | None) -> None:
    """`invalid_cursor()` unless `encoded` is absent, empty, or a cursor DRF's CursorPagination
    issues (base64 of `o=<offset>&r=1&p=<position>`).

    DRF's own reader starts again from the first page for any base64 text without these keys (e.g.
    `YWJj`, "abc") and answers 404 for the rest; a position its ordering field cannot hold used to
    reach the ORM. Here: strict base64, only the keys o, r and p, each once, an offset of ASCII
    digits, r 0 or 1, a position or an offset, and a position the field reads as an aware timestamp."""
    if not encoded:
        return
    try:
        text = base64.b64decode(encoded.encode("ascii"), validate=True).decode("ascii")
        tokens = parse.parse_qs(text, keep_blank_values=True, strict_parsing=True)
    except (ValueError, UnicodeError, binascii.Error):
        raise invalid_cursor() from None
    if not tokens.keys() <= _CURSOR_KEYS or any(len(values) != 1 for values in tokens.values()):
        raise invalid_cursor()
    offset = tokens.get("o", ["0"])[0]
    position = tokens.get("p", [None])[0]
    if not (offset.isascii() and offset.isdigit()) or tokens.get("r", ["0"])[0] not in ("0", "1"):
        raise invalid_cursor()
    if position is None:
        if int(offset) == 0:
            raise invalid_cursor()  # DRF never issues a cursor that points at the first page
        return
    if position_field is None:
        return
    try:
        value = position_field.to_python(position)
        if isinstance(value, datetime):
            # An aware timestamp PostgreSQL can compare (a naive or unrepresentable one cannot).
            if value.tzinfo is None:
                raise ValueError(position)
            value.astimezone(UTC)
    except (ValidationError, ValueError, TypeError, OverflowError):
        raise invalid_cursor() from None
