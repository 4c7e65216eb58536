"""Teleport writes: store a snapshot, issue a code, redeem a code, expire, delete, purge
(docs/teleport.md).

Contract (as in every app): the caller resolved the stack through
`stacks.selectors.stack_for_principal` (write=True for everything here but `snapshot_for_code`,
which makes its own decision: the code's snapshot must belong to the caller's school). Errors are
`memoryhub.errors` types; nothing is stored when one is raised.

* **Storage.** The cleaned archive (teleport.archive) is sealed with `memoryhub.encryption`
  (AES-256-GCM; associated data = the snapshot id and its stack, so a blob moved onto another
  snapshot does not open) and written to the blob store under the SHA-256 of the ciphertext.
* **Quota.** A snapshot counts its sealed size in its stack's `bytes_used`, the counter the storage
  quota (`billing.entitlements`) already sums: a school's snapshots and memories share one
  allowance, and no second counter can drift from it. Deleting or purging a snapshot gives the
  bytes back (never below zero: a stack erasure zeroes the counter on its own).
* **Codes** are 128 random bits (`tlp_` + 32 hex), shown once, stored as an HMAC under the API-key
  pepper (like API keys: accounts.selectors.api_key_hash), valid under the previous peppers of a
  rotation's window too. A code names one snapshot; it expires after `expires_in_days` (1-30) and
  never outlives its snapshot; a one-time code dies with its first download. A code of another
  school, an expired, used or unknown one are the same 404.
* **Order of effects.** The blob is written before the row's transaction and removed after a
  deletion commits; a blob whose row never committed is an orphan the purge removes after an hour.
"""

from __future__ import annotations

import logging
import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial

from django.conf import settings
from django.db import transaction
from django.db.models import F, Value
from django.db.models.functions import Greatest
from django.utils import timezone

from accounts.principal import Principal
from accounts.selectors import api_key_hash
from accounts.services import audit_record
from billing.entitlements import ensure_can_store
from memoryhub.encryption import EncryptionUnavailable, seal
from memoryhub.errors import InvalidInput, NotFound, ServiceUnavailable
from stacks.models import Stack
from teleport.archive import clean_archive
from teleport.blobs import blob_delete, blob_names_older_than, blob_put
from teleport.models import Snapshot, TeleportCode

logger = logging.getLogger(__name__)

CODE_PREFIX = "tlp_"
MAX_DAYS = 30  # snapshots and codes: the enforced 30-day lifetime (docs/teleport.md)
NAME_MAX = 100
STRIPPED_LISTED = 200  # stripped members named in the stored report; all are counted
ORPHAN_GRACE_SECONDS = 3600  # a blob older than this that no snapshot names is removed


def associated_data(snapshot_id: uuid.UUID, stack_id: int) -> bytes:
    """What a snapshot's blob is bound to: opening it as another snapshot's or stack's fails."""
    return f"memoryhub teleport snapshot {snapshot_id} stack {stack_id}".encode()


