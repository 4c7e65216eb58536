"""The reader the per-kind schemas are written with: typed fields read from a payload, every field
error collected instead of stopping at the first.

Why a hand-written reader (`Reader`) and not DRF serializers, which read every other input of
the API (memories.serializers): this runs once per record of every sync push, up to 1,000 per
request, and is already the largest per-operation cost of a push; a DRF serializer checking the
same fields costs over ten times this reader (instantiating one copies all its fields;
docs/benchmarks.md "Figures behind code choices"). The HTTP
endpoints that carry a record check their envelope with a serializer and the record here, so a
memory is validated by one schema whichever way it arrives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from memories.records.cleaning import NOT_UNICODE, InvalidUnicode, clean_json, clean_text, parse_timestamp
from memories.records.vocabulary import GOAL_PRIORITY_LABELS, ITEM_MAX, LIST_ITEMS


class FieldErrors:
    def __init__(self) -> None:
        self.fields: dict[str, list[str]] = {}

    def add(self, name: str, message: str) -> None:
        self.fields.setdefault(name, []).append(message)


_MISSING = object()


@dataclass
class Reader:
    """Reads typed fields from a payload, collecting field errors instead of stopping at the first."""

    payload: dict[str, Any]
    errors: FieldErrors
    used: set[str] = field(default_factory=set)
    # Sync stores drives / relationships / playbooks even without their natural key (see
    # normalize_memory's `natural_key_optional`).
    natural_key_optional: bool = False

    def _get(self, name: str) -> Any:
        self.used.add(name)
        return self.payload.get(name, _MISSING)

    def string(self, name: str, *, max_length: int, default: str | None = "", required: bool = False,
               choices: frozenset[str] | None = None, nullable: bool = False) -> Any:
        value = self._get(name)
        if value is _MISSING or value is None:
            if required:
                self.errors.add(name, "This field is required.")
                return default
            return None if nullable else default
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            self.errors.add(name, "Must be a string.")
            return default
        try:
            text = clean_text(value if type(value) is str else str(value))
        except InvalidUnicode:
            self.errors.add(name, NOT_UNICODE)
            return default
        if required and not text.strip():
            self.errors.add(name, "This field may not be blank.")
            return default
        if len(text) > max_length:
            self.errors.add(name, f"At most {max_length} characters (got {len(text)}).")
            return default
        if choices is not None and text not in choices:
            self.errors.add(name, f"Must be one of: {', '.join(sorted(c for c in choices if c))}.")
            return default
        return text

    def number(self, name: str, *, default: float | None, low: float, high: float) -> Any:
        value = self._get(name)
        if value is _MISSING or value is None:
            return default
        number = _as_number(value)
        if number is None:
            self.errors.add(name, "Must be a number.")
            return default
        if not low <= number <= high:
            self.errors.add(name, f"Must be between {low:g} and {high:g}.")
            return default
        return number

    def integer(self, name: str, *, default: int | None, low: int, high: int) -> Any:
        value = self._get(name)
        if value is _MISSING or value is None:
            return default
        number = _as_number(value)
        if number is None or number != int(number):
            self.errors.add(name, "Must be an integer.")
            return default
        if not low <= number <= high:
            self.errors.add(name, f"Must be between {low} and {high}.")
            return default
        return int(number)

    def boolean(self, name: str, *, default: bool | None) -> Any:
        value = self._get(name)
        if value is _MISSING or value is None:
            return default
        if isinstance(value, bool):
            return value
        if value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        self.errors.add(name, "Must be true or false.")
        return default

    def string_list(self, name: str, *, max_items: int = LIST_ITEMS, item_max: int = ITEM_MAX,
                    required: bool = False) -> list[str]:
        value = self._get(name)
        if value is _MISSING or value is None:
            if required:
                self.errors.add(name, "This field is required.")
            return []
        if isinstance(value, str):  # a lone string is a one-item list, not a list of characters
            value = [value]
        if not isinstance(value, (list, tuple)):
            self.errors.add(name, "Must be a list of strings.")
            return []
        if len(value) > max_items:
            self.errors.add(name, f"At most {max_items} items (got {len(value)}).")
            return []
        result: list[str] = []
        for item in value:
            if item is None:
                continue
            if isinstance(item, bool) or not isinstance(item, (str, int, float)):
                self.errors.add(name, "Every item must be a string.")
                return []
            try:
                text = clean_text(item if type(item) is str else str(item))
            except InvalidUnicode:
                self.errors.add(name, NOT_UNICODE)
                return []
            if len(text) > item_max:
                self.errors.add(name, f"Items are at most {item_max} characters.")
                return []
            result.append(text)
        return result

    def dict_list(self, name: str, *, required: bool = False) -> list[Any]:
        """A list of steps: dicts (kernle) or plain strings; nested strings are cleaned."""
        value = self._get(name)
        if value is _MISSING or value is None:
            if required:
                self.errors.add(name, "This field is required.")
            return []
        if not isinstance(value, (list, tuple)):
            self.errors.add(name, "Must be a list.")
            return []
        if len(value) > LIST_ITEMS:
            self.errors.add(name, f"At most {LIST_ITEMS} items (got {len(value)}).")
            return []
        result: list[Any] = []
        for item in value:
            if not isinstance(item, (dict, str)):
                self.errors.add(name, "Every item must be an object or a string.")
                return []
            try:
                result.append(clean_json(item))
            except InvalidUnicode:
                self.errors.add(name, NOT_UNICODE)
                return []
        return result

    def timestamp(self, name: str) -> datetime | None:
        value = self._get(name)
        if value is _MISSING or value is None or value == "":
            return None
        parsed = parse_timestamp(value)
        if parsed is None:
            self.errors.add(name, "Must be an ISO-8601 date-time.")
        return parsed

    def json_value(self, name: str) -> Any:
        value = self._get(name)
        if value is _MISSING:
            return None
        try:
            return clean_json(value)
        except InvalidUnicode:
            self.errors.add(name, NOT_UNICODE)
            return None

    def goal_priority(self, name: str) -> Any:
        """kernle sends a goal's priority as a label ("medium"), other clients 0-100: keep what was sent."""
        raw = self.payload.get(name)
        if isinstance(raw, str) and not raw.strip().lstrip("-").replace(".", "", 1).isdigit():
            label = self.string(name, max_length=32, default="medium")
            if label and label.lower() not in GOAL_PRIORITY_LABELS:
                self.errors.add(name, f"Must be 0-100 or one of: {', '.join(GOAL_PRIORITY_LABELS)}.")
            return (label or "medium").lower()
        if raw is not None:
            return self.integer(name, default=50, low=0, high=100)
        self.used.add(name)
        return "medium"

    def require_one_of(self, what: str, values: dict[str, Any]) -> None:
        """At least one of these (already read) fields must be non-blank; the error names the first."""
        if any(name in self.errors.fields for name in values):
            return
        if not any(isinstance(value, str) and value.strip() for value in values.values()):
            self.errors.add(next(iter(values)), f"{what} needs `{'` or `'.join(values)}`.")


def _as_number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return None
    else:
        return None
    return number if math.isfinite(number) else None
