"""The service's three secrets: Django's SECRET_KEY, the JWT signing key and the API-key pepper
(and, outside production, a generated encryption-at-rest key: below).

They are separate so that rotating one does not invalidate what the others protect
(docs/operations.md §4): a new JWT signing key ends every access token but no API key; a new
pepper keeps every key working while the previous pepper is listed; a new SECRET_KEY ends
dashboard sessions only.

Where each comes from, first match wins:

1. its environment variable (`SECRET_KEY`, `JWT_SIGNING_KEY`, `API_KEY_PEPPER`), at least 32
   characters. With `MEMORYHUB_PRODUCTION=true` all three must be set this way: several web
   hosts must share them, and a file generated on each host would not be shared;
2. under the test suite (`MEMORYHUB_TEST_SUITE=1`, set by tests/plugin_embedded.py), the
   development values committed below;
3. otherwise `<data dir>/secrets.json`: random values generated on first start, kept with mode
   0600 and reused by every later start and by every process (web, worker, beat, manage.py).

The committed development values are refused everywhere outside the test suite — as an
environment value too — so a token signed with them is worthless against a real service.
`API_KEY_PEPPER_PREVIOUS` (comma-separated) and the file's `previous_api_key_peppers` list
peppers still accepted when looking a key up; a key found under one is re-hashed under the
current pepper on that use (accounts.services.api_key_rehash).

**The kept encryption key.** Outside production and the test suite (what `make run` starts), the
file also holds `encryption_key`: 32 random bytes as 64 hex characters, generated on first start
like the others, which seals snapshots and raw originals while `MEMORYHUB_ENCRYPTION_KEYS` is unset
(memoryhub.encryption, id `local`), so a fresh start does not answer every teleport upload with 503
`encryption_unavailable`. With the variable set, a kept key still opens what it sealed and no new
one is made. It is a development convenience: it sits beside the data it protects (and goes into
backups with secrets.json), so production never generates or reads one: there the keys come from
the variable or sealing is refused, as before. It is never logged or shown (`Secrets` leaves it out
of its repr, errors name the file, never the value), and unlike the three above it is not rotated
by replacing it: what it sealed would no longer open (docs/privacy.md "Rotation").
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from memoryhub.encryption import KEY_BYTES
from memoryhub.encryption import VARIABLE as ENCRYPTION_KEYS_VARIABLE

# Only ever accepted by the test suite. The first is the SECRET_KEY every earlier release used by
# default (and signed its tokens and peppered its key hashes with): refusing it is the point.
DEV_SECRETS = {
    "secret_key": "dev-insecure-secret-key-change-me-for-production-0123456789",
    "jwt_signing_key": "dev-insecure-jwt-signing-key-for-the-test-suite-only-0123456789",
    "api_key_pepper": "dev-insecure-api-key-pepper-for-the-test-suite-only-0123456789",
}
# The environment variable of each secret (the JSON file uses the lowercase names).
VARIABLES = {"secret_key": "SECRET_KEY", "jwt_signing_key": "JWT_SIGNING_KEY", "api_key_pepper": "API_KEY_PEPPER"}
PREVIOUS_PEPPERS = "previous_api_key_peppers"
ENCRYPTION_KEY = "encryption_key"  # the kept encryption-at-rest key (module docstring)
_HEX_KEY = re.compile(rf"[0-9a-fA-F]{{{2 * KEY_BYTES}}}")
PEPPER_ROTATED_AT = "api_key_pepper_rotated_at"
FILE_NAME = "secrets.json"
MIN_LENGTH = 32
KEEP_PREVIOUS_PEPPERS = 5  # a longer list only makes each failed lookup hash more often

_TRUE = {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class Secrets:
    secret_key: str
    jwt_signing_key: str
    api_key_pepper: str
    previous_api_key_peppers: tuple[str, ...]
    # The kept encryption key (None in production and the test suite); never in a repr.
    encryption_key: bytes | None = field(default=None, repr=False)


def _value(environ: Mapping[str, str], name: str) -> str:
    return (environ.get(name) or "").strip()


def is_test_suite(environ: Mapping[str, str] = os.environ) -> bool:
    return _value(environ, "MEMORYHUB_TEST_SUITE").lower() in _TRUE


def secrets_path(data_dir: Path) -> Path:
    return data_dir / FILE_NAME


def load_secrets(data_dir: Path, *, production: bool, environ: Mapping[str, str] = os.environ) -> Secrets:
    """The secrets this process runs with (see the module docstring for where each comes from).
    Raises ImproperlyConfigured, naming the variable or file, for anything unusable."""
    test_suite = is_test_suite(environ)
    if test_suite and production:
        raise ImproperlyConfigured("MEMORYHUB_TEST_SUITE must not be set when MEMORYHUB_PRODUCTION=true")
    values: dict[str, str] = {}
    for name, variable in VARIABLES.items():
        value = _value(environ, variable)
        if not value:
            continue
        if len(value) < MIN_LENGTH:
            raise ImproperlyConfigured(f"{variable} must be at least {MIN_LENGTH} characters long")
        if value in DEV_SECRETS.values() and not test_suite:
            raise ImproperlyConfigured(f"{variable} is the development value committed in the repository; "
                                       "unset it (a random one is generated and kept) or set your own")
        values[name] = value
    missing = [name for name in VARIABLES if name not in values]
    stored: dict[str, Any] = {}
    if missing and test_suite:
        values.update({name: DEV_SECRETS[name] for name in missing})
    elif missing and production:
        raise ImproperlyConfigured(f"{VARIABLES[missing[0]]} must be set when MEMORYHUB_PRODUCTION=true "
                                   "(every host must share it; see docs/operations.md §4)")
    elif missing:
        stored = _kept_secrets(secrets_path(data_dir), missing)
        values.update({name: stored[name] for name in missing})
    previous = [p.strip() for p in _value(environ, "API_KEY_PEPPER_PREVIOUS").split(",") if p.strip()]
    if "api_key_pepper" in missing:  # the file's list belongs to the file's pepper
        previous += [str(p) for p in stored.get(PREVIOUS_PEPPERS, [])]
    peppers = tuple(dict.fromkeys(p for p in previous if p != values["api_key_pepper"]))
    encryption_key = None
    if not production and not test_suite:
        # Made only while no key is configured; with keys configured, kept only to open what it sealed.
        encryption_key = _kept_encryption_key(secrets_path(data_dir),
                                              generate=not _value(environ, ENCRYPTION_KEYS_VARIABLE))
    return Secrets(secret_key=values["secret_key"], jwt_signing_key=values["jwt_signing_key"],
                   api_key_pepper=values["api_key_pepper"], previous_api_key_peppers=peppers,
                   encryption_key=encryption_key)


# --- the file -----------------------------------------------------------------------------------


def _new_secret() -> str:
    return secrets.token_urlsafe(48)  # 384 random bits


def _new_encryption_key() -> str:
    return secrets.token_hex(KEY_BYTES)  # AES-256


def _read(path: Path) -> dict[str, Any]:
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return {}
    if mode & 0o077:
        raise ImproperlyConfigured(f"{path} is readable by other users; `chmod 600 {path}` (and consider "
                                   "rotating the secrets in it, docs/operations.md §4)")
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ImproperlyConfigured(f"{path} cannot be read as JSON ({type(exc).__name__}); restore it from a "
                                   "backup, or delete it to generate new secrets (every token and key ends)") from None
    if not isinstance(stored, dict):
        raise ImproperlyConfigured(f"{path} must hold a JSON object")
    return stored


def _write(path: Path, stored: dict[str, Any]) -> None:
    """Replace the file atomically: a reader sees the old file or the new one, never a torn one."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(descriptor, "w") as handle:
            json.dump(stored, handle, indent=2, sort_keys=True)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock beside the file: web, worker and beat start together and must not
    each generate (and the last one keep) different secrets."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path.with_name(f".{path.name}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # closing releases the lock