def _days(value: object, *, field: str, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DAYS:
        raise InvalidInput(f"{field} must be a whole number of days from 1 to {MAX_DAYS}.",
                           fields={field: [f"A whole number from 1 to {MAX_DAYS}."]})
    return value


def _give_back(stack_id: int, nbytes: int) -> None:
    Stack.objects.filter(pk=stack_id).update(bytes_used=Greatest(F("bytes_used") - nbytes, Value(0)))


def snapshot_create(*, stack: Stack, principal: Principal, upload: bytes, name: str = "",
                    expires_in_days: int | None = None, ip: str | None = None) -> Snapshot:
    """Check, clean, seal and store a workspace archive (a tar.gz) as a snapshot of `stack`.
    The returned snapshot's `stripped` lists what was left out (names and reasons)."""
    days = _days(expires_in_days, field="expires_in_days", default=MAX_DAYS)
    if not isinstance(name, str) or len(name) > NAME_MAX or not name.isprintable():
        raise InvalidInput("Invalid snapshot name.", fields={"name": [f"At most {NAME_MAX} printable characters."]})
    cleaned = clean_archive(upload, limit=int(settings.TELEPORT_MAX_BYTES))
    snapshot_id = uuid.uuid4()
    try:
        key_id, sealed = seal(cleaned.data, associated_data=associated_data(snapshot_id, stack.pk))
    except EncryptionUnavailable:
        raise ServiceUnavailable("Snapshots cannot be stored: no encryption key is configured.",
                                 code="encryption_unavailable") from None
    ensure_can_store(stack=stack, additional_bytes=len(sealed))
    sha256 = blob_put(sealed)
    now = timezone.now()
    with transaction.atomic():
        snapshot = Snapshot.objects.create(
            id=snapshot_id, stack=stack, name=name.strip(), blob_sha256=sha256, key_id=key_id,
            stored_bytes=len(sealed), unpacked_bytes=cleaned.unpacked_bytes, file_count=cleaned.file_count,
            stripped=cleaned.stripped[:STRIPPED_LISTED], stripped_count=len(cleaned.stripped),
            created_by=principal.user, created_at=now, expires_at=now + timedelta(days=days))
        Stack.objects.filter(pk=stack.pk).update(bytes_used=F("bytes_used") + len(sealed))
        audit_record(organization=stack.organization, action="teleport.snapshot_created", principal=principal,
                     target_type="stack", target_id=stack.slug, ip=ip,
                     metadata={"snapshot": str(snapshot_id), "bytes": len(sealed), "files": cleaned.file_count,
                               "stripped": len(cleaned.stripped)})
    return snapshot


def snapshot_expire(*, snapshot: Snapshot, principal: Principal, ip: str | None = None) -> Snapshot:
    """End a snapshot now: its codes stop working at once; the purge removes it."""
    now = timezone.now()
    with transaction.atomic():
        Snapshot.objects.filter(pk=snapshot.pk, expires_at__gt=now).update(expires_at=now)
        TeleportCode.objects.filter(snapshot_id=snapshot.pk, expires_at__gt=now).update(expires_at=now)
        audit_record(organization=principal.organization, action="teleport.snapshot_expired", principal=principal,
                     target_type="snapshot", target_id=str(snapshot.pk), ip=ip)
    snapshot.expires_at = min(snapshot.expires_at, now)
    return snapshot


def _delete(snapshots: list[Snapshot]) -> None:
    """Caller is inside a transaction. Rows go now, their bytes back to the stacks, blobs after commit."""
    Snapshot.objects.filter(pk__in=[s.pk for s in snapshots]).delete()
    for snapshot in snapshots:
        _give_back(snapshot.stack_id, snapshot.stored_bytes)
        transaction.on_commit(partial(blob_delete, snapshot.blob_sha256))


def snapshot_delete(*, snapshot: Snapshot, principal: Principal, ip: str | None = None) -> None:
    with transaction.atomic():
        _delete(list(Snapshot.objects.select_for_update().filter(pk=snapshot.pk)))
        audit_record(organization=principal.organization, action="teleport.snapshot_deleted", principal=principal,
                     target_type="snapshot", target_id=str(snapshot.pk), ip=ip)


def snapshots_erase(*, stack_id: int) -> int:
    """Part of a stack's erasure (memories.governance.erasure, inside its transaction): every snapshot of the
    stack and its codes go, the blobs after commit. The erasure zeroes the stack's usage itself."""
    snapshots = list(Snapshot.objects.filter(stack_id=stack_id).only("pk", "blob_sha256"))
    Snapshot.objects.filter(pk__in=[s.pk for s in snapshots]).delete()
    for snapshot in snapshots:
        transaction.on_commit(partial(blob_delete, snapshot.blob_sha256))
    return len(snapshots)


def snapshots_purge(*, now: datetime | None = None) -> dict[str, int]:
    """The beat's purge: expired snapshots (rows, quota bytes, blobs), expired or used-up codes, and
    blobs no snapshot names any more (a stack deleted with its rows, a failed upload). Idempotent."""
    now = now or timezone.now()
    with transaction.atomic():
        expired = list(Snapshot.objects.select_for_update(skip_locked=True).filter(expires_at__lte=now)
                       .only("pk", "stack_id", "stored_bytes", "blob_sha256"))
        _delete(expired)
        codes, _ = TeleportCode.objects.filter(expires_at__lte=now).delete()
        used, _ = TeleportCode.objects.filter(one_time=True, used_at__isnull=False).delete()
    candidates = blob_names_older_than(ORPHAN_GRACE_SECONDS)
    named = set(Snapshot.objects.filter(blob_sha256__in=candidates).values_list("blob_sha256", flat=True))
    orphans = [name for name in candidates if name not in named]
    for name in orphans:
        blob_delete(name)
    return {"snapshots": len(expired), "codes": codes + used, "orphan_blobs": len(orphans)}


# --- codes -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IssuedCode:
    code: str  # the secret: shown once, never stored
    row: TeleportCode


def code_issue(*, snapshot: Snapshot, principal: Principal, one_time: bool = True,
               expires_in_days: int | None = None, ip: str | None = None) -> IssuedCode:
    """A new code for `snapshot` (live). Default: one-time, one day; reusable codes default to 30."""
    if not isinstance(one_time, bool):
        raise InvalidInput("one_time must be true or false.", fields={"one_time": ["Must be a boolean."]})
    days = _days(expires_in_days, field="expires_in_days", default=1 if one_time else MAX_DAYS)
    now = timezone.now()
    if snapshot.expires_at <= now:
        raise NotFound("Snapshot not found.", code="snapshot_not_found")
    code = CODE_PREFIX + secrets.token_hex(16)
    with transaction.atomic():
        row = TeleportCode.objects.create(
            snapshot=snapshot, code_hash=api_key_hash(code), one_time=one_time, created_by=principal.user,
            created_at=now, expires_at=min(now + timedelta(days=days), snapshot.expires_at))
        audit_record(organization=principal.organization, action="teleport.code_issued", principal=principal,
                     target_type="snapshot", target_id=str(snapshot.pk), ip=ip,
                     metadata={"one_time": one_time, "expires_at": row.expires_at.isoformat()})
    return IssuedCode(code=code, row=row)


def _code_not_found() -> NotFound:
    return NotFound("No snapshot for this teleport code (unknown, expired or already used).",
                    code="teleport_code_not_found")


def snapshot_for_code(*, principal: Principal, code: object, ip: str | None = None) -> Snapshot:
    """The snapshot a code opens for the caller, recording the download (a one-time code is used up).

    The caller's organization must own the snapshot's stack: a code is a capability within one
    school, useless anywhere else (the same 404 as an unknown code)."""
    if not isinstance(code, str) or not code.startswith(CODE_PREFIX) or len(code) > 100 or not code.isascii():
        raise _code_not_found()
    peppers = [settings.API_KEY_PEPPER, *settings.API_KEY_PEPPERS_PREVIOUS]
    digests = [api_key_hash(code, pepper=pepper) for pepper in peppers]
    now = timezone.now()
    with transaction.atomic():
        row = (TeleportCode.objects.select_for_update(of=("self",)).select_related("snapshot__stack")
               .filter(code_hash__in=digests, expires_at__gt=now, snapshot__expires_at__gt=now,
                       snapshot__stack__organization_id=principal.organization.pk)
               .first())
        if row is None or (row.one_time and row.used_at is not None):
            raise _code_not_found()
        if row.used_at is None:
            TeleportCode.objects.filter(pk=row.pk).update(used_at=now)
        audit_record(organization=principal.organization, action="teleport.code_redeemed", principal=principal,
                     target_type="snapshot", target_id=str(row.snapshot_id), ip=ip,
                     metadata={"one_time": row.one_time})
    return row.snapshot
