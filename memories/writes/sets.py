"""The write kernel's set-based form: a whole batch of records written in a few statements.

The sync engine decides, record by record in memory, what a push does (`memories.sync.engine`);
then `write_set` stores the outcome set-based — one COPY for the new rows, one bulk UPDATE for the
changed ones, one INSERT of their revisions — and `finish_set` moves the counters once and
registers the after-commit effects. The rules are the single-row form's (package docstring); only
the statements differ, because a push of 500 records must cost a handful of round trips, not 500.

New rows are `NewRow`s, not model instances: Django's model constructor (defaults, descriptors)
costs more than everything else done per record, and a new row never needs to be a model.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection

from accounts.authors import Author
from memories.models import Memory, MemoryKind, MemoryRevision, NextChangeSeq
from memories.privacy.originals import keep_originals
from memories.records.normalize import NormalizedMemory
from memories.writes.columns import COPY_COLUMNS, COPY_TYPES, SET_UPDATE_COLUMNS, new_row_values
from memories.writes.hooks import after_commit
from memories.writes.rows import counters_statement

logger = logging.getLogger(__name__)


class NewRow:
    """A memory that does not exist yet, as plain attributes named like Memory's (attnames)."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__ = values  # the caller's fresh dict becomes the row: no copy

    @property
    def pk(self) -> Any:
        return self.__dict__["id"]


# Memory's defaults, and the names of the mutable ones: made on first use and published as one
# tuple, so a request thread that comes between never copies the defaults without knowing which
# of them it must not share.
_DEFAULTS: tuple[dict[str, Any], tuple[str, ...]] | None = None


def _memory_defaults() -> tuple[dict[str, Any], tuple[str, ...]]:
    fresh = Memory()
    # __dict__, not getattr: the generated search_vector is deferred and would hit the database.
    defaults = {f.attname: fresh.__dict__.get(f.attname) for f in Memory._meta.concrete_fields
                if f.attname != "search_vector"}
    return defaults, tuple(name for name, v in defaults.items() if isinstance(v, (list, dict)))


def blank_row(*, stack_id: int, kind: str, record_id: str, now: datetime) -> NewRow:
    """A new memory with every model default (mutable ones fresh), a new id and its keys."""
    global _DEFAULTS
    if _DEFAULTS is None:
        _DEFAULTS = _memory_defaults()
    defaults, mutable = _DEFAULTS
    values = defaults.copy()
    for name in mutable:
        values[name] = type(values[name])()  # every mutable default of Memory is empty
    # The id as text: what COPY sends and the embedding job takes.
    values.update(id=str(uuid.uuid4()), stack_id=stack_id, kind=kind, record_id=record_id, server_updated_at=now)
    return NewRow(values)


@dataclass(eq=False)
class RecordWrite:
    """One record of a set write: its row (stored `Memory` or `NewRow`) and what happened to it."""

    row: Any  # Memory | NewRow
    is_new: bool
    original_size: int  # bytes it counted in Stack.bytes_used before (0: new or deleted)
    original_live: bool  # counted in Stack.memory_count before
    snapshot: dict[str, Any] | None  # before-image for the revision (stored rows)
    snapshot_version: int
    changed: bool = False  # content or lifecycle changed: a new version and a revision
    touched: bool = False  # only change_seq / server_updated_at move (a stale write's echo)
    text_changed: bool = False
    action: str = "update"  # the revision's action: update | forget | recover | delete
    # The normalised record the row was last filled from: COPY reuses a new row's pre-rendered JSON
    # while the row still holds that very `data` / `extra` (checked by identity), and `finish_set`
    # takes a raw row's original text from it (memories.privacy.originals) while the row holds its text.
    normalized: NormalizedMemory | None = None


