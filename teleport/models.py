"""Workspace snapshots and the teleport codes that share them (docs/teleport.md).

A snapshot's archive is not in the database: it is one sealed blob under
`settings.TELEPORT_DIR`, named by the SHA-256 of its ciphertext (`blob_sha256`). A code is stored
only as a keyed hash; whoever holds the code itself (and a key of the same school) may download
the one snapshot it names until it expires (or, for a one-time code, until its first use).
"""

from __future__ import annotations

import uuid

from django.db import models

from accounts.models import User
from stacks.models import Stack


class Snapshot(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    stack = models.ForeignKey(Stack, on_delete=models.CASCADE, related_name="teleport_snapshots")
    name = models.CharField(max_length=100, blank=True, default="")
    blob_sha256 = models.CharField(max_length=64)  # SHA-256 of the sealed blob: its file name
    key_id = models.CharField(max_length=32)  # the encryption key it was sealed with
    stored_bytes = models.BigIntegerField()  # the sealed blob's size: what the storage quota counts
    unpacked_bytes = models.BigIntegerField()  # the files' bytes once restored
    file_count = models.IntegerField()
    # Members left out of the stored archive: [{"name", "reason"}] (names only, never content).
    # At most STRIPPED_LISTED of them are listed; `stripped_count` counts them all.
    stripped = models.JSONField(default=list, blank=True)
    stripped_count = models.IntegerField(default=0)
    created_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["stack", "-created_at"], name="teleport_snapshot_stack"),
                   models.Index(fields=["expires_at"], name="teleport_snapshot_expiry")]

    def __str__(self) -> str:
        return f"snapshot {self.pk} of stack {self.stack_id}"


class TeleportCode(models.Model):
    snapshot = models.ForeignKey(Snapshot, on_delete=models.CASCADE, related_name="codes")
    code_hash = models.CharField(max_length=64, unique=True)  # HMAC-SHA256 under the API-key pepper
    one_time = models.BooleanField(default=True)
    created_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField(db_index=True)
    used_at = models.DateTimeField(null=True, blank=True)  # first download; a one-time code dies with it

    def __str__(self) -> str:
        return f"teleport code {self.pk} for snapshot {self.snapshot_id}"
