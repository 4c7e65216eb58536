"""The Memory column sets writers use, derived from `Memory._meta.concrete_fields`, and how a new
row's values are rendered for the database (`new_row_values`, docs/architecture.md §5).

Each set is "every column of the model, minus named groups", so a new column lands in the sets it
belongs to without anyone listing it by hand; the groups below say why a column is left out.
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Sequence
from typing import Any

import psycopg
from django.contrib.postgres.fields import ArrayField
from django.db import connection
from django.db.models import JSONField

from memories.models import Memory

# Every column, by attribute name (== column name for Memory), in model order.
ALL_COLUMNS: tuple[str, ...] = tuple(f.attname for f in Memory._meta.concrete_fields)

# Filled by the database or by one dedicated writer, never by a memory write's values:
# `change_seq` is drawn with nextval (its db_default, or NextChangeSeq() on a change), `search_vector`
# is a generated column, `embedding` is written by the embedding job only.
DATABASE_FILLED = frozenset({"change_seq", "search_vector", "embedding"})
# What a memory is and where it lives: set once when the row is created.
IDENTITY = frozenset({"id", "stack_id", "kind", "record_id"})
# Server-owned decay state, moved by reviews and the decay pass (which keep their own records of
# it), not by writes; not part of a revision's snapshot.
DECAY_STATE = frozenset({"stability", "difficulty", "last_reviewed_at"})
# Which embedding the row carries; reset by the kernel (embedded_version = NULL) when text changes.
EMBEDDING_STATE = frozenset({"embedding", "embedding_model", "embedded_version"})
# Forgetting and deletion: changed only by the lifecycle actions (forget, recover, delete).
LIFECYCLE = frozenset({"forgotten_at", "forgotten_reason", "deleted_at"})
# Stamped by the kernel on every change.
STAMPS = frozenset({"version", "server_updated_at", "change_seq"})
# Who wrote the record first (docs/privacy.md "Provenance"): set once, when the row is created, from
# the write's author; never compared, changed, snapshotted or sent to a client as payload (each
# later change's author is on its revision).
PROVENANCE = frozenset({"written_by"})
# The kernle client's own bookkeeping, echoed back unchanged, and the creation time (fixed once stored).
CLIENT_ECHO = frozenset({"client_version", "client_updated_at", "created_at"})


def _without(*groups: frozenset[str]) -> tuple[str, ...]:
    excluded = frozenset().union(*groups)
    return tuple(name for name in ALL_COLUMNS if name not in excluded)


# A memory's state as kept in a revision (the before-image of a change).
SNAPSHOT_COLUMNS = _without(frozenset({"id", "stack_id", "search_vector", "change_seq"}), DECAY_STATE,
                            EMBEDDING_STATE, PROVENANCE)
# What a client payload sets (`NormalizedMemory.as_model_fields()` minus the client echo): the
# columns an update compares and writes.
CONTENT_COLUMNS = _without(IDENTITY, DECAY_STATE, EMBEDDING_STATE, LIFECYCLE, STAMPS, CLIENT_ECHO,
                           DATABASE_FILLED, PROVENANCE)
# The modelled columns of a client payload as pull renders them: content minus the canonical text
# (derived from data), data / extra (rendered separately) and size_bytes and redaction_report
# (server-computed).
PAYLOAD_COLUMNS = tuple(c for c in CONTENT_COLUMNS
                        if c not in {"text", "data", "extra", "size_bytes", "redaction_report"})
# Everything a sync operation may change on a record (and must be able to undo when a later check
# rejects that operation within its batch).
SYNC_MUTABLE_COLUMNS = _without(IDENTITY, DECAY_STATE, EMBEDDING_STATE, STAMPS, DATABASE_FILLED, PROVENANCE)
# What the set-based form writes for a changed row: the above plus the kernel's stamps.
SET_UPDATE_COLUMNS = (*SYNC_MUTABLE_COLUMNS, "version", "server_updated_at", "change_seq", "embedded_version")

# New rows go in with COPY: every column the database does not fill.
COPY_COLUMNS = _without(DATABASE_FILLED)
# Columns the writer renders as text before COPY (the server parses it): JSON and arrays (psycopg's
# own list dumper inspects every list to guess its element type) and the new rows' ids (str).
_FIELDS = {f.attname: f for f in Memory._meta.concrete_fields}
JSON_COLUMNS = frozenset(c for c in COPY_COLUMNS if isinstance(_FIELDS[c], JSONField))
ARRAY_COLUMNS = frozenset(c for c in COPY_COLUMNS if isinstance(_FIELDS[c], ArrayField))
_RENDERED_AS_TEXT = JSON_COLUMNS | ARRAY_COLUMNS | {Memory._meta.pk.attname}


def _copy_type(column: str) -> str | None:
    """The Postgres type psycopg dumps this column's Python values as: the field's own db_type
    ("varchar(16)" → "varchar", "double precision" → "float8"); None if psycopg does not know it."""
    if column in _RENDERED_AS_TEXT:
        return "text"
    db_type = _FIELDS[column].db_type(connection)
    if db_type is None:
        return None
    info = psycopg.adapters.types.get(re.sub(r"\(.*\)", "", db_type).strip())
    return info.name if info is not None else None


# None in the tuple (a column type psycopg cannot dump) makes the COPY fall back to the ORM.
COPY_TYPES: tuple[str | None, ...] = tuple(_copy_type(c) for c in COPY_COLUMNS)


def array_literal(items: Sequence[str]) -> str:
    """A Postgres text[] literal, every element quoted, so commas, braces and NULL stay text. Sent as
    one text parameter: psycopg's list adapter inspects every element first to guess its type, a
    cost on a write's path (a push's 500 ids)."""
    quoted = ('"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"' for item in items)
    return "{" + ",".join(quoted) + "}"


_copy_values = operator.itemgetter(*COPY_COLUMNS)
_JSON_POSITIONS = [i for i, c in enumerate(COPY_COLUMNS) if c in JSON_COLUMNS]
_ARRAY_POSITIONS = [i for i, c in enumerate(COPY_COLUMNS) if c in ARRAY_COLUMNS]


def new_row_values(attributes: dict[str, Any], filled_from: Any = None) -> list[Any]:
    """A new memory's values for COPY_COLUMNS, in that order, from its attributes (a `Memory`'s or a
    `NewRow`'s `__dict__`: attribute names are the columns), JSON and arrays rendered as text for
    the server to parse. `filled_from` (a `NormalizedMemory`): its JSON, rendered while validating,
    is reused while the row still holds that very `data` / `extra` (checked by identity)."""
    values = list(_copy_values(attributes))
    for i in _JSON_POSITIONS:
        value = values[i]
        if filled_from is not None and value is filled_from.data and filled_from.data_json is not None:
            values[i] = filled_from.data_json
        elif filled_from is not None and value is filled_from.extra and filled_from.extra_json is not None:
            values[i] = filled_from.extra_json
        else:
            values[i] = json.dumps(value, ensure_ascii=False)
    for i in _ARRAY_POSITIONS:
        values[i] = array_literal(values[i])
    return values
