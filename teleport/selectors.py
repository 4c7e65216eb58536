"""Teleport reads: a stack's live snapshots, one of them, and a snapshot's archive opened.

The caller resolved the stack through `stacks.selectors.stack_for_principal` (the one access
decision); a snapshot is only ever looked up within that stack, so another stack's or school's id
is a 404 like an unknown one. An expired snapshot is gone for every reader, before the purge
removes it.
"""

from __future__ import annotations

import logging
import uuid

from django.db.models import QuerySet
from django.utils import timezone

from memoryhub.encryption import DecryptionFailed, open_sealed
from memoryhub.errors import NotFound, Unprocessable
from stacks.models import Stack
from teleport.blobs import blob_get
from teleport.models import Snapshot
from teleport.services import associated_data

logger = logging.getLogger(__name__)


def snapshots_of(stack: Stack) -> QuerySet[Snapshot]:
    return Snapshot.objects.filter(stack_id=stack.pk, expires_at__gt=timezone.now()).order_by("-created_at", "pk")


def snapshot_of(stack: Stack, snapshot_id: object) -> Snapshot:
    try:
        key = uuid.UUID(str(snapshot_id))
    except ValueError:
        raise NotFound("Snapshot not found.", code="snapshot_not_found") from None
    snapshot = snapshots_of(stack).filter(pk=key).first()
    if snapshot is None:
        raise NotFound("Snapshot not found.", code="snapshot_not_found")
    return snapshot


def snapshot_archive(snapshot: Snapshot) -> bytes:
    """The snapshot's tar.gz, opened. A missing, altered or unopenable blob is a 422 naming the
    snapshot (never its content); the log names the snapshot and the key id."""
    sealed = blob_get(snapshot.blob_sha256)
    if sealed is not None:
        try:
            return open_sealed(sealed, key_id=snapshot.key_id,
                               associated_data=associated_data(snapshot.pk, snapshot.stack_id))
        except DecryptionFailed:
            pass
    logger.warning("teleport snapshot %s cannot be opened (key id %s)", snapshot.pk, snapshot.key_id)
    raise Unprocessable("The snapshot's stored archive cannot be read (missing, or wrong key or tampered data).",
                        code="snapshot_unreadable")
