"""`manage.py`: Django's command line, beside `make run`, failing in one line.

A command run in a second shell finds the running service's embedded PostgreSQL and Redis through
the runtime file the runner writes (DATA_DIR/runtime.json; memoryhub/settings.py reads it), so no
port has to be exported. When the database or Redis cannot be reached the command says, in one
line, what it tried and what to do, and exits 1; `--traceback` shows the traceback instead. Any
other error keeps its traceback: that is a bug to report, not a service to start.
"""

from __future__ import annotations

import os
import sys
from urllib.parse import urlsplit

import kombu.exceptions
import psycopg
import psycopg_pool
import redis.exceptions
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management import execute_from_command_line
from django.db import OperationalError as DjangoOperationalError

_REDIS_DOWN = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, kombu.exceptions.OperationalError)
_DATABASE_DOWN = (DjangoOperationalError, psycopg.OperationalError)


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def _database_down(exc: BaseException) -> bool:
    """A failure to connect, as opposed to an error of a statement (a deadlock is an
    OperationalError too, and deserves its traceback)."""
    for error in _chain(exc):
        if isinstance(error, psycopg_pool.PoolTimeout):
            return True
        if isinstance(error, _DATABASE_DOWN) and "connection" in str(error).lower():
            return True
    return False


def _source(variable: str, runtime_key: str, port_variable: str) -> str:
    """Where the address came from, in the words the user can act on."""
    if os.environ.get(variable):
        return f"from {variable}"
    if settings.RUNNING_SERVICE.get(runtime_key):
        return (f"the running `make run`'s server (pid {settings.RUNNING_SERVICE['pid']}, "
                f"{settings.DATA_DIR / 'runtime.json'}); it may be restarting")
    port = f"{port_variable}={os.environ[port_variable]}" if os.environ.get(port_variable) else "its default port"
    return f"the embedded server at {port}; no `make run` is running with data in {settings.DATA_DIR}"


def unreachable_message(exc: BaseException) -> str | None:
    """The one line for a command that could not reach the database or Redis, else None."""
    if any(isinstance(error, _REDIS_DOWN) for error in _chain(exc)):
        url = urlsplit(settings.REDIS_URL)  # host and port only: a URL may carry a password
        return (f"cannot reach Redis at {url.hostname}:{url.port or 6379} "
                f"({_source('REDIS_URL', 'redis_url', 'MEMORYHUB_REDIS_PORT')}): "
                "start the service with `make run` or set REDIS_URL")
    if _database_down(exc):
        database = settings.DATABASES["default"]
        return (f"cannot reach PostgreSQL at {database['HOST']}:{database['PORT']} "
                f"({_source('DATABASE_URL', 'database_url', 'MEMORYHUB_PG_PORT')}): "
                "start the service with `make run` or set DATABASE_URL")
    return None


def main(argv: list[str]) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "memoryhub.settings")
    # One command, one connection. A pool buys a command nothing, and while the server is down
    # its background reconnect loop logs a warning per attempt and turns "connection refused"
    # into a 5-second PoolTimeout. DB_POOL_MAX_SIZE set by the user still wins.
    os.environ.setdefault("DB_POOL_MAX_SIZE", "0")
    try:
        execute_from_command_line(argv)
    except ImproperlyConfigured as exc:  # a bad environment value: say which, without a traceback
        sys.stderr.write(f"configuration error: {exc}\n")
        return 1
    except (*_REDIS_DOWN, *_DATABASE_DOWN) as exc:
        message = None if "--traceback" in argv else unreachable_message(exc)
        if message is None:
            raise
        sys.stderr.write(f"{' '.join(['manage.py', *argv[1:2]])}: {message}\n")
        return 1
    return 0
