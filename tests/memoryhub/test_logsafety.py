"""What a logged database error keeps (memoryhub.logsafety, docs/privacy.md "Logs"): psycopg's own
message about a statement's shape, which names parameters and types and never a value, so a bug of
that kind can be found from the log; every other message stays withheld."""

from __future__ import annotations

import logging
import sys
from typing import Any

import psycopg
import pytest
from django.db import DatabaseError, connection

from memoryhub.logsafety import SafeFormatter

SECRET = "violet-canary-7781"


def _logged(exc_info: Any) -> str:
    record = logging.LogRecord("memoryhub.errors", logging.ERROR, __file__, 1, "database error", (), exc_info)
    return SafeFormatter("%(levelname)s %(name)s: %(message)s").format(record)


@pytest.mark.django_db
def test_a_statement_missing_a_parameter_is_logged_by_name_and_no_value() -> None:
    with pytest.raises(DatabaseError), connection.cursor() as cursor:
        try:
            cursor.execute("SELECT %(given)s::text, %(absent)s::text", {"given": SECRET})
        except DatabaseError:
            line = _logged(sys.exc_info())
            raise
    assert "query parameter missing: absent" in line
    assert SECRET not in line


@pytest.mark.django_db
def test_an_error_from_the_server_stays_withheld() -> None:
    with pytest.raises(DatabaseError), connection.cursor() as cursor:
        try:
            cursor.execute("SELECT %s::int", [SECRET])
        except DatabaseError:
            line = _logged(sys.exc_info())
            raise
    assert "message withheld" in line and "SQLSTATE 22P02" in line
    assert SECRET not in line


def test_psycopgs_other_messages_stay_withheld() -> None:
    try:
        raise psycopg.ProgrammingError(f'missing "=" after "{SECRET}" in connection info string')
    except psycopg.ProgrammingError:
        line = _logged(sys.exc_info())
    assert "message withheld" in line
    assert SECRET not in line
