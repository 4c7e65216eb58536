"""Encryption at rest: an AES-256-GCM envelope under keys with ids, for rotation.

Used for raw entries' original text (memories.privacy.originals; docs/privacy.md, "Encryption at rest").
Generic on purpose: it knows bytes, keys and associated data, nothing about memories, and imports
nothing of the project, so settings can build the keyring at startup.

* **Envelope**: a random 96-bit nonce per seal, prepended to the ciphertext and its 128-bit tag
  (`nonce || ciphertext || tag`). The nonce is random, never a counter: several processes seal at
  once and share no state. Random 96-bit nonces stay safe for about 2^32 seals under one key (the
  GCM limit) — far beyond one school year of raw entries; rotating the key resets the count.
* **Associated data** names what the blob belongs to (for an original: its memory and stack), so
  a blob copied onto another record fails to open instead of opening as that record's.
* **Keys** come from `MEMORYHUB_ENCRYPTION_KEYS`: `<id>:<64 hex>` entries separated by commas, the
  first the *current* key (every new seal), the others still open what they sealed until
  `manage.py rotate_encryption_key` has re-sealed it. Parsed strictly at startup: a bad entry is an
  `ImproperlyConfigured` naming the entry's position and id, never echoing key material.
* **Kept key**: outside production and the test suite (`make run`'s defaults), a random key kept
  in `<data dir>/secrets.json` beside the other generated secrets (memoryhub.secrets), under the
  id `local`: it seals when the variable is unset, so a fresh start stores snapshots and originals
  encrypted without set-up. Where keys are configured it still opens (never seals) what it sealed.
  Production never has one: it seals with configured keys or not at all.
* **Development key**: the test suite and DEBUG (never production) also hold a key derived from
  SECRET_KEY by HKDF under the id `dev`; it seals only when neither a configured nor a kept key
  exists (the test suite). Otherwise it still opens (never seals) what it sealed, so rows made
  before the keys were set can be re-sealed by the rotation command.
* A failure to open — the key id is not configured, the wrong key, a changed blob or a blob moved
  to another record — is `DecryptionFailed` ("wrong key or tampered data", naming the key id); the
  ciphertext or a partial plaintext is never returned.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.core.exceptions import ImproperlyConfigured

VARIABLE = "MEMORYHUB_ENCRYPTION_KEYS"
DEV_KEY_ID = "dev"
LOCAL_KEY_ID = "local"  # the key kept in the data dir (memoryhub.secrets)
KEY_BYTES = 32  # AES-256
NONCE_BYTES = 12  # 96 bits, GCM's native nonce size
TAG_BYTES = 16
KEY_ID_MAX = 32  # RawOriginal.key_id's length
_KEY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}")
_HEX_KEY = re.compile(r"[0-9a-fA-F]{64}")
_DEV_KEY_INFO = b"memoryhub encryption-at-rest development key v1"


class EncryptionUnavailable(Exception):
    """No current key to seal with (`MEMORYHUB_ENCRYPTION_KEYS` unset in production)."""


class DecryptionFailed(Exception):
    """A blob could not be opened. The message names the key id, never key or data."""

    def __init__(self, key_id: str, reason: str = "wrong key or tampered data"):
        super().__init__(f"cannot open data sealed with key {key_id!r}: {reason}")
        self.key_id = key_id


@dataclass(frozen=True)
class Keyring:
    """The keys this process holds: `current_id` seals (None: sealing is refused), every key in
    `keys` opens. Its repr shows ids only (settings are printed by debug pages and `diffsettings`)."""

    current_id: str | None
    keys: Mapping[str, bytes] = field(default_factory=dict, repr=False)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(self.keys)

    def sealing_key(self) -> tuple[str, bytes]:
        if self.current_id is None:
            raise EncryptionUnavailable(f"no encryption key configured; set {VARIABLE}")
        return self.current_id, self.keys[self.current_id]

    def key(self, key_id: str) -> bytes:
        try:
            return self.keys[key_id]
        except KeyError:
            raise DecryptionFailed(key_id, f"key {key_id!r} is not configured in {VARIABLE}") from None


def parse_keys(value: str) -> Keyring:
    """`k2:<64 hex>,k1:<64 hex>` → a Keyring whose current key is the first. Strict: an empty entry,
    a bad id, a value that is not 64 hex characters (32 bytes) or a repeated id is an
    ImproperlyConfigured naming the entry (by position and id), never its key."""
    keys: dict[str, bytes] = {}
    entries = value.split(",")
    for position, entry in enumerate(entries, start=1):
        entry = entry.strip()
        where = f"{VARIABLE}, entry {position}"
        if not entry:
            raise ImproperlyConfigured(f"{where} is empty; expected <id>:<64 hex characters>, comma-separated")
        key_id, separator, hex_key = entry.partition(":")
        key_id, hex_key = key_id.strip(), hex_key.strip()
        if not separator:
            raise ImproperlyConfigured(f"{where} has no key id; expected <id>:<64 hex characters>")
        if not _KEY_ID.fullmatch(key_id):
            raise ImproperlyConfigured(f"{where}: the key id must be 1-{KEY_ID_MAX} letters, digits, '.', '_' "
                                       "or '-', starting with a letter or digit")
        where = f"{where} (key id {key_id!r})"
        if key_id == DEV_KEY_ID:
            raise ImproperlyConfigured(f"{where}: the id {DEV_KEY_ID!r} is reserved for the development key")
        if key_id == LOCAL_KEY_ID:
            raise ImproperlyConfigured(f"{where}: the id {LOCAL_KEY_ID!r} is reserved for the key kept in the data dir")
        if key_id in keys:
            raise ImproperlyConfigured(f"{where}: the id is listed twice; every key needs its own id")
        if not _HEX_KEY.fullmatch(hex_key):
            raise ImproperlyConfigured(
                f"{where}: the key must be exactly 64 hex characters (32 bytes, AES-256); generate one with "
                "python -c \"import secrets; print(secrets.token_hex(32))\"")
        keys[key_id] = bytes.fromhex(hex_key)
    return Keyring(current_id=next(iter(keys)), keys=keys)


def development_key(secret_key: str) -> bytes:
    """The development key: HKDF-SHA256 of SECRET_KEY with a purpose label of its own."""
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=_DEV_KEY_INFO).derive(
        secret_key.encode())


def keyring_from_environment(environ: Mapping[str, str], *, secret_key: str, development: bool,
                             kept_key: bytes | None = None) -> Keyring:
    """The process's keyring (settings.ENCRYPTION_KEYRING). `development`: the test suite or DEBUG,
    never production (settings decides). `kept_key`: the data dir's generated key (outside
    production and the test suite; memoryhub.secrets.load_secrets). The first of the configured
    keys, the kept key and the development key that exists seals; all of them open."""
    value = (environ.get(VARIABLE) or "").strip()
    keyring = parse_keys(value) if value else Keyring(current_id=None, keys={})
    keys, current_id = dict(keyring.keys), keyring.current_id
    if kept_key is not None:
        if len(kept_key) != KEY_BYTES:
            raise ImproperlyConfigured(f"the kept encryption key must be {KEY_BYTES} bytes")
        keys[LOCAL_KEY_ID] = kept_key
        current_id = current_id or LOCAL_KEY_ID
    if development:
        keys[DEV_KEY_ID] = development_key(secret_key)
        current_id = current_id or DEV_KEY_ID
    return Keyring(current_id=current_id, keys=keys)


def current_keyring() -> Keyring:
    from django.conf import settings

    keyring = getattr(settings, "ENCRYPTION_KEYRING", None)
    return keyring if isinstance(keyring, Keyring) else Keyring(current_id=None, keys={})


def seal(plaintext: bytes, *, associated_data: bytes, keyring: Keyring | None = None) -> tuple[str, bytes]:
    """Encrypt under the current key: (key id, nonce || ciphertext || tag).
    Raises EncryptionUnavailable without a current key."""
    key_id, key = (keyring or current_keyring()).sealing_key()
    nonce = os.urandom(NONCE_BYTES)
    return key_id, nonce + AESGCM(key).encrypt(nonce, plaintext, associated_data)


def open_sealed(blob: bytes, *, key_id: str, associated_data: bytes, keyring: Keyring | None = None) -> bytes:
    """The plaintext of `blob` sealed with `key_id` for `associated_data`, or DecryptionFailed."""
    key = (keyring or current_keyring()).key(key_id)
    blob = bytes(blob)  # a database bytea arrives as a memoryview
    if len(blob) < NONCE_BYTES + TAG_BYTES:
        raise DecryptionFailed(key_id, "wrong key or tampered data (too short to be sealed data)")
    try:
        return AESGCM(key).decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:], associated_data)
    except InvalidTag:
        raise DecryptionFailed(key_id) from None
