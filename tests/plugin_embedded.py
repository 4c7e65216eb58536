"""Pytest plugin: the test session starts and stops its own real PostgreSQL+pgvector and Redis.

Loaded with `-p tests.plugin_embedded` (see pyproject.toml) so that it runs before pytest-django
reads the settings: the servers must be up and DATABASE_URL / REDIS_URL set first. Each session
gets free ports and a throw-away data directory, so parallel sessions never collide. When
DATABASE_URL / REDIS_URL are already set, those external servers are used instead.

Under pytest-xdist (`make test` runs `-n`), every worker is such a session: its own PostgreSQL,
Redis, data directory and Celery worker, so no test sees another worker's rows, queues, throttle
counters or files. The controller runs no test and starts nothing (docs/testing.md §1).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from memoryhub.embedded import EmbeddedPostgres, EmbeddedRedis, free_port

_started: list[EmbeddedPostgres | EmbeddedRedis] = []
_tmpdir: Path | None = None


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]) -> None:
    global _tmpdir
    # The suite embeds with the fast deterministic `hash` model whatever the shell says (the
    # settings default to MiniLM); tests of the real model opt in with `settings.EMBEDDING_PROVIDER`.
    os.environ["EMBEDDING_PROVIDER"] = "hash"
    # The test suite, and the processes it starts, run with the development secrets committed in
    # the repository; nothing else accepts them (memoryhub/secrets.py).
    os.environ["MEMORYHUB_TEST_SUITE"] = "1"
    # A search's production deadline (2.5 s) would make every search test a timing test on a
    # machine shared by the suite's workers: a correctness test failed on it once under load.
    # Speed is measured in bench/; the deadline itself is tested with the production values.
    os.environ.setdefault("SEARCH_STATEMENT_TIMEOUT_MS", "60000")
    os.environ.setdefault("SCHOOL_SEARCH_STATEMENT_TIMEOUT_MS", "60000")
    if os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL"):
        return
    if _is_xdist_controller(early_config):
        return
    _tmpdir = Path(tempfile.mkdtemp(prefix="memoryhub-test-"))
    # The session's data dir, not ./var: settings must not read a running `make run`'s runtime file
    # or its collected static files (the session serves static files from source).
    os.environ.setdefault("MEMORYHUB_DATA_DIR", str(_tmpdir / "var"))
    try:
        if not os.environ.get("DATABASE_URL"):
            # Throw-away: nothing the session writes must survive a crash, so no fsync (durable=False).
            postgres = EmbeddedPostgres(_tmpdir / "postgres", free_port(), log_path=_tmpdir / "postgres.log",
                                        durable=False)
            postgres.prepare()
            postgres.start()
            _started.append(postgres)
            postgres.ensure_database("memoryhub")
            os.environ["DATABASE_URL"] = postgres.url("memoryhub")
        if not os.environ.get("REDIS_URL"):
            redis_server = EmbeddedRedis(_tmpdir / "redis", free_port(), log_path=_tmpdir / "redis.log")
            redis_server.prepare()
            redis_server.start()
            _started.append(redis_server)
            os.environ["REDIS_URL"] = redis_server.url()
    except Exception:
        _stop_all()
        raise


def _is_xdist_controller(early_config: pytest.Config) -> bool:
    """True in the process that hands tests to xdist workers (`-n N`, N > 0), not in a worker."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return False
    workers = getattr(early_config.known_args_namespace, "numprocesses", None)
    return bool(workers) and workers != "0"


def _stop_all() -> None:
    for server in reversed(_started):
        server.stop()
    _started.clear()
    if _tmpdir is not None:
        shutil.rmtree(_tmpdir, ignore_errors=True)


def pytest_unconfigure(config: pytest.Config) -> None:
    _stop_all()
