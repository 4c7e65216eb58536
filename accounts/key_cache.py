"""A brief, per-process memory of verified API keys, so a busy agent is not looked up on every request.

WHY: finding a key by its secret is a four-table query (key, user, organization, stack, plus the
issuer-reach EXISTS) that Django compiles and PostgreSQL plans anew on every request, a large share
of the web process's CPU under bench/soak.py's mix (docs/configuration.md, `AUTH_KEY_CACHE_SECONDS`).
A key that verified a moment ago is remembered here for `settings.AUTH_KEY_CACHE_SECONDS`, and so
is the key an access token names (kernle's client sends its token, not its key, on every sync).

Why this stays safe (access dies with its grant, accounts/selectors.py):
* Keyed by the secret's keyed hash (the digest the lookup computes anyway), never the secret; a
  token's key by the key's public id, once the token's signature and expiry have verified.
* Only a full success is remembered: a live, unexpired key whose issuer still reaches what it is
  bound to, found under the current pepper. Failures are never cached (their cost is the
  failure limits' business, accounts/throttles.py).
* A *generation* in Redis invalidates every process at once: any save or delete of a key, person,
  school, membership or teacher assignment (post_save / post_delete, in whichever process — web,
  worker, shell) clears this process's entries and, once its transaction commits, bumps the
  generation. Each request reads the generation in the same Redis round trip that already checks
  the client's failure back-off, and an entry filled under another generation is dropped. So a
  revocation, a lowered role or a removed member takes effect on the next request everywhere.
* Writes that bypass model signals (QuerySet.update, raw SQL) are bounded by the entry's
  lifetime, and an entry never outlives its key's `expires_at`.
* Each request gets its own copy of the model instances (unpickled from the entry), so nothing a
  request does to its `request.user` / `principal.organization` reaches another request.
"""

from __future__ import annotations

import logging
import pickle
import threading
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.db.models.signals import post_delete, post_save
from django.utils import timezone

from accounts.selectors import KeyMatch
from accounts.throttles import redis_client

logger = logging.getLogger(__name__)

GENERATION_KEY = "auth:generation"
# Which models' changes can change what a key grants: the key itself, the person it acts as, the
# school, the person's membership (role) and teacher assignments (stacks.TeacherAssignment: named
# by label, accounts sits below stacks).
WATCHED = frozenset({"accounts.ApiKey", "accounts.User", "accounts.Organization", "accounts.Membership",
                     "stacks.TeacherAssignment"})
MAX_ENTRIES = 10_000  # agents per process at once; past it the table starts again (no unbounded growth)


@dataclass
class _Entry:
    payload: bytes  # the pickled KeyMatch
    generation: bytes | None
    fresh_until: float  # time.monotonic()
    last_used_at: Any  # the key's last_used_at as this process last wrote or read it


_entries: dict[str, _Entry] = {}
_lock = threading.Lock()


def generation_key() -> str:
    return cache.make_and_validate_key(GENERATION_KEY)


def token_entry(key_id: str) -> str:
    """Where the key an access token names is remembered: by its public id, apart from the secrets'
    digests (64 hex characters)."""
    return f"token:{key_id}"


def lookup(digest: str, generation: bytes | None) -> KeyMatch | None:
    """The remembered match for `digest` (or a `token_entry`) under the current `generation`, as a
    fresh copy; else None."""
    entry = _entries.get(digest)
    if entry is None:
        return None
    if entry.generation != generation or time.monotonic() >= entry.fresh_until:
        with _lock:
            if _entries.get(digest) is entry:
                del _entries[digest]
        return None
    match: KeyMatch = pickle.loads(entry.payload)  # noqa: S301 - bytes this process pickled itself
    key = match.key
    if key.expires_at is not None and key.expires_at <= timezone.now():
        return None
    key.last_used_at = entry.last_used_at
    return match


def remember(digest: str, generation: bytes | None, match: KeyMatch) -> None:
    seconds = float(getattr(settings, "AUTH_KEY_CACHE_SECONDS", 0))
    if seconds <= 0 or not match.issuer_reaches or match.stale_hash:
        return
    entry = _Entry(pickle.dumps(match, protocol=pickle.HIGHEST_PROTOCOL), generation,
                   time.monotonic() + seconds, match.key.last_used_at)
    with _lock:
        if len(_entries) >= MAX_ENTRIES:
            _entries.clear()
        _entries[digest] = entry


def note_used(digest: str, when: Any) -> None:
    """The key's last_used_at was just written: later hits compare against it (once a minute)."""
    entry = _entries.get(digest)
    if entry is not None:
        entry.last_used_at = when


def forget_all() -> None:
    with _lock:
        _entries.clear()


def forget_everywhere() -> None:
    """End what every process remembers: this one's entries now, the others' on their next request
    (the generation). For a change that skips model signals (docs/operations.md §5 "Key cache")."""
    forget_all()
    try:
        redis_client(write=True).incr(generation_key())
    except Exception:  # Redis down: other processes' entries end at their lifetime (seconds)
        logger.warning("could not bump the API-key cache generation; other processes' entries expire "
                       "within AUTH_KEY_CACHE_SECONDS")


def _changed(sender: Any, using: str | None = None, **_: Any) -> None:
    meta = getattr(sender, "_meta", None)
    if meta is None or meta.label not in WATCHED:
        return
    forget_all()
    # After commit: bumping earlier would let another process re-read (and remember) the old rows
    # before they change. Outside a transaction on_commit runs at once.
    transaction.on_commit(forget_everywhere, using=using)


def connect() -> None:
    """Called from AccountsConfig.ready: every process that can change access invalidates."""
    post_save.connect(_changed, dispatch_uid="accounts.key_cache.save")
    post_delete.connect(_changed, dispatch_uid="accounts.key_cache.delete")
