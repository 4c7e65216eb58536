"""What each kind accepts: the native API's strictness and the OpenAPI document's field lists.

`kind_fields` gives the fields a kind's record may carry, recorded from the validation itself;
`native_record` is the native API's reading of a record (unknown keys are a 400 `unknown_field`,
fields of one's own go under `extra`). Kernle sync never asks (docs/kernle-protocol.md §3.7).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from memories.records.reader import FieldErrors, Reader
from memories.records.schemas import PASSTHROUGH, SCHEMAS, common_columns
from memories.records.vocabulary import GOAL_PRIORITY_LABELS, ITEM_MAX, LIST_ITEMS, SERVER_CONTROLLED
from memoryhub.errors import InvalidInput

# The field list of a kind is not written down a second time: `_Recorder` runs the kind's schema
# function (and the common fields) on an empty payload and writes down every field it reads, with
# its type and limits. The native API refuses keys outside that list (`native_record`) and its
# OpenAPI document describes exactly that list (memories.serializers.openapi), so neither can drift from the
# validation in memories.records.schemas. Kernle sync never asks: it keeps unknown fields in `extra`
# (docs/kernle-protocol.md §3.7).

EXTRA_FIELD = "extra"  # the native API's explicit home for fields a kind does not model
UNKNOWN_FIELD = "unknown_field"
# Where a client that sends `text` (derived by the server) most likely meant to write.
_MAIN_FIELD = {"raw": "content", "episode": "objective", "note": "content", "belief": "statement",
               "value": "statement", "goal": "title", "drive": "drive_type", "relationship": "entity_name",
               "playbook": "description"}


@dataclass(frozen=True)
class FieldSpec:
    """One field a kind's schema reads, as the schema declares it."""

    name: str
    # string | number | integer | boolean | string_list | object_list | timestamp | any | goal_priority
    type: str
    required: bool = False
    max_length: int | None = None
    choices: tuple[str, ...] = ()
    low: float | None = None
    high: float | None = None
    default: Any = None
    max_items: int | None = None


@dataclass(frozen=True)
class KindFields:
    kind: str
    fields: tuple[FieldSpec, ...]
    # Groups of which at least one field must be non-blank (a raw entry: content or blob).
    one_of_required: tuple[tuple[str, ...], ...]

    @property
    def names(self) -> frozenset[str]:
        return frozenset(spec.name for spec in self.fields)


class _Recorder(Reader):
    """A reader that reads nothing: each call writes down the field it was asked for."""

    def __init__(self) -> None:
        super().__init__(payload={}, errors=FieldErrors())
        self.specs: dict[str, FieldSpec] = {}
        self.groups: list[tuple[str, ...]] = []

    def _record(self, spec: FieldSpec) -> None:
        self.used.add(spec.name)
        self.specs.setdefault(spec.name, spec)

    def string(self, name: str, *, max_length: int, default: str | None = "", required: bool = False,
               choices: frozenset[str] | None = None, nullable: bool = False) -> Any:
        self._record(FieldSpec(name, "string", required=required, max_length=max_length,
                               choices=tuple(sorted(choices or ())), default=None if nullable else default or None))
        return default

    def number(self, name: str, *, default: float | None, low: float, high: float) -> Any:
        self._record(FieldSpec(name, "number", low=low, high=high, default=default))
        return default

    def integer(self, name: str, *, default: int | None, low: int, high: int) -> Any:
        self._record(FieldSpec(name, "integer", low=low, high=high, default=default))
        return default

    def boolean(self, name: str, *, default: bool | None) -> Any:
        self._record(FieldSpec(name, "boolean", default=default))
        return default

    def string_list(self, name: str, *, max_items: int = LIST_ITEMS, item_max: int = ITEM_MAX,
                    required: bool = False) -> list[str]:
        self._record(FieldSpec(name, "string_list", required=required, max_length=item_max, max_items=max_items))
        return []

    def dict_list(self, name: str, *, required: bool = False) -> list[Any]:
        self._record(FieldSpec(name, "object_list", required=required, max_items=LIST_ITEMS))
        return []

    def timestamp(self, name: str) -> datetime | None:
        self._record(FieldSpec(name, "timestamp"))
        return None

    def json_value(self, name: str) -> Any:
        self._record(FieldSpec(name, "any"))
        return None

    def goal_priority(self, name: str) -> Any:
        self._record(FieldSpec(name, "goal_priority", choices=tuple(GOAL_PRIORITY_LABELS), low=0, high=100,
                               default="medium"))
        return "medium"

    def require_one_of(self, what: str, values: dict[str, Any]) -> None:
        self.groups.append(tuple(values))


