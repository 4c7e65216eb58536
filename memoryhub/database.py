"""The default database's libpq connection string, for the PostgreSQL tools (pg_dump) and plain
psycopg clients that run beside Django (memoryhub/backup.py); the compiled `timestamptz` loader
every connection reads with (`use_compiled_timestamps`); id lists sent as one literal
(`uuid_array`); multi-statement query strings (`async_commit_sql`, `skip_to_rows`); and a model's
rows read through a written-out statement (`ModelRows`)."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Sequence
from typing import Any

import orjson
from django.conf import settings
from django.db import connection, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import DEFERRED, JSONField, Model
from psycopg.abc import AdaptContext, Buffer
from psycopg.adapt import Loader
from psycopg.conninfo import make_conninfo

_compiled: Any
try:
    from psycopg_binary import _psycopg as _compiled
except ImportError:  # psycopg's pure-Python build: Django's loader stays
    _compiled = None

_LIBPQ_KEYS = ("dbname", "user", "password", "host", "port", "sslmode", "sslrootcert", "sslcert", "sslkey")


def async_commit_sql() -> str:
    """`SET LOCAL synchronous_commit = off; ` for the head of a query string that is its own
    (implicit) transaction and writes only bookkeeping a crash may lose without harm (a load's
    access counts, a pull's watermark): its commit does not wait for the WAL flush. "" inside a
    caller's transaction, where it would last until the caller's commit and cover its writes too."""
    return "" if connection.in_atomic_block else "SET LOCAL synchronous_commit = off; "


def skip_to_rows(cursor: Any) -> None:
    """Move `cursor` past the results without rows at the head of a multi-statement query string
    (its SET LOCAL settings, a data-modifying statement) to the first result that has rows."""
    while cursor.description is None and cursor.nextset():
        pass


def uuid_array(ids: Sequence[Any]) -> str:
    """Ids as a uuid[] literal for `%s::uuid[]`: the driver adapts a Python list of UUIDs by
    inspecting it element by element (costly on a search's and a load's path, docs/algorithms.md
    §7.5), a string it sends as is."""
    return "{" + ",".join(str(memory_id) for memory_id in ids) + "}"


class ModelRows:
    """A model's rows read through a written-out statement on the default database: `fields`, its
    concrete fields but those named in `defer`; `columns`, their columns in that order (quoted, each
    prefixed with `table_alias` when one is given), to SELECT; `table`, the model's table (quoted,
    followed by `table_alias` when one is given), to select them FROM; `instance(row)`, the model
    instance of one such row, each value converted as the ORM converts it when it reads the field
    (Django loads jsonb as text: a JSONField decodes it). The deferred fields are neither selected
    nor set: the instance loads them on first use, as after a queryset's `defer()`. For the hot
    lookups whose querysets cost more to compile than to run (docs/architecture.md §7.2)."""

    def __init__(self, model: type[Model], *, defer: Sequence[str] = (), table_alias: str = "") -> None:
        self.fields = tuple(field for field in model._meta.concrete_fields if field.name not in defer)
        prefix = f"{connection.ops.quote_name(table_alias)}." if table_alias else ""
        self.model = model
        self.table = connection.ops.quote_name(model._meta.db_table) + (
            f" {connection.ops.quote_name(table_alias)}" if table_alias else "")
        self.columns = ", ".join(prefix + connection.ops.quote_name(field.column) for field in self.fields)
        self._converters = [(index, _converter(field)) for index, field in enumerate(self.fields)
                            if hasattr(field, "from_db_value")]
        # For each of the model's concrete fields, where its value is in a row (None: deferred).
        selected = {field.attname: index for index, field in enumerate(self.fields)}
        self._positions = tuple(selected.get(field.attname) for field in model._meta.concrete_fields)
        self._complete = len(self.fields) == len(model._meta.concrete_fields)

    def instance(self, row: Sequence[Any]) -> Any:
        values = list(row)
        for index, convert in self._converters:
            values[index] = convert(values[index], None, connection)
        # What Model.from_db does, with the deferred fields' places worked out once, not per row (it
        # searches the list of selected names for each field: half the cost of a hit's instance).
        if not self._complete:
            values = [DEFERRED if index is None else values[index] for index in self._positions]
        instance = self.model(*values)
        instance._state.adding = False
        instance._state.db = connection.alias
        return instance


# orjson reads an integer past 64 bits as a float (the standard library keeps it exact), and
# PostgreSQL writes a jsonb number out in full, never with an exponent: a run of 19 digits or more
# is the only place the two parsers can differ.
_LONG_DIGIT_RUN = re.compile(r"\d{19}")


def _converter(field: Any) -> Callable[[Any, Any, Any], Any]:
    """How `instance` converts the field's column value: as the ORM does, but a JSONField without
    a decoder of its own is parsed by orjson, which gives the same values as the standard library's
    parser for the text PostgreSQL returns, in a fraction of the time (docs/architecture.md §7.2).
    A text holding a long number goes to the ORM's own conversion (`_LONG_DIGIT_RUN`)."""
    if not isinstance(field, JSONField) or field.decoder is not None:
        return field.from_db_value
    fallback = field.from_db_value

    def from_db_value(value: Any, expression: Any, connection: Any) -> Any:
        if not isinstance(value, str) or _LONG_DIGIT_RUN.search(value):
            return fallback(value, expression, connection)
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return fallback(value, expression, connection)

    return from_db_value


def database_conninfo(alias: str = "default") -> str:
    params = connections[alias].get_connection_params()
    return make_conninfo(**{key: str(value) for key, value in params.items() if key in _LIBPQ_KEYS and value})


class UtcTimestamptzLoader(Loader):
    """Reads `timestamptz` with psycopg's compiled loader, for connections whose session time zone
    is UTC (Django sets it to TIME_ZONE on every new connection; docs/operations.md §12 "Timestamps").

    Django registers a pure-Python loader that parses each value in Python and then re-attaches the
    time zone; psycopg's compiled loader already returns the instant with `datetime.timezone.utc`,
    the very value Django's would. `timezone` is what Django compares before registering its own
    loader again on a cursor, so with this one in place it does not.
    """

    timezone = dt.UTC

    def __init__(self, oid: int, context: AdaptContext | None = None) -> None:
        super().__init__(oid, context)
        # The compiled loader's bound method itself, so no Python frame runs per value.
        self.load = _compiled.TimestamptzLoader(oid, context).load  # type: ignore[method-assign]

    def load(self, data: Buffer) -> dt.datetime:  # replaced per instance, above
        raise NotImplementedError


def use_compiled_timestamps(sender: object, connection: BaseDatabaseWrapper, **kwargs: object) -> None:
    """`connection_created` receiver: PostgreSQL connections in UTC read `timestamptz` with
    `UtcTimestamptzLoader` (DB_COMPILED_TIMESTAMPS=false leaves Django's loader in place)."""
    if (_compiled is None or connection.vendor != "postgresql" or not settings.USE_TZ
            or not settings.DB_COMPILED_TIMESTAMPS or connection.timezone != dt.UTC):
        return
    connection.connection.adapters.register_loader("timestamptz", UtcTimestamptzLoader)
