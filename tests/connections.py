"""A database alias's connection settings changed for one test (another port, another host, a
startup option), its connections and pool opened anew with them and again with the old ones after."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections


def _reopen(alias: str) -> None:
    connection = connections[alias]
    connection.close()
    if getattr(connection, "pool", None) is not None:
        connection.close_pool()  # type: ignore[attr-defined]  # PostgreSQL's wrapper has it


@contextmanager
def connection_settings(alias: str = DEFAULT_DB_ALIAS, **changes: Any) -> Iterator[None]:
    """Within the block, `alias` connects with its settings updated by `changes` (top-level keys)."""
    settings_dict = connections[alias].settings_dict
    saved = {key: settings_dict[key] for key in changes}
    _reopen(alias)
    settings_dict.update(changes)
    try:
        yield
    finally:
        _reopen(alias)
        settings_dict.update(saved)