def write_set(records: Sequence[RecordWrite], *, source: str, now: datetime, author: Author) -> None:
    """Stamp and store `records` (each changed or touched). The caller holds the stack lock.
    `author` (`hooks.prepare_author`'s result) is the new rows' `written_by` and the revisions'
    `author` (docs/privacy.md "Provenance").

    Stamps: `version` + 1 for a changed stored row, `embedded_version = NULL` when text changed,
    `server_updated_at = now`, a fresh `change_seq` for stored rows (new rows draw theirs as the
    column default). Writes: COPY of the new rows, one bulk UPDATE of the others, one INSERT of the
    revisions of the changed ones. A database error is raised as is (nothing is caught here).
    """
    new_rows: list[RecordWrite] = []
    stored: list[RecordWrite] = []
    written_by = author.as_json()
    for record in records:
        row = record.row
        if record.is_new:
            row.written_by = written_by
            new_rows.append(record)
        else:
            if record.changed:
                row.version = record.snapshot_version + 1
            row.change_seq = NextChangeSeq()
            stored.append(record)
        if record.text_changed:
            row.embedded_version = None  # awaiting (re-)embedding
        row.server_updated_at = now
    if new_rows:
        _insert_new(new_rows)
    if stored:
        Memory.objects.bulk_update([r.row for r in stored], SET_UPDATE_COLUMNS)
        revisions = [
            MemoryRevision(memory_id=r.row.pk, version=r.snapshot_version, source=source, action=r.action,
                           snapshot=r.snapshot or {}, author=written_by)
            for r in stored if r.changed
        ]
        if revisions:
            MemoryRevision.objects.bulk_create(revisions)


def finish_set(*, stack_id: int, records: Sequence[RecordWrite], source: str, sync_at: datetime | None = None) -> None:
    """After `write_set` (once per batch, however many `write_set` calls it took): move the counters
    by one UPDATE (and record `sync_at` as the stack's last sync), sent with the change event's
    INSERT in one round trip (`hooks.after_commit(along=…)`), then register the after-commit
    effects — embedding of live rows whose text changed, one `MemoryChange` per action (a new row
    that is not deleted is a "create"). Only-touched records are no change for the listeners."""
    count_delta = 0
    bytes_delta = 0
    written = 0  # created or changed in content: what the activity rollup counts (counters_statement)
    embed: list[Any] = []
    by_action: dict[str, list[Any]] = {}
    originals: dict[Any, str] = {}
    stale: list[Any] = []
    for record in records:
        row = record.row
        live = row.deleted_at is None
        if row.kind == MemoryKind.RAW and (record.text_changed or not live):
            _original_of(record, live, originals, stale)
        count_delta += int(live) - int(record.original_live)
        bytes_delta += (row.size_bytes if live else 0) - record.original_size
        if record.text_changed and live:
            embed.append(row.pk)
        if record.changed:
            action = "create" if record.is_new and live else record.action
            by_action.setdefault(action, []).append(row.pk)
            written += action in ("create", "update")
    if originals or stale:
        keep_originals(stack_id=stack_id, originals=originals, stale=stale)  # one upsert, one delete at most
    counters = counters_statement(stack_id=stack_id, count_delta=count_delta, bytes_delta=bytes_delta,
                                  sync_at=sync_at, written=written)
    after_commit(stack_id=stack_id, source=source, changes=by_action.items(), embed_ids=embed, along=(counters,))


def _original_of(record: RecordWrite, live: bool, originals: dict[Any, str], stale: list[Any]) -> None:
    """A raw row whose text changed or that is deleted: a stored one's kept original is stale; a
    live one's text as submitted is kept when redaction changed it — taken from the record it was
    filled from, only while the row still holds that record's text."""
    row = record.row
    if not record.is_new and (record.text_changed or record.action == "delete"):
        stale.append(row.pk)
    filled_from = record.normalized
    if (live and record.text_changed and filled_from is not None and filled_from.original_text is not None
            and filled_from.text == row.text):
        originals[row.pk] = filled_from.original_text


# --- COPY of new rows ----------------------------------------------------------------------------
# Django's bulk_create spends several times what Postgres needs to store a row on building one
# giant parameterised INSERT (docs/benchmarks.md "Figures behind code choices"). Columns and their
# types come from the model (`columns`).

_COPY_OK = None not in COPY_TYPES  # a column psycopg cannot dump: the ORM writes new rows instead
_COPY_SQL = f"COPY {Memory._meta.db_table} ({', '.join(COPY_COLUMNS)}) FROM STDIN"


def _insert_new(records: list[RecordWrite]) -> None:
    if not _COPY_OK:
        logger.warning("memories_memory has a column the COPY cannot type; using bulk_create")
        Memory.objects.bulk_create([Memory(**vars(r.row)) for r in records])
        return
    with connection.cursor() as django_cursor:
        raw_cursor = django_cursor.cursor  # the psycopg cursor, inside Django's transaction
        with raw_cursor.copy(_COPY_SQL) as copy:
            copy.set_types(list(COPY_TYPES))
            for record in records:
                copy.write_row(new_row_values(record.row.__dict__, record.normalized))
