"""Erasure with a certificate (docs/architecture.md §9).

A school admin erases a student's stack, or one memory, irreversibly: memories with their revisions,
salience rows, kept raw originals (memories.privacy.originals) and embeddings (columns of the memory row),
checkpoints, boot config and sync watermarks. What stays: the Stack row (archived, zero usage, so
its slug is not reused by a new push), an audit event with counts only, the certificate, and one
tombstone per erased memory that is an id only (SHA-256 of "<kind>:<record_id>":
memories.privacy.tombstones), which the sync engine checks so that a device holding an old copy
cannot push the memories back into existence; and the erasure's own change events ("erase", memory
ids only: live pages and webhooks hear of it, and devices get them on a native pull as tombstones),
kept while the stack is (memories.changes.publish.events_prune).

Deletes are set-based, in batches of ERASE_BATCH memories, each batch one statement (a
data-modifying CTE) in its own transaction, after which the certificate's `counts` show the progress.
A stack above ASYNC_THRESHOLD memories is erased by a Celery job (`memories.erase`).

The certificate's digest is an HMAC-SHA256 over its canonical JSON. Key: Django's `salted_hmac`
derivation of SECRET_KEY with a purpose salt — its own key, not the session/CSRF one, not the JWT
key or the API-key pepper (those rotate for their own reasons, and a certificate must outlive them);
verification also tries SECRET_KEY_FALLBACKS, so rotating SECRET_KEY the documented way keeps old
certificates verifiable.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from django.utils.crypto import salted_hmac

from accounts.principal import Principal
from accounts.services import audit_record
from memories.models import (
    BootConfigEntry,
    ChangeEvent,
    Checkpoint,
    ErasureCertificate,
    Memory,
    MemoryAccess,
    StackDailyActivity,
    SyncWatermark,
)
from memories.search.embeddings import query_cache
from memories.writes.outbox import BOOT_CONFIG, CHECKPOINT, MEMORY, REMOVAL_ACTIONS, record_change
from memoryhub.errors import Conflict, InvalidInput
from stacks.models import Stack
from teleport.services import snapshots_erase

logger = logging.getLogger(__name__)

ERASE_BATCH = 2000
ASYNC_THRESHOLD = 5000
ERASE_TASK = "memories.erase"
_DIGEST_SALT = "memoryhub.erasure-certificate.v1"
REQUESTED_BY_MAX = 1000
ERASURE_SOURCE = "erasure"  # the change events' source
_ERASED_TOPICS = {"checkpoints": CHECKPOINT, "boot_config_entries": BOOT_CONFIG}

# Apps above this one keep per-stack data of their own (webhooks: deliveries waiting to be sent).
# Each registers `eraser(stack_id) -> {label: rows deleted}`, run in the stack erasure's final
# transaction; its counts go on the certificate.
StackEraser = Callable[[int], dict[str, int]]
_stack_erasers: list[StackEraser] = []


def register_stack_eraser(eraser: StackEraser) -> None:
    if eraser not in _stack_erasers:
        _stack_erasers.append(eraser)


# The same for one memory: `eraser(stack_id, memory_id) -> {label: rows changed}`, run once the
# memory is gone; its counts go on the certificate.
MemoryEraser = Callable[[int, Any], dict[str, int]]
_memory_erasers: list[MemoryEraser] = []


def register_memory_eraser(eraser: MemoryEraser) -> None:
    if eraser not in _memory_erasers:
        _memory_erasers.append(eraser)

# One batch: pick memories, leave a tombstone of each, delete their revisions, salience rows, kept
# originals and themselves, and say what went, by kind (with the ids, for the batch's change
# event) — one statement. Every FK to the memory row is deferrable (Django's default), so the sibling deletes
# see one snapshot and the checks run at commit.
_BATCH_SQL = """
WITH batch AS (
    SELECT id, kind, record_id FROM memories_memory WHERE stack_id = %(stack)s {memory_filter}
    LIMIT %(limit)s FOR UPDATE
), tomb AS (
    INSERT INTO memories_erasedrecord (stack_id, key_hash)
    SELECT %(stack)s, encode(sha256(convert_to(kind || ':' || record_id, 'UTF8')), 'hex') FROM batch
    ON CONFLICT DO NOTHING RETURNING 1
), sal AS (
    DELETE FROM memories_memorysalience s USING batch b WHERE s.memory_id = b.id RETURNING 1
), rev AS (
    DELETE FROM memories_memoryrevision r USING batch b WHERE r.memory_id = b.id RETURNING 1
), orig AS (
    DELETE FROM memories_raworiginal o USING batch b WHERE o.memory_id = b.id RETURNING 1
), mem AS (
    DELETE FROM memories_memory m USING batch b WHERE m.id = b.id
    RETURNING m.id, m.kind, m.size_bytes, (m.deleted_at IS NULL) AS counted
)
SELECT 'memory:' || kind, count(*), coalesce(sum(size_bytes) FILTER (WHERE counted), 0),
       count(*) FILTER (WHERE counted), array_agg(id::text) FROM mem GROUP BY kind
