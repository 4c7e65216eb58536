"""The blob store: sealed snapshot archives, content-addressed (docs/teleport.md §3).

A blob's name is the SHA-256 of its bytes (the ciphertext), so reading a blob also verifies it: a
blob that is missing or no longer matches its name reads as None, whatever the backend, and the
caller answers the one 422 `snapshot_unreadable`. Names are checked against `^[0-9a-f]{64}$`
before any path or key is built, so no stored value can point outside the store.

Two backends behind the same four functions, chosen by settings at each call:

* **Data dir** (`TELEPORT_DIR`, the default): `ab/abcdef…` files written to a temporary file created
  with mode 0600 in the same directory and renamed into place (a reader never sees half a blob; the
  directory tree is 0700).
* **S3-compatible bucket** (`TELEPORT_S3_BUCKET`, optionally `TELEPORT_S3_ENDPOINT_URL` for MinIO,
  R2 and the like): objects `teleport/ab/abcdef…`. A PUT is atomic, so no temporary object exists.
  Credentials are boto3's standard chain (the AWS env vars, a profile, an instance role); nothing
  here reads or logs them. A bucket that cannot be reached is a 503 `snapshot_store_unavailable`,
  never a 500 and never mistaken for a missing blob.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.conf import settings

from memoryhub.errors import ServiceUnavailable

logger = logging.getLogger(__name__)

_NAME = re.compile(r"[0-9a-f]{64}")
KEY_PREFIX = "teleport/"
_MISSING = {"NoSuchKey", "404", "NotFound"}  # what S3-compatible servers answer for an absent key


def _checked(sha256: str) -> str:
    if not _NAME.fullmatch(sha256):
        raise ValueError("not a blob name")
    return sha256


def _verified(data: bytes | None, sha256: str) -> bytes | None:
    return data if data is not None and hashlib.sha256(data).hexdigest() == sha256 else None


# --- data dir ----------------------------------------------------------------------------------------


def _path(sha256: str) -> Path:
    return Path(settings.TELEPORT_DIR) / sha256[:2] / _checked(sha256)


def _local_put(sha256: str, data: bytes) -> None:
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


def _local_get(sha256: str) -> bytes | None:
    try:
        return _path(sha256).read_bytes()
    except FileNotFoundError:
        return None


def _local_names_older_than(cutoff: float) -> list[str]:
    root = Path(settings.TELEPORT_DIR)
    if not root.is_dir():
        return []
    names = []
    for path in root.glob("[0-9a-f][0-9a-f]/*"):
        if path.stat().st_mtime >= cutoff:
            continue
        if path.name.endswith(".tmp"):
            path.unlink(missing_ok=True)  # a writer that died between create and rename
        elif _NAME.fullmatch(path.name):
            names.append(path.name)
    return names


# --- S3-compatible bucket ----------------------------------------------------------------------------


@functools.cache
def _client(endpoint_url: str, region: str) -> Any:
    """One client per endpoint and region for the process (building one costs tens of ms; boto3
    clients are thread-safe). Imported here so a deployment without a bucket never loads boto3."""
    import boto3
    from botocore.config import Config

    config = Config(
        connect_timeout=5, read_timeout=30, retries={"max_attempts": 3, "mode": "standard"},
        # MinIO and most S3-compatible servers are addressed by path; AWS itself by virtual host.
        s3={"addressing_style": "path" if endpoint_url else "auto"},
        # Only the checksums a request requires: servers other than AWS differ in the optional ones,
        # and a blob's name is its SHA-256, checked again on every read anyway.
        request_checksum_calculation="when_required", response_checksum_validation="when_required")
    return boto3.session.Session().client("s3", endpoint_url=endpoint_url or None,
                                          region_name=region or None, config=config)


def _bucket() -> tuple[Any, str]:
    return _client(settings.TELEPORT_S3_ENDPOINT_URL, settings.TELEPORT_S3_REGION), settings.TELEPORT_S3_BUCKET


def _key(sha256: str) -> str:
    return f"{KEY_PREFIX}{sha256[:2]}/{_checked(sha256)}"


def _error_code(error: Exception) -> str | None:
    return getattr(error, "response", {}).get("Error", {}).get("Code")


def _log_failure(operation: str, error: Exception) -> None:
    # The error's code or type only: botocore messages can quote the endpoint and request details.
    logger.warning("teleport bucket %s failed: %s", operation, _error_code(error) or type(error).__name__)


def _unavailable(operation: str, error: Exception) -> ServiceUnavailable:
    _log_failure(operation, error)
    return ServiceUnavailable("The snapshot store is unavailable; retry shortly.", code="snapshot_store_unavailable")


def _errors() -> tuple[type[Exception], ...]:
    from botocore.exceptions import BotoCoreError, ClientError

    return BotoCoreError, ClientError


def _s3_put(sha256: str, data: bytes) -> None:
    client, bucket = _bucket()
    try:
        client.put_object(Bucket=bucket, Key=_key(sha256), Body=data, ContentType="application/octet-stream")
    except _errors() as error:
        raise _unavailable("put", error) from None


def _s3_get(sha256: str) -> bytes | None:
    client, bucket = _bucket()
    try:
        answer = client.get_object(Bucket=bucket, Key=_key(sha256))
        return bytes(answer["Body"].read())
    except _errors() as error:
        if _error_code(error) in _MISSING:
            return None
        raise _unavailable("get", error) from None


def _s3_delete(sha256: str) -> None:
    client, bucket = _bucket()
    try:
        client.delete_object(Bucket=bucket, Key=_key(sha256))
    except _errors() as error:
        # Deletions run after their rows' commit: a failure must not fail the request. The blob is
        # then an orphan (no snapshot names it), and the hourly purge removes it.
        _log_failure("delete", error)


def _s3_names_older_than(cutoff: float) -> list[str]:
    client, bucket = _bucket()
    moment = datetime.fromtimestamp(cutoff, tz=UTC)
    names = []
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=KEY_PREFIX):
            for item in page.get("Contents", []):
                fanout, _, name = item["Key"][len(KEY_PREFIX):].partition("/")
                if item["LastModified"] < moment and _NAME.fullmatch(name) and fanout == name[:2]:
                    names.append(name)
    except _errors() as error:
        raise _unavailable("list", error) from None
    return names


# --- the interface -----------------------------------------------------------------------------------


def _in_bucket() -> bool:
    return bool(settings.TELEPORT_S3_BUCKET)


def blob_put(data: bytes) -> str:
    """Store `data`; its SHA-256 (the name) is returned. Idempotent for the same bytes."""
    sha256 = hashlib.sha256(data).hexdigest()
    (_s3_put if _in_bucket() else _local_put)(sha256, data)
    return sha256


def blob_get(sha256: str) -> bytes | None:
    """The blob's bytes, or None when it is missing or no longer matches its name."""
    _checked(sha256)
    return _verified(_s3_get(sha256) if _in_bucket() else _local_get(sha256), sha256)


def blob_delete(sha256: str) -> None:
    if _in_bucket():
        _s3_delete(sha256)
    else:
        _path(sha256).unlink(missing_ok=True)


def blob_names_older_than(seconds: float) -> list[str]:
    """Names of blobs (and abandoned temporary files' blobs) last written over `seconds` ago: the
    candidates the purge compares with the snapshots that still name them."""
    cutoff = time.time() - seconds
    return _s3_names_older_than(cutoff) if _in_bucket() else _local_names_older_than(cutoff)
