"""The blob store: sealed snapshot archives as files under `settings.TELEPORT_DIR`.

Content-addressed: a blob's name is the SHA-256 of its bytes (the ciphertext), two hex characters
of it as a fan-out directory (`ab/abcdef…`), so reading a blob also verifies it. Blobs are written to
a temporary file created with mode 0600 in the same directory and renamed into place (a reader
never sees half a blob; the directory tree is 0700). Names are checked against `^[0-9a-f]{64}$`
before any path is built, so no stored value can point outside the store.

An S3-compatible bucket is future work (docs/teleport.md): these three functions are the whole
interface a bucket backend would implement.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from pathlib import Path

from django.conf import settings

_NAME = re.compile(r"[0-9a-f]{64}")


def _root() -> Path:
    return Path(settings.TELEPORT_DIR)


def _path(sha256: str) -> Path:
    if not _NAME.fullmatch(sha256):
        raise ValueError("not a blob name")
    return _root() / sha256[:2] / sha256


def blob_put(data: bytes) -> str:
    """Store `data`; its SHA-256 (the name) is returned. Idempotent for the same bytes."""
    sha256 = hashlib.sha256(data).hexdigest()
    path = _path(sha256)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = path.with_name(f".{sha256}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return sha256


def blob_get(sha256: str) -> bytes | None:
    """The blob's bytes, or None when it is missing or no longer matches its name."""
    try:
        data = _path(sha256).read_bytes()
    except FileNotFoundError:
        return None
    return data if hashlib.sha256(data).hexdigest() == sha256 else None


def blob_delete(sha256: str) -> None:
    _path(sha256).unlink(missing_ok=True)


def blob_names_older_than(seconds: float) -> list[str]:
    """Names of blobs (and abandoned temporary files' blobs) last written over `seconds` ago: the
    candidates the purge compares with the snapshots that still name them."""
    root = _root()
    if not root.is_dir():
        return []
    cutoff = time.time() - seconds
    names = []
    for path in root.glob("[0-9a-f][0-9a-f]/*"):
        if path.stat().st_mtime >= cutoff:
            continue
        if path.name.endswith(".tmp"):
            path.unlink(missing_ok=True)  # a writer that died between create and rename
        elif _NAME.fullmatch(path.name):
            names.append(path.name)
    return names
