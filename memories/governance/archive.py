"""The portable archive of one stack (for access requests), and its import for the round trip.

Writer: `archive_chunks` yields a ZIP (format version 1, described by `ARCHIVE_README`, which is
also the archive's own README.md) as byte chunks. Rows are read with server-side cursors
(`.values().iterator(chunk_size=…)`) and each ZIP entry is written through a streaming deflater,
so peak memory is one chunk of rows plus one output chunk whatever the stack's size (the API
streams the chunks with a StreamingHttpResponse).

Reader: `archive_import` writes an archive into an empty stack through the sync engine (the write
kernel's set-based form: the storage quota, transforms such as redaction, revisions, counters and
embedding apply as to any push), then restores the server's tombstones with `memory_forget`, and
the checkpoints and boot config with their services.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import IO, Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.utils import timezone

from accounts.authors import job_author
from accounts.models import Organization
from memories.models import BootConfigEntry, Checkpoint, Memory, MemoryKind, MemoryRevision
from memories.privacy.grants import Audience, grants_filter
from memories.reads.access_history import access_log_for_archive
from memories.reads.export import stack_memory_md
from memories.records.cleaning import parse_timestamp
from memories.services import CheckpointInput, boot_config_set, checkpoint_save, memory_forget
from memories.sync.engine import apply_native_operations, with_retry_per_record
from memories.sync.protocol import CLIENT_FORGET_REASON, OpResult, db_now
from memoryhub.errors import Conflict, InvalidInput
from stacks.models import Stack
from stacks.services import stack_create

ARCHIVE_FORMAT_VERSION = 1
ROW_CHUNK = 500  # rows fetched per server-side cursor round trip (~1-2 MB of Python objects)
FLUSH_BYTES = 256 * 1024  # compressed bytes gathered before a chunk is handed to the response
IMPORT_BATCH = 500  # operations per sync-engine batch on import (one transaction each)
IMPORT_SOURCE = "import"

# Every column of a memory but the two derived from others and too large to be useful outside:
# the embedding vector (re-made from `text` on import) and the generated tsvector.
MEMORY_FIELDS = tuple(f.attname for f in Memory._meta.concrete_fields
                      if f.attname not in ("embedding", "search_vector", "stack_id"))
REVISION_FIELDS = ("id", "memory_id", "version", "source", "action", "reason", "author", "snapshot", "created_at")
CHECKPOINT_FIELDS = ("id", "task", "progress", "next_step", "blocker", "context", "pending", "saved_at",
                     "episode_record_id", "created_at")
BOOT_FIELDS = ("key", "value", "updated_at")
# The memory block's columns a client sends (memories.records.normalize.memory_payload_view).
_PAYLOAD_COLUMNS = ("tags", "confidence", "source_type", "source_entity", "derived_from", "source_episodes",
                    "emotional_valence", "emotional_arousal", "emotional_tags", "subject_ids", "access_grants",
                    "consent_grants", "strength", "times_accessed", "is_protected", "last_accessed", "expires_at")

ARCHIVE_README = f"""# MemoryHub stack archive (format version {ARCHIVE_FORMAT_VERSION})

This ZIP holds everything MemoryHub stores about one stack, as of `exported_at` in `manifest.json`.
All text is UTF-8; timestamps are ISO 8601 with a UTC offset; ids are UUIDs or integers.

* `manifest.json`: `format_version` ({ARCHIVE_FORMAT_VERSION}), `stack` (slug, display name, kind,
  organization), `exported_at`, `counts` (lines per file);
* `memories/<kind>.jsonl`: one JSON object per line per memory of that kind (raw, episode, note,
  belief, value, goal, drive, relationship, playbook), forgotten and soft-deleted ones included;
