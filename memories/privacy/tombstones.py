"""Erased records stay erased: the tombstone of each memory an erasure removed, and the check the
sync engine makes against them (docs/architecture.md §9).

A tombstone is an id only, SHA-256 of "<kind>:<record_id>" (`record_key_hash`), written by the
erasure itself in SQL (memories.governance.erasure) with the same expression. `erased_keys` tells the
sync engine which pushed keys were erased, so a device holding an old copy cannot push the memories
back into existence. It lives here, under sync and governance alike, because both need it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import TYPE_CHECKING

from django.db import connection

if TYPE_CHECKING:
    from stacks.models import Stack


def record_key_hash(kind: str, record_id: str) -> str:
    """The tombstone of (kind, record_id): the same expression as the erasure's batch SQL."""
    return hashlib.sha256(f"{kind}:{record_id}".encode()).hexdigest()


def erased_keys(stack: Stack, keys: Iterable[tuple[str, str]]) -> set[tuple[str, str]]:
    """Which of these (kind, record_id) keys were erased from `stack` (one indexed query)."""
    by_hash = {record_key_hash(kind, record_id): (kind, record_id) for kind, record_id in keys}
    if not by_hash:
        return set()
    # `= ANY(array)`: one parameter instead of a batch's 500 (`__in`), and faster per batch.
    with connection.cursor() as cursor:
        cursor.execute("SELECT key_hash FROM memories_erasedrecord WHERE stack_id = %s AND key_hash = ANY(%s)",
                       [stack.pk, list(by_hash)])
        return {by_hash[key_hash] for (key_hash,) in cursor.fetchall()}