_KIND_FIELDS: dict[str, KindFields] = {}


def kind_fields(kind: str) -> KindFields:
    """The fields a `kind` record may carry: its own, then the common ones, then the passthrough."""
    if kind not in _KIND_FIELDS:
        recorder = _Recorder()
        SCHEMAS[kind](recorder)
        common_columns(recorder, kind)
        for name in PASSTHROUGH:
            recorder.json_value(name)
        _KIND_FIELDS[kind] = KindFields(kind, tuple(recorder.specs.values()), tuple(recorder.groups))
    return _KIND_FIELDS[kind]


def _unknown_field_message(kind: str, name: str, known: list[str]) -> str:
    if name in SERVER_CONTROLLED:
        hint = {"id": " Use `record_id` for your own id.",
                "text": f" Did you mean '{_MAIN_FIELD.get(kind, 'content')}'?"}.get(name, "")
        return "Set by the server; it cannot be written." + hint
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.75)
    if close:
        # Two letters swapped ("contnet") scores no better against `content` than against `context`:
        # a candidate made of the same letters wins.
        best = next((candidate for candidate in close if sorted(candidate) == sorted(name)), close[0])
        return f"Unknown field. Did you mean '{best}'?"
    return f"Unknown field for a {kind}; fields a kind does not model go under `{EXTRA_FIELD}`."


def native_record(kind: str, record: dict[str, Any], *, prefix: str = "") -> dict[str, Any]:
    """The native API's reading of a record: every key must be a field of `kind`, or `extra`.

    Unknown keys (typos above all) and server-controlled ones are a 400 `unknown_field` naming each
    key (prefixed with `prefix`, e.g. "items.3.") and suggesting the closest known field. `extra`,
    an object, holds fields the kind does not model; it is unpacked here into the record so that
    `normalize_memory` keeps them in `extra` exactly as it does for sync. A `kind` that is not a
    memory kind is left to `normalize_memory`, which names it.
    """
    if kind not in SCHEMAS:
        return record
    known = kind_fields(kind).names
    errors: dict[str, list[str]] = {}
    suggestions = sorted(known | {EXTRA_FIELD})
    for name in record:
        if name not in known and name != EXTRA_FIELD:
            errors[prefix + str(name)] = [_unknown_field_message(kind, str(name), suggestions)]
    extra = record.get(EXTRA_FIELD)
    if extra is not None and not isinstance(extra, dict):
        errors[prefix + EXTRA_FIELD] = ["Must be an object."]
    elif extra:
        for name in extra:
            if name in known or name in SERVER_CONTROLLED or name == EXTRA_FIELD:
                errors[f"{prefix}{EXTRA_FIELD}.{name}"] = [
                    f"A field of a {kind}; send it at the top level." if name in known
                    else "A reserved name; it cannot be kept in extra."]
    if errors:
        raise InvalidInput("The memory has fields its kind does not know.", code=UNKNOWN_FIELD, fields=errors)
    if EXTRA_FIELD not in record:
        return record
    flat = {name: value for name, value in record.items() if name != EXTRA_FIELD}
    flat.update(extra or {})
    return flat
