"""Text and JSON values made storable: control characters out, lone surrogates refused, timestamps
read in UTC (docs/kernle-protocol.md §3.7).

Every string a record carries passes `clean_text` (through the reader or `clean_json`); the API's
strict fields and the services use the same functions, so a value is cleaned one way wherever it
arrives.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from typing import Any

from django.utils.dateparse import parse_datetime

from memoryhub.errors import InvalidInput

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")
# What `clean_text` must look at more closely: control characters or lone surrogates, in ONE search.
_UNCLEAN = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]")

NOT_UNICODE = "Must be valid Unicode text (it contains a lone UTF-16 surrogate)."


class InvalidUnicode(InvalidInput):
    """A string holding a lone UTF-16 surrogate. JSON may spell one (`"\\ud800"`) and Python parses
    it, but it is not text: UTF-8, and so Postgres, cannot carry it. Refused, never altered — in a
    sync push it is that operation's conflict, never the whole request's (docs/kernle-protocol.md
    §3.2, §3.7)."""

    code = "invalid_unicode"

    def __init__(self) -> None:
        super().__init__("The request contains text that is not valid Unicode.")


def has_lone_surrogate(value: str) -> bool:
    return _SURROGATE.search(value) is not None


def clean_text(value: str) -> str:
    """Remove null bytes and control characters, keeping tab, newline and carriage return.

    Raises `InvalidUnicode` for a lone surrogate; callers that know the field report it there."""
    # Almost every string is already clean: a search is cheaper than building a substituted copy.
    if _UNCLEAN.search(value) is None:
        return value
    if _SURROGATE.search(value) is not None:
        raise InvalidUnicode()
    return _CONTROL.sub("", value)


def parse_timestamp(value: Any) -> datetime | None:
    """ISO-8601 → aware datetime; a naive value counts as UTC (docs/kernle-protocol.md §3.7)."""
    if isinstance(value, datetime):
        parsed: datetime | None = value
    elif isinstance(value, str):
        try:
            parsed = parse_datetime(value.strip().replace("Z", "+00:00"))
        except ValueError:
            return None
    else:
        return None
    if parsed is None:
        return None
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC)
    # In UTC: Python takes offsets up to ±23:59, PostgreSQL only up to ±15:59 (a DataError there, not
    # a field error). The instant is kept; one that leaves Python's years 1-9999 in UTC is invalid.
    try:
        return parsed.astimezone(UTC)
    except (OverflowError, ValueError):
        return None


def clean_json(value: Any, depth: int = 0) -> Any:
    """Remove null bytes / control characters from every string (and key) of a JSON value."""
    if depth > 20:
        raise InvalidInput("The record is nested too deeply.", fields={"extra": ["Nested too deeply."]})
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {clean_text(str(k)): clean_json(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_json(v, depth + 1) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return clean_text(str(value))
