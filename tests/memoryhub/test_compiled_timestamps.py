"""Timestamps read through psycopg's compiled loader (memoryhub.database, docs/operations.md §12)
are the values Django's own loader returns: the same instants, in UTC."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db import connection
from django.db.backends.postgresql.psycopg_any import register_tzloader
from psycopg.pq import Format

from memoryhub.database import UtcTimestamptzLoader

pytestmark = pytest.mark.django_db

SQL = ("SELECT '2026-03-29 01:30:00.123456+02'::timestamptz, '1999-12-31 23:59:59-11:30'::timestamptz, "
       "NULL::timestamptz, now()")


def _read(*, djangos_loader: bool) -> tuple[Any, ...]:
    with connection.cursor() as cursor:
        if djangos_loader:
            register_tzloader(dt.UTC, cursor.cursor)  # what Django registers without ours
        cursor.execute(SQL)
        row = cursor.fetchone()
        assert row is not None
        return tuple(row)


def test_timestamps_are_read_with_the_compiled_loader_as_the_values_djangos_would_give() -> None:
    connection.ensure_connection()
    assert connection.connection.adapters.get_loader(1184, Format.TEXT) is UtcTimestamptzLoader
    compiled = _read(djangos_loader=False)
    assert compiled[0] == dt.datetime(2026, 3, 28, 23, 30, 0, 123456, tzinfo=dt.UTC)
    assert compiled[1] == dt.datetime(2000, 1, 1, 11, 29, 59, tzinfo=dt.UTC)
    assert compiled[2] is None
    assert all(value.tzinfo is dt.UTC for value in compiled if value is not None)

    djangos = _read(djangos_loader=True)  # now() is the transaction's start: the same in both
    assert djangos == compiled
    assert [value.tzinfo for value in djangos if value] == [value.tzinfo for value in compiled if value]