* `revisions.jsonl`: the state of a memory before each change: `memory_id`, `version`, `source`,
  `action`, `reason`, `author` (who made the change: `path`, the key's `key_id` and `key_name` or
  the person's `user_id` and `user`, the `agent` label), `snapshot`, `created_at`;
* `checkpoints.jsonl`: the checkpoint history, oldest first: `id`, `task`, `progress`, `next_step`,
  `blocker`, `context`, `pending` (the pending items), `saved_at` (the client's time, for one read from
  a kernle checkpoint episode), `episode_record_id` (that episode's record id, or ""), `created_at`;
* `boot_config.jsonl`: the boot config: `key`, `value`, `updated_at`;
* `MEMORY.md`: the stack's MEMORY.md as the API serves it;
* `access_log.jsonl` (only in an archive exported by a school admin or the stack's own credentials,
  who may read it): who was served which memories, oldest first: `id`, `at`, `path` (the kind of
  read), `reader` (`path` — the channel —, `key_id`, `key_name`, `user_id`, `user`, `agent`) and
  `memory_ids`; never any memory text.

A memory line has every column of the memory: `id`, `kind`, `record_id`, `text` (the searchable
text derived from `data`), `data` (the kind's fields), `extra` (fields a client sent that MemoryHub
does not model), the memory block (`tags`, `confidence`, provenance `source_type`, `source_entity`,
`derived_from`, `source_episodes`; emotion; privacy `subject_ids`, `access_grants`,
`consent_grants`; `is_protected`, `expires_at`), the client's bookkeeping (`strength`,
`times_accessed`, `last_accessed`, `client_version`, `client_updated_at`) and the server's
(`version`, `created_at`, `server_updated_at`, `change_seq`, `forgotten_at`, `forgotten_reason`,
`deleted_at`, `stability`, `difficulty`, `last_reviewed_at`, `size_bytes`, `embedding_model`,
`embedded_version`), and `written_by`: who wrote it first, in a revision's `author` shape. The
embedding vector itself is left out: it is derived from `text`.

`manage.py import_archive <file> --school SLUG --stack NEW_SLUG` writes an archive into an empty
stack. Memories keep their kinds, record ids, fields, provenance, privacy fields and forgotten
state; they get new ids, versions and change numbers, and the revision history starts afresh (written by
the import job).
"""


def _line(row: dict[str, Any]) -> bytes:
    return (json.dumps(row, cls=DjangoJSONEncoder, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


class _Sink(io.RawIOBase):
    """A write-only, unseekable stream (`tell` raises): zipfile then writes data descriptors after
    each entry and never seeks back, so every byte can leave as soon as it is written."""

    def __init__(self) -> None:
        super().__init__()
        self._chunks: list[bytes] = []
        self.pending = 0

    def write(self, data: Any) -> int:
        chunk = bytes(data)
        self._chunks.append(chunk)
        self.pending += len(chunk)
        return len(chunk)

    def drain(self) -> bytes:
        out = b"".join(self._chunks)
        self._chunks.clear()
        self.pending = 0
        return out


def archive_filename(stack: Stack, now: datetime) -> str:
    return f"memoryhub-{stack.slug}-{now.strftime('%Y%m%dT%H%M%SZ')}.zip"


def archive_memory_ids(*, stack: Stack, audience: Audience | None = None) -> list[Any]:
    """The ids of the memories `archive_chunks` writes for `audience` (what the access log records)."""
    return list(grants_filter(Memory.objects.filter(stack=stack), audience).values_list("id", flat=True))


def archive_chunks(*, stack: Stack, now: datetime | None = None, audience: Audience | None = None,
                   include_access_log: bool = False) -> Iterator[bytes]:
    """The stack's archive as a stream of ZIP bytes (format: ARCHIVE_README). Caller checked access.
    `audience`: a requester other than the stack's own credentials (memories.privacy.grants) gets only the
    memories its grants admit, their revisions and a MEMORY.md of them (the counts say so).
    `include_access_log`: the caller may read the stack's access log (memories.reads.access_history)."""
    now = now or timezone.now()
    sink = _Sink()
    counts: dict[str, int] = {}
    with zipfile.ZipFile(sink, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("README.md", ARCHIVE_README)
        sources: list[tuple[str, Any]] = [
            (f"memories/{kind}.jsonl",
             grants_filter(Memory.objects.filter(stack=stack, kind=kind), audience)
             .order_by("change_seq").values(*MEMORY_FIELDS))
            for kind in MemoryKind.values
        ]
        sources += [
            ("revisions.jsonl", grants_filter(MemoryRevision.objects.filter(memory__stack=stack), audience,
                                              prefix="memory__")
             .order_by("id").values(*REVISION_FIELDS)),
            ("checkpoints.jsonl", Checkpoint.objects.filter(stack=stack).order_by("created_at", "id")
             .values(*CHECKPOINT_FIELDS)),
            ("boot_config.jsonl", BootConfigEntry.objects.filter(stack=stack).order_by("key").values(*BOOT_FIELDS)),
        ]
        if include_access_log:
            sources.append(("access_log.jsonl", access_log_for_archive(stack=stack)
                            .values("id", "at", "path", "author", "memory_ids")))
        for name, rows in sources:
            count = 0
            with archive.open(name, "w", force_zip64=True) as entry:
                for row in rows.iterator(chunk_size=ROW_CHUNK):
                    if name == "access_log.jsonl":
                        row["reader"] = row.pop("author")
                    entry.write(_line(row))
                    count += 1
                    if sink.pending >= FLUSH_BYTES:
                        yield sink.drain()
            counts[name] = count
        archive.writestr("MEMORY.md", stack_memory_md(stack=stack, now=now, audience=audience))
        manifest = {
            "format_version": ARCHIVE_FORMAT_VERSION,
            "stack": {"slug": stack.slug, "display_name": stack.display_name, "kind": stack.kind,
                      "organization": stack.organization.slug},
            "exported_at": now,
            "counts": counts,
        }
        archive.writestr("manifest.json", json.dumps(manifest, cls=DjangoJSONEncoder, indent=2))
    yield sink.drain()


# --- import ---------------------------------------------------------------------------------------

@dataclass
class ImportResult:
    stack: Stack
    memories: int = 0
    rejected: list[dict[str, Any]] = field(default_factory=list)
    forgotten: int = 0
    checkpoints: int = 0
    boot_config: int = 0


ImportProgress = Callable[[int, int], None]  # (memories done, memories in the archive)


def _read_lines(archive: zipfile.ZipFile, name: str) -> Iterator[dict[str, Any]]:
    if name not in archive.namelist():
        return
    with archive.open(name) as entry:
        for raw in io.TextIOWrapper(entry, encoding="utf-8"):
            if raw.strip():
                yield json.loads(raw)


def _operation(row: dict[str, Any]) -> dict[str, Any]:
    """An archived memory line → a native sync upsert carrying the client-visible state."""
    data: dict[str, Any] = dict(row.get("extra") or {})
    data.update(row.get("data") or {})
    for name in _PAYLOAD_COLUMNS:
        if name in row:
            data[name] = row[name]
    data["created_at"] = row.get("created_at")
    data["local_updated_at"] = row.get("client_updated_at")
    data["version"] = row.get("client_version")
    data["deleted"] = row.get("deleted_at") is not None
    if row.get("forgotten_at") and row.get("forgotten_reason") != CLIENT_FORGET_REASON:
        # The server's tombstone (decay, an admin) is restored afterwards with its reason; pushed
        # as strength 0 it would become the client's own forget.
        data["strength"] = data.get("strength") or 1.0
    return {"op": "upsert", "kind": row["kind"], "record_id": row["record_id"], "data": data}


def _push(stack: Stack, operations: list[dict[str, Any]]) -> list[OpResult]:
    """One batch through the sync engine, as a native push does (memories.sync.push), minus the
    credential: the operator's command has already chosen the stack."""
    def apply(per_record: bool) -> list[OpResult]:
        locked = Stack.objects.select_for_update(of=("self",)).select_related("organization").get(pk=stack.pk)
        return apply_native_operations(stack=locked, operations=operations, now=db_now(), per_record=per_record,
                                       author=job_author(IMPORT_SOURCE), writer=IMPORT_SOURCE)
    return with_retry_per_record(apply)


def _target_stack(organization: Organization, slug: str, manifest: dict[str, Any]) -> Stack:
    existing = Stack.objects.filter(organization=organization, slug=slug).first()
    if existing is not None:
        if Memory.objects.filter(stack=existing).exists() or Checkpoint.objects.filter(stack=existing).exists():
            raise Conflict("The stack is not empty; import into a new or empty stack.", code="stack_not_empty",
                           fields={"stack": ["Not empty."]})
        return existing
    info = manifest.get("stack") or {}
    kind = str(info.get("kind")) if info.get("kind") in Stack.Kind.values else Stack.Kind.STUDENT
    return stack_create(organization=organization, slug=slug, display_name=str(info.get("display_name") or ""),
                        kind=kind)


def archive_import(*, source: str | IO[bytes], organization: Organization, slug: str,
                   progress: ImportProgress | None = None) -> ImportResult:
    """Write an archive (ARCHIVE_README) into the empty stack `slug` of `organization`.

    InvalidInput for a file that is not an archive of a known format version; Conflict for a
    stack that already holds memories; QuotaExceeded (nothing more stored) past the storage quota.
    """
    try:
        archive = zipfile.ZipFile(source)
        manifest = json.loads(archive.read("manifest.json"))
    except (zipfile.BadZipFile, KeyError, ValueError, OSError):
        raise InvalidInput("Not a MemoryHub stack archive.", code="invalid_archive",
                           fields={"file": ["A ZIP with a manifest.json is expected."]}) from None
    if manifest.get("format_version") != ARCHIVE_FORMAT_VERSION:
        raise InvalidInput("Unknown archive format version.", code="invalid_archive",
                           fields={"file": [f"format_version {ARCHIVE_FORMAT_VERSION} is expected."]})
    with archive:
        stack = _target_stack(organization, slug, manifest)
        result = ImportResult(stack=stack)
        counts = manifest.get("counts") or {}
        total = sum(int(counts.get(f"memories/{kind}.jsonl", 0)) for kind in MemoryKind.values)
        tombstones: list[tuple[str, str, str]] = []
        for kind in MemoryKind.values:
            batch: list[dict[str, Any]] = []
            for row in _read_lines(archive, f"memories/{kind}.jsonl"):
                if row.get("forgotten_at") and row.get("forgotten_reason") != CLIENT_FORGET_REASON \
                        and not row.get("deleted_at"):
                    tombstones.append((row["kind"], row["record_id"], row.get("forgotten_reason") or ""))
                batch.append(_operation(row))
                if len(batch) >= IMPORT_BATCH:
                    _import_batch(stack, batch, result, total, progress)
                    batch = []
            if batch:
                _import_batch(stack, batch, result, total, progress)
        for kind, record_id, reason in tombstones:
            memory = Memory.objects.filter(stack=stack, kind=kind, record_id=record_id).first()
            if memory is not None and memory.forgotten_at is None and not memory.is_protected:
                memory_forget(memory=memory, reason=reason, source=IMPORT_SOURCE)
                result.forgotten += 1
        with transaction.atomic():
            for row in _read_lines(archive, "checkpoints.jsonl"):
                checkpoint_save(stack=stack, checkpoint=CheckpointInput(
                    task=row.get("task") or "", progress=row.get("progress") or "",
                    next_step=row.get("next_step") or "", blocker=row.get("blocker") or "",
                    context=row.get("context") or {}, pending=row.get("pending") or [],
                    saved_at=parse_timestamp(row.get("saved_at")),
                    episode_record_id=str(row.get("episode_record_id") or "")), source=IMPORT_SOURCE)
                result.checkpoints += 1
            for row in _read_lines(archive, "boot_config.jsonl"):
                boot_config_set(stack=stack, key=str(row.get("key") or ""), value=row.get("value"),
                                source=IMPORT_SOURCE)
                result.boot_config += 1
    return result


def _import_batch(stack: Stack, batch: list[dict[str, Any]], result: ImportResult, total: int,
                  progress: ImportProgress | None) -> None:
    for index, outcome in enumerate(_push(stack, batch)):
        if outcome.ok:
            result.memories += 1
        else:
            result.rejected.append({"kind": batch[index]["kind"], "record_id": batch[index]["record_id"],
                                    "code": outcome.code, "error": outcome.error})
    if progress is not None:
        progress(result.memories + len(result.rejected), total)