def _kept_secrets(path: Path, wanted: list[str], new: Callable[[], str] = _new_secret) -> dict[str, Any]:
    stored = _read(path)  # the common case, without the lock: the file is only ever replaced whole
    if all(stored.get(name) for name in wanted):
        return stored
    try:
        with _locked(path):
            stored = _read(path)
            missing = [name for name in wanted if not stored.get(name)]
            if missing:
                stored.update({name: new() for name in missing})
                _write(path, stored)
    except OSError as exc:
        variables = ", ".join(VARIABLES.get(n, ENCRYPTION_KEYS_VARIABLE) for n in wanted)
        raise ImproperlyConfigured(f"cannot keep generated secrets in {path} ({exc.strerror}); make the data "
                                   f"directory writable or set {variables}") from None
    return stored


def _kept_encryption_key(path: Path, *, generate: bool) -> bytes | None:
    """The file's encryption key, generated (under the file's lock) when missing and `generate`."""
    stored = _kept_secrets(path, [ENCRYPTION_KEY], new=_new_encryption_key) if generate else _read(path)
    value = stored.get(ENCRYPTION_KEY)
    if not value:
        return None
    if not isinstance(value, str) or not _HEX_KEY.fullmatch(value):
        # Never echo it: name the file and the entry only.
        raise ImproperlyConfigured(f"{path}: {ENCRYPTION_KEY!r} must be {2 * KEY_BYTES} hex characters; "
                                   "restore the file from a backup (what the key sealed opens with no other key)")
    return bytes.fromhex(value)


def rotate_kept_secret(data_dir: Path, name: str) -> datetime:
    """Replace one generated secret in the file (docs/operations.md §4). A rotated pepper moves to
    the front of the previous peppers, so every key keeps working (and is re-hashed on its next
    use). Running processes keep the old value until they restart. Returns the rotation time."""
    if name not in VARIABLES:
        raise ValueError(f"unknown secret {name!r}")
    path = secrets_path(data_dir)
    now = datetime.now(UTC)
    with _locked(path):
        stored = _read(path)
        old = stored.get(name)
        stored[name] = _new_secret()
        if name == "api_key_pepper":
            if old:
                previous = [old, *[p for p in stored.get(PREVIOUS_PEPPERS, []) if p != old]]
                stored[PREVIOUS_PEPPERS] = previous[:KEEP_PREVIOUS_PEPPERS]
            stored[PEPPER_ROTATED_AT] = now.isoformat()
        _write(path, stored)
    return now


def drop_previous_peppers(data_dir: Path) -> int:
    """End a pepper rotation's window: forget the file's previous peppers. Returns how many."""
    path = secrets_path(data_dir)
    with _locked(path):
        stored = _read(path)
        dropped = len(stored.pop(PREVIOUS_PEPPERS, []) or [])
        _write(path, stored)
    return dropped


def pepper_rotated_at(data_dir: Path) -> datetime | None:
    """When the file's pepper was last rotated (None: never, or the file is not used)."""
    value = _read(secrets_path(data_dir)).get(PEPPER_ROTATED_AT)
    return datetime.fromisoformat(value) if isinstance(value, str) else None