UNION ALL SELECT 'revisions', (SELECT count(*) FROM rev), 0, 0, NULL
UNION ALL SELECT 'salience_rows', (SELECT count(*) FROM sal), 0, 0, NULL
UNION ALL SELECT 'raw_originals', (SELECT count(*) FROM orig), 0, 0, NULL
"""


# --- the certificate ------------------------------------------------------------------------------

def certificate_fields(cert: ErasureCertificate) -> dict[str, Any]:
    """The certified fields, as JSON values (what the digest covers and the JSON view shows)."""
    return {
        "id": str(cert.id),
        "organization": cert.organization.slug,
        "stack": cert.stack_slug,
        "stack_id": cert.stack_ref,
        "scope": cert.scope,
        "memory_id": str(cert.memory_ref) if cert.memory_ref else None,
        "requested_by": cert.requested_by,
        "erased_by": cert.erased_by_label,
        "status": cert.status,
        "counts": cert.counts,
        "requested_at": cert.requested_at.isoformat(),
        "completed_at": cert.completed_at.isoformat() if cert.completed_at else None,
    }


def canonical_json(fields: dict[str, Any]) -> bytes:
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _digest(fields: dict[str, Any], secret: str) -> str:
    return salted_hmac(_DIGEST_SALT, canonical_json(fields), secret=secret, algorithm="sha256").hexdigest()


def certificate_document(cert: ErasureCertificate) -> dict[str, Any]:
    return {**certificate_fields(cert), "digest": cert.digest or None}


def certificate_verify(document: Any) -> bool:
    """Does this certificate document (its fields plus `digest`) carry a digest this server made?"""
    if not isinstance(document, dict):
        return False
    digest = document.get("digest")
    if not isinstance(digest, str) or not digest:
        return False
    fields = {k: v for k, v in document.items() if k != "digest"}
    if fields.get("status") != ErasureCertificate.Status.DONE:
        return False
    secrets = [settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", [])]
    try:
        return any(hmac.compare_digest(_digest(fields, secret), digest) for secret in secrets)
    except (TypeError, ValueError):  # values JSON cannot encode canonically
        return False


# --- requests -------------------------------------------------------------------------------------

def _requested_by(raw: Any) -> str:
    text = raw.strip() if isinstance(raw, str) else ""
    if not text or len(text) > REQUESTED_BY_MAX or "\x00" in text:
        raise InvalidInput("Say at whose request this is erased (1-1000 characters).", code="invalid",
                           fields={"requested_by": ["Required: e.g. 'parent of student X, letter 2026-11-20'."]})
    return text


def _new_certificate(principal: Principal, stack: Stack, *, scope: str, requested_by: str,
                     memory: Memory | None = None) -> ErasureCertificate:
    return ErasureCertificate.objects.create(
        organization=stack.organization, stack=stack, stack_ref=stack.pk, stack_slug=stack.slug, scope=scope,
        memory_ref=memory.pk if memory else None, requested_by=requested_by, erased_by=principal.user,
        erased_by_label=principal.user.email or principal.user.get_username())


def stack_erase_request(*, principal: Principal, stack: Stack, requested_by: Any, confirm: Any,
                        ip: str | None = None) -> ErasureCertificate:
    """Erase the whole stack (the caller was checked by memories.selectors.stack_for_erasure).

    `confirm` must repeat the stack's slug. Small stacks are erased now; larger ones by the Celery
    job, the certificate being returned `pending` (poll `GET /api/v1/erasures/{id}`)."""
    if confirm != stack.slug:
        raise InvalidInput("Type the stack's id to confirm the erasure.", code="confirmation_mismatch",
                           fields={"confirm": ["Must equal the stack's id."]})
    text = _requested_by(requested_by)
    with transaction.atomic():
        locked = Stack.objects.select_for_update().get(pk=stack.pk)
        if ErasureCertificate.objects.filter(stack_ref=locked.pk, scope=ErasureCertificate.Scope.STACK,
                                             status__in=["pending", "running"]).exists():
            raise Conflict("An erasure of this stack is already under way.", code="erasure_in_progress")
        # Archived first: from here on no write lands in the stack (stacks.selectors.ensure_writable).
        if locked.status != Stack.Status.ARCHIVED:
            locked.status = Stack.Status.ARCHIVED
            locked.archived_at = timezone.now()
            locked.save(update_fields=["status", "archived_at", "updated_at"])
        cert = _new_certificate(principal, locked, scope=ErasureCertificate.Scope.STACK, requested_by=text)
        audit_record(organization=locked.organization, action="stack.erasure_requested", principal=principal,
                     target_type="stack", target_id=str(locked.pk), ip=ip, metadata={"certificate": str(cert.id)})
    if Memory.objects.filter(stack_id=stack.pk).count() > ASYNC_THRESHOLD:
        transaction.on_commit(lambda: _enqueue(cert.id))
        return cert
    return erasure_run(cert.id)


def memory_erase_request(*, principal: Principal, memory: Memory, requested_by: Any,
                         ip: str | None = None) -> ErasureCertificate:
    """Erase one memory (with its revisions, salience row, embedding) now."""
    text = _requested_by(requested_by)
    stack = memory.stack
    cert = _new_certificate(principal, stack, scope=ErasureCertificate.Scope.MEMORY, requested_by=text,
                            memory=memory)
    audit_record(organization=stack.organization, action="memory.erasure_requested", principal=principal,
                 target_type="stack", target_id=str(stack.pk), ip=ip, metadata={"certificate": str(cert.id)})
    return erasure_run(cert.id)


def _enqueue(cert_id: Any) -> None:
    from celery import current_app

    app = current_app
    if app.conf.task_always_eager:
        if ERASE_TASK not in app.tasks:
            app.loader.import_default_modules()
        app.tasks[ERASE_TASK].apply(args=(str(cert_id),))
    else:
        app.send_task(ERASE_TASK, args=(str(cert_id),))


# --- the work -------------------------------------------------------------------------------------

def _erase_batch(stack_id: int, memory_id: Any, counts: dict[str, int]) -> tuple[int, int, int]:
    """One batch in its own transaction; adds to `counts`; returns (memories, counted rows, bytes)."""
    memory_filter = "AND id = %(memory)s" if memory_id else ""
    erased = counted = counted_bytes = 0
    with transaction.atomic(), connection.cursor() as cursor:
        # Lock order of every writer: the stack row before its memory rows; holding it also makes
        # this batch's "erase" event commit in seq order with the stack's other writes (memories.writes.outbox).
        Stack.objects.select_for_update().filter(pk=stack_id).first()
        # The stack now has tombstones, so the sync engine must look them up (Stack.has_erasures):
        # set under the lock, so a push holding it finishes first and every later push sees it.
        Stack.objects.filter(pk=stack_id, has_erasures=False).update(has_erasures=True)
        cursor.execute(_BATCH_SQL.format(memory_filter=memory_filter),
                       {"stack": stack_id, "limit": ERASE_BATCH, "memory": memory_id})
        ids: list[str] = []
        for label, rows, size, live, memory_ids in cursor.fetchall():
            if rows:
                counts[label] = counts.get(label, 0) + rows
            if label.startswith("memory:"):
                erased += rows
                counted += live
                counted_bytes += size
                ids.extend(memory_ids or ())
        # One "erase" event per batch: ids only (memories.writes.outbox), in the batch's transaction.
        if ids:
            record_change(stack_id=stack_id, topic=MEMORY, source=ERASURE_SOURCE, changes=[("erase", ids)])
        if counted or counted_bytes:
            Stack.objects.filter(pk=stack_id).update(memory_count=_minus("memory_count", counted),
                                                     bytes_used=_minus("bytes_used", counted_bytes))
    return erased, counted, counted_bytes


def _minus(column: str, amount: int) -> Any:
    from django.db.models import F
    from django.db.models.functions import Greatest

    return Greatest(F(column) - amount, 0)


def erasure_run(cert_id: Any) -> ErasureCertificate:
    """Do the erasure a certificate describes, batch by batch, recording progress; then sign it.
    Safe to run again after a crash: every batch picks what is still there."""
    cert = ErasureCertificate.objects.select_related("organization").get(pk=cert_id)
    if cert.status == ErasureCertificate.Status.DONE:
        return cert
    counts: dict[str, int] = dict(cert.counts)
    ErasureCertificate.objects.filter(pk=cert.pk).update(status=ErasureCertificate.Status.RUNNING)
    try:
        memory_id = cert.memory_ref if cert.scope == ErasureCertificate.Scope.MEMORY else None
        while True:
            erased, _, _ = _erase_batch(cert.stack_ref, memory_id, counts)
            ErasureCertificate.objects.filter(pk=cert.pk).update(counts=counts)
            if erased < ERASE_BATCH or memory_id:
                break
        if memory_id:
            for memory_eraser in _memory_erasers:
                counts.update({label: n for label, n in memory_eraser(cert.stack_ref, memory_id).items() if n})
        if cert.scope == ErasureCertificate.Scope.STACK:
            with transaction.atomic():
                # The stack's change history goes too (when its agents wrote: activity, like the
                # daily rollup below); the removal events (this erasure's, earlier purges') stay,
                # ids only: consumers hear of it, and they are the devices' tombstones on pull.
                history, _ = (ChangeEvent.objects.filter(stack_id=cert.stack_ref)
                              .exclude(action__in=REMOVAL_ACTIONS).delete())
                if history:
                    counts["change_events"] = history
                for label, model in (("checkpoints", Checkpoint), ("boot_config_entries", BootConfigEntry),
                                     ("sync_watermarks", SyncWatermark), ("daily_activity_rows", StackDailyActivity),
                                     ("access_log_rows", MemoryAccess)):
                    deleted, _ = model.objects.filter(stack_id=cert.stack_ref).delete()
                    if deleted:
                        counts[label] = deleted
                        if label in _ERASED_TOPICS:
                            record_change(stack_id=cert.stack_ref, topic=_ERASED_TOPICS[label],
                                          source=ERASURE_SOURCE, changes=[("erase", ())])
                # The student's workspace snapshots (teleport) and their codes go too.
                snapshots = snapshots_erase(stack_id=cert.stack_ref)
                if snapshots:
                    counts["teleport_snapshots"] = snapshots
                for eraser in _stack_erasers:
                    counts.update({label: n for label, n in eraser(cert.stack_ref).items() if n})
                # Nothing is left in it: usage is zero whatever drifted.
                Stack.objects.filter(pk=cert.stack_ref).update(memory_count=0, bytes_used=0, last_write_at=None)
            _drop_stack_vector_index(cert.stack_ref)
        # Query vectors are cached per process by text (memories.search.embeddings); drop this
        # process's — other processes' entries age out of their LRU (they hold vectors, no text is logged).
        query_cache.clear()
    except Exception:
        ErasureCertificate.objects.filter(pk=cert.pk).update(status=ErasureCertificate.Status.FAILED, counts=counts)
        logger.exception("erasure %s failed; run it again to finish", cert.pk)
        raise
    cert.refresh_from_db()
    cert.status = ErasureCertificate.Status.DONE
    cert.counts = counts
    cert.completed_at = timezone.now()
    cert.digest = _digest(certificate_fields(cert), settings.SECRET_KEY)
    cert.save(update_fields=["status", "counts", "completed_at", "digest"])
    audit_record(organization=cert.organization, action=f"{cert.scope}.erased", actor=cert.erased_by,
                 target_type="stack", target_id=str(cert.stack_ref),
                 metadata={"certificate": str(cert.pk), "counts": counts})
    logger.info("erasure %s done: %s", cert.pk, counts)
    return cert


def _drop_stack_vector_index(stack_id: int) -> None:
    """A stack's own partial HNSW index (memories.search.vector_indexes) holds its vectors; drop it."""
    from memories.search.vector_indexes import stack_index_name, stacks_with_vector_index

    if stack_id not in stacks_with_vector_index(refresh=True):
        return
    with connection.cursor() as cursor:
        cursor.execute(f'DROP INDEX IF EXISTS "{stack_index_name(stack_id)}"')
    stacks_with_vector_index(refresh=True)
