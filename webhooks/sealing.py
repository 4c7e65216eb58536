"""Signing secrets: generated here, shown once, stored only encrypted (sealed).

A webhook's secret must be readable by us (we sign every delivery with it), so it cannot be hashed
like an API key. It is sealed with Fernet (AES-128-CBC + HMAC-SHA256) under a key derived from
settings.SECRET_KEY by HKDF-SHA256 with a purpose label, so the database alone never yields a
usable secret, and no other use of SECRET_KEY shares this key.

Rotation limits: secrets sealed under an old SECRET_KEY stay readable while that key is listed in
SECRET_KEY_FALLBACKS (they are re-sealed under the new key the next time they are rotated). Once the
old key is dropped, they cannot be opened: those endpoints stop signing (deliveries fail with
"secret unreadable") until an admin rotates their secret on the dashboard.
"""

from __future__ import annotations

import base64
import secrets
from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings

PURPOSE = b"memoryhub webhooks signing-secret v1"
SECRET_PREFIX = "whsec_"  # noqa: S105 - a label, not a secret


class SecretUnreadable(Exception):
    """The sealed secret was made under a SECRET_KEY this deployment no longer has."""


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def _fernet_key(secret_key: str) -> bytes:
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=PURPOSE).derive(secret_key.encode())
    return base64.urlsafe_b64encode(derived)


@lru_cache(maxsize=4)
def _sealer(secret_key: str, fallbacks: tuple[str, ...]) -> MultiFernet:
    return MultiFernet([Fernet(_fernet_key(key)) for key in (secret_key, *fallbacks)])


def _current() -> MultiFernet:
    return _sealer(settings.SECRET_KEY, tuple(getattr(settings, "SECRET_KEY_FALLBACKS", ()) or ()))


def seal(secret: str) -> str:
    return _current().encrypt(secret.encode()).decode()


def unseal(sealed: str) -> str:
    try:
        return _current().decrypt(sealed.encode()).decode()
    except InvalidToken:
        raise SecretUnreadable("sealed under a SECRET_KEY no longer configured") from None
