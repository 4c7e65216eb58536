"""The default database's libpq connection string, for the PostgreSQL tools (pg_dump) and plain
psycopg clients that run beside Django (memoryhub/backup.py)."""

from __future__ import annotations

from django.db import connections
from psycopg.conninfo import make_conninfo

_LIBPQ_KEYS = ("dbname", "user", "password", "host", "port", "sslmode", "sslrootcert", "sslcert", "sslkey")


def database_conninfo(alias: str = "default") -> str:
    params = connections[alias].get_connection_params()
    return make_conninfo(**{key: str(value) for key, value in params.items() if key in _LIBPQ_KEYS and value})
