"""The input fields the memories API's request serializers are built from (memories.serializers).

DRF's own fields coerce generously (a CharField takes 5 as "5", a BooleanField takes "yes", a
DateTimeField reads a naive time in the server's zone); agents get a 400 instead, and times are
read the way every memory timestamp is. A JSON null in an optional field means "not given".
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from rest_framework import serializers

from memories.models import MemoryKind
from memories.records.cleaning import clean_text, parse_timestamp

# Kernle sends plural table names for kinds (`memory_types: ["episodes"]`); search accepts those
# and the singular kinds alike.
KERNLE_TYPES = {"episodes": "episode", "notes": "note", "beliefs": "belief", "values": "value", "goals": "goal"}
KERNLE_DEFAULT_KINDS = tuple(KERNLE_TYPES.values())


class _NullIsAbsent(serializers.Field):
    def validate_empty_values(self, data: Any) -> tuple[bool, Any]:
        if data is None and not self.required:
            data = serializers.empty
        return super().validate_empty_values(data)


class StrictCharField(_NullIsAbsent, serializers.CharField):
    """A string and nothing else. `remove_control_characters`: as every stored string
    (memories.records.cleaning.clean_text), for values that are stored rather than looked up."""

    def __init__(self, *, remove_control_characters: bool = False, **kwargs: Any) -> None:
        self.remove_control_characters = remove_control_characters
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(clean_text(data) if self.remove_control_characters else data)


class StrictBooleanField(serializers.BooleanField):
    """true or false, not "yes" or 1."""

    def to_internal_value(self, data: Any) -> bool:
        if data is True or data is False:
            return data
        self.fail("invalid", input=data)


class StrictUUIDField(serializers.UUIDField):
    """A UUID spelled as a string, not an integer."""

    def to_internal_value(self, data: Any) -> uuid.UUID:
        if not isinstance(data, str):
            self.fail("invalid", value=data)
        return super().to_internal_value(data)


class ClampedIntegerField(_NullIsAbsent, serializers.IntegerField):
    """An integer brought into [low, high] rather than refused (docs/algorithms.md §7.4: search
    clamps `limit`); anything that is not an integer is refused. Floats are truncated."""

    def __init__(self, *, low: int, high: int, **kwargs: Any) -> None:
        self.low, self.high = low, high
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool):
            self.fail("invalid")
        try:
            value = int(data)
        except (TypeError, ValueError, OverflowError):
            self.fail("invalid")
        return max(self.low, min(self.high, value))


class ClampedFloatField(_NullIsAbsent, serializers.FloatField):
    """A finite number brought into [low, high] rather than refused."""

    def __init__(self, *, low: float, high: float, **kwargs: Any) -> None:
        self.low, self.high = low, high
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool) or not isinstance(data, (int, float, str)):
            self.fail("invalid")
        try:
            value = float(data)
        except (TypeError, ValueError, OverflowError):
            self.fail("invalid")
        if value != value:  # NaN
            self.fail("invalid")
        return max(self.low, min(self.high, value))


class TimestampField(_NullIsAbsent, serializers.DateTimeField):
    """ISO 8601, read the way every memory timestamp is (memories.records.cleaning.parse_timestamp: a naive
    value is UTC); "" means not given."""

    default_error_messages = {"invalid": "Must be an ISO 8601 date-time."}

    def to_internal_value(self, value: Any) -> datetime | None:
        if value == "":
            return None
        try:
            parsed = parse_timestamp(value)
        except Exception:  # any unparsable value is the caller's error, never a 500
            parsed = None
        if parsed is None:
            self.fail("invalid")
        return parsed


class StringListField(_NullIsAbsent, serializers.ListField):
    """A list of strings, each trimmed; blank ones are dropped."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("child", StrictCharField(allow_blank=True))
        kwargs.setdefault("default", list)
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> list[str]:
        return [item for item in super().to_internal_value(data) if item]


class MemoryKindListField(StringListField):
    """Memory kinds, singular or kernle's plural table names, any case; repeats dropped."""

    def to_internal_value(self, data: Any) -> tuple[str, ...]:  # type: ignore[override]
        kinds = []
        for value in super().to_internal_value(data):
            kind = KERNLE_TYPES.get(value.lower(), value.lower())
            if kind not in MemoryKind.values:
                raise serializers.ValidationError(
                    f"Unknown memory kind {value!r}; must be among: {', '.join(MemoryKind.values)}.")
            kinds.append(kind)
        return tuple(dict.fromkeys(kinds))


class CommaSeparatedListField(serializers.ListField):
    """A query-string list: `?kind=note,belief` and `?kind=note&kind=belief` alike."""

    def to_internal_value(self, data: Any) -> list[Any]:
        if isinstance(data, (list, tuple)):
            data = [part for value in data for part in str(value).split(",") if part]
        return super().to_internal_value(data)
