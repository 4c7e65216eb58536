"""Every memory kind in one table, plus checkpoints, boot config, revisions and job runs.

One table means one full-text GIN index, one decay UPDATE and one change feed (docs/architecture.md
§4.1); vectors are indexed per large stack (memories.search.vector_indexes), not table-wide.
Type-specific fields live in `data` (validated per kind by memories/records/, through
memories.writes.hooks.prepare_memory); fields a client sends that we do not model are kept
verbatim in `extra`.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.contrib.postgres.search import SearchVector, SearchVectorField
from django.db import models
from django.db.models import Func, Q, Value
from django.utils.timezone import now as timezone_now
from pgvector.django import VectorField

EMBEDDING_DIMENSIONS = 384
CHANGE_SEQUENCE = "memories_change_seq"
# Full-text configuration: 'english' stems ("fractions" finds "fraction"); fixed so the
# generated column is immutable.
SEARCH_CONFIG = "english"


class NextChangeSeq(Func):
    """`nextval` of the global change sequence. Stamp it on every insert and every change, so pull
    can read "changes since sequence N" exactly (a monotonic cursor, not a clock)."""

    template = f"nextval('{CHANGE_SEQUENCE}')"
    output_field = models.BigIntegerField()

    def __init__(self) -> None:
        super().__init__()


class MemoryKind(models.TextChoices):
    RAW = "raw"
    EPISODE = "episode"
    NOTE = "note"
    BELIEF = "belief"
    VALUE = "value"
    GOAL = "goal"
    DRIVE = "drive"
    RELATIONSHIP = "relationship"
    PLAYBOOK = "playbook"


def _text_list() -> ArrayField:
    return ArrayField(models.TextField(), default=list, blank=True)


class Memory(models.Model):
    """One memory of any kind in one stack.

    Server-controlled columns (stack, version, embedding*, forgotten_*, deleted_at, change_seq,
    server_updated_at, stability/difficulty) are never taken from clients.
    `strength`, `times_accessed` and `last_accessed` are the client's bookkeeping (kernle);
    the decay model keeps its own state in `stability`, `difficulty` and `last_reviewed_at`, and
    writes the salience it computes to `MemorySalience` (a narrow side table), not to this row.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    stack = models.ForeignKey("stacks.Stack", on_delete=models.CASCADE, related_name="memories")
    kind = models.CharField(max_length=16, choices=MemoryKind.choices)
    # The client's id for the record (kernle's record_id); for native creates, str(id).
    record_id = models.CharField(max_length=200)

    # Canonical searchable text, derived from the kind's fields (as the write kernel's transforms,
    # memories.writes.hooks, left them: where redaction will plug in).
    text = models.TextField(default="", blank=True)
    data = models.JSONField(default=dict, blank=True)  # kind-specific, validated fields
    extra = models.JSONField(default=dict, blank=True)  # unknown client fields, kept verbatim

    tags = _text_list()
    confidence = models.FloatField(default=0.8)
    source_type = models.CharField(max_length=32, blank=True, default="")
    source_entity = models.CharField(max_length=200, blank=True, default="")
    derived_from = _text_list()
    source_episodes = _text_list()
    emotional_valence = models.FloatField(default=0.0)
    emotional_arousal = models.FloatField(default=0.0)
    emotional_tags = _text_list()
    subject_ids = _text_list()
    access_grants = _text_list()
    consent_grants = _text_list()

    # Client bookkeeping (kernle): a pushed strength of 0.0 means "forgotten".
    strength = models.FloatField(default=1.0)
    times_accessed = models.IntegerField(default=0)
    last_accessed = models.DateTimeField(null=True, blank=True)
    is_protected = models.BooleanField(default=False)

    # Server-owned decay state (docs/algorithms.md §2.1, §2.5).
    stability = models.FloatField(default=1.0)
    difficulty = models.FloatField(default=5.0)
    last_reviewed_at = models.DateTimeField(null=True, blank=True)

    forgotten_at = models.DateTimeField(null=True, blank=True)
    forgotten_reason = models.CharField(max_length=64, blank=True, default="")
    deleted_at = models.DateTimeField(null=True, blank=True)  # soft delete (sync delete op)
    expires_at = models.DateTimeField(null=True, blank=True)

    version = models.IntegerField(default=1)  # server version: +1 on every accepted change
    client_version = models.IntegerField(null=True, blank=True)  # kernle data.version, echoed unchanged
    client_updated_at = models.DateTimeField(null=True, blank=True)  # kernle data.local_updated_at
    created_at = models.DateTimeField()
    server_updated_at = models.DateTimeField()
    change_seq = models.BigIntegerField(db_default=NextChangeSeq())

    embedding = VectorField(dimensions=EMBEDDING_DIMENSIONS, null=True, blank=True)
    embedding_model = models.CharField(max_length=100, blank=True, default="")
    embedded_version = models.IntegerField(null=True, blank=True)  # `version` the embedding was made from
    search_vector = models.GeneratedField(
        expression=SearchVector("text", config=SEARCH_CONFIG),
        output_field=SearchVectorField(),
        db_persist=True,
    )
    # What the quota counts: the bytes of the record as the client sent it — `data` and `extra` as
    # JSON plus the tags (memories.records.normalize.normalize_memory); not `text`, derived from `data`.
    size_bytes = models.IntegerField(default=0)
    # What redaction replaced in this record: [{"rule", "count"}], never a value (memories.privacy.redaction,
    # docs/algorithms.md §11). Server-owned; not sent on pull.
    # A database default too: rows inserted by SQL that predates the column (a web process of the
    # previous release during a deploy, bulk loaders) get an empty report instead of failing.
    redaction_report = models.JSONField(default=list, db_default=Value([], output_field=models.JSONField()),
                                        blank=True)
    # Who wrote the record first: accounts.authors.Author.as_json() — the credential (key id and
    # name, or the signed-in person), the agent label and the path (docs/privacy.md "Provenance").
    # Each later change's author is on its MemoryRevision. {} for rows written before provenance.
    written_by = models.JSONField(default=dict, db_default=Value({}, output_field=models.JSONField()),
                                  blank=True)

    class Meta:
        verbose_name_plural = "memories"
        constraints = [
            models.UniqueConstraint(fields=["stack", "kind", "record_id"], name="memories_memory_record_unique"),
        ]
        # Indexes that only serve reads of live memories (load, search, smart-ingest neighbours:
        # every one of those queries says `forgotten_at IS NULL`) leave forgotten rows out. Besides
        # being smaller, a decay tombstone (a non-HOT update: change_seq is indexed) then adds no
        # entry to them: the tsvector GIN's dozens of keys above all (and a large stack's own HNSW
        # graph, memories.search.vector_indexes, is partial on the same condition).
        # Indexes the change feed, sync lookups or recovery need keep every row.
        indexes = [
            models.Index(fields=["stack", "kind", "-created_at"], name="memories_stack_kind_created",
                         condition=Q(forgotten_at__isnull=True)),
            models.Index(fields=["stack", "change_seq"], name="memories_stack_change_seq"),
            models.Index(fields=["stack", "server_updated_at"], name="memories_stack_updated"),
            GinIndex(fields=["search_vector"], name="memories_search_vector_gin",
                     condition=Q(forgotten_at__isnull=True)),
            GinIndex(fields=["tags"], name="memories_tags_gin", condition=Q(forgotten_at__isnull=True)),
            # The backlog in each stack's order of change: the sweep and the task's fill take each
            # stack's oldest first, in turns across stacks (docs/algorithms.md §10.2.2).
            models.Index(
                fields=["stack", "server_updated_at"],
                name="memories_embedding_backlog",
                condition=Q(embedded_version__isnull=True) & Q(deleted_at__isnull=True),
            ),
            models.Index(fields=["expires_at"], name="memories_expires_at", condition=Q(expires_at__isnull=False)),
        ]

    def __str__(self) -> str:
        return f"{self.kind}:{self.record_id}"


class RawOriginal(models.Model):
    """A raw entry's original, unredacted text, kept only when its school opted in
    (`Organization.keep_raw_originals`) and only encrypted: AES-256-GCM, a random 96-bit nonce
    per row, the memory id and stack id as associated data (a row cannot be moved to another
    memory), and the id of the key it was sealed with (docs/privacy.md, "Encryption at rest").
    Deleted with its memory; never sent on pull, search or export."""

    memory = models.OneToOneField(Memory, on_delete=models.CASCADE, primary_key=True, related_name="raw_original")
    key_id = models.CharField(max_length=32)
    # nonce (12 bytes) + ciphertext + GCM tag (16 bytes)
    ciphertext = models.BinaryField()
    sealed_at = models.DateTimeField(auto_now=True)


class MemoryRevision(models.Model):
    """The state of a memory before a change: sync history and inspectable smart-ingest merges."""

    memory = models.ForeignKey(Memory, on_delete=models.CASCADE, related_name="revisions")
    version = models.IntegerField()  # the version this snapshot had
    source = models.CharField(max_length=32)  # api, sync, ingest, decay, feedback
    action = models.CharField(max_length=32, blank=True, default="")  # e.g. update, reinforce, supersede
    reason = models.TextField(blank=True, default="")
    snapshot = models.JSONField()
    # Who made the change this revision records (accounts.authors.Author.as_json()); {} before provenance.
    author = models.JSONField(default=dict, db_default=Value({}, output_field=models.JSONField()), blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["memory", "-created_at"], name="memories_revision_memory_time")]


class Checkpoint(models.Model):
    """Working state: what the agent was doing. History is kept; the latest is loaded first."""

    stack = models.ForeignKey("stacks.Stack", on_delete=models.CASCADE, related_name="checkpoints")
    task = models.CharField(max_length=500)
    progress = models.TextField(blank=True, default="")
    next_step = models.TextField(blank=True, default="")
    blocker = models.TextField(blank=True, default="")
    context = models.JSONField(default=dict, blank=True)
    # The pending items, a list kept as sent (kernle's `pending`, the seed's checkpoint shape).
    pending = models.JSONField(default=list, db_default=Value([], output_field=models.JSONField()), blank=True)
    # When the client saved it (kernle's episode time); None when the server's time is all we have.
    saved_at = models.DateTimeField(null=True, blank=True)
    # The kernle checkpoint episode this checkpoint was read from ("" for native saves): one
    # checkpoint per episode, so a re-push creates no second one (memories.sync.checkpoints).
    episode_record_id = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["stack", "-created_at"], name="memories_checkpoint_latest")]
        constraints = [
            models.UniqueConstraint(fields=["stack", "episode_record_id"], name="memories_checkpoint_episode_once",
                                    condition=~Q(episode_record_id="")),
        ]


class BootConfigEntry(models.Model):
    """Always-available key/value settings of a stack; first in load and export."""

    stack = models.ForeignKey("stacks.Stack", on_delete=models.CASCADE, related_name="boot_config")
    key = models.CharField(max_length=100)
    value = models.TextField()
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "boot config entries"
        constraints = [models.UniqueConstraint(fields=["stack", "key"], name="memories_bootconfig_unique")]


class JobRun(models.Model):
    """What a periodic job did: counts and duration, for admins and operators."""

    class Status(models.TextChoices):
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        SKIPPED = "skipped"  # another run held the lock

    name = models.CharField(max_length=64)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING)
    started_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    duration_ms = models.IntegerField(null=True, blank=True)
    counts = models.JSONField(default=dict, blank=True)
    # The share of `counts` each organization's stacks had, {"<organization id>": {"forgotten": 3}}:
    # jobs are service-wide, a school admin sees only their school's share (memories.lifecycle.jobs).
    organization_counts = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True, default="")

    class Meta:
        indexes = [models.Index(fields=["name", "-started_at"], name="memories_jobrun_name_time")]

    def summary(self) -> dict[str, Any]:
        """What a periodic task returns (and Celery logs) for this run."""
        return {"job_run": self.pk, "status": self.status, "duration_ms": self.duration_ms, **self.counts}


class DeploymentEmbeddingModel(models.Model):
    """The one embedding model of this deployment (docs/algorithms.md §10.3): one row, id 1.

    Stored vectors and search queries must come from the same model, and several processes
    (web, workers, an operator's shell) each read `EMBEDDING_PROVIDER` from their own environment.
    This row is what they agree on: a process whose setting names another model writes no vector
    (`memories.search.embedding_model`), and only `manage.py reembed --switch-model` changes it.
    A row, not "the model most stored vectors have": that would need a scan of the whole table to
    answer, and after a stray re-embed it would elect the stray model.
    """

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    model_id = models.CharField(max_length=100)  # as stored in Memory.embedding_model, e.g. "hash-v1/384"
    recorded_at = models.DateTimeField()  # when it became the deployment's model
    # When the sweep last found no stored vector of another model (NULL: some may remain, so the
    # sweep looks for them; set again once none is left). Keeps that table scan off the steady state.
    verified_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(id=1), name="memories_embedding_model_one_row")]


class SyncWatermark(models.Model):
    """When a credential last read a stack's change set (docs/kernle-protocol.md §4.4).

    A kernle client's `since` is its own clock; the pull uses min(since, this watermark) so a
    fast device clock or a commit racing the previous pull never makes it skip a change.
    """

    stack = models.ForeignKey("stacks.Stack", on_delete=models.CASCADE, related_name="sync_watermarks")
    credential_id = models.CharField(max_length=100)  # API-key public id or JWT jti
    pulled_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["credential_id", "stack"], name="memories_syncwatermark_unique"),
        ]


class MemorySalience(models.Model):
    """What the decay pass computed for one memory: its salience at `computed_at` (docs/algorithms.md §2.6).

    A narrow side table on purpose: writing salience into the wide `Memory` row rewrote the whole
    tuple (text, JSON, arrays, the generated tsvector) and added an entry to every one of its
    indexes, for each of a million memories, every pass. Here the pass only READS `Memory`; an
    update is a 60-byte tuple, and with the fillfactor set in the migration usually a HOT one.
    No database FK constraint: its check takes a FOR KEY SHARE lock on the referenced row, i.e.
    writes to every `Memory` row the pass inserts for. The ORM's CASCADE removes the row with its
    memory (every delete of memories goes through the ORM).
    """

    memory = models.OneToOneField(Memory, primary_key=True, on_delete=models.CASCADE, db_constraint=False,
                                  related_name="salience_row")
    salience = models.FloatField()
    computed_at = models.DateTimeField()
    # The heap page the memory's row was on when the pass computed this. A locality hint, never
    # trusted: a batch of the pass (a range of heap pages) reads the stored saliences of its range
    # with one index range scan instead of one primary-key probe per row (half the pass's read
    # cost). A row that has moved since is simply not found there and gets written again, with its
    # new page. Unchanged on most rewrites, so those stay HOT.
    heap_block = models.IntegerField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["heap_block"], name="memories_salience_heap_block")]


class ErasureCertificate(models.Model):
    """The written proof of one erasure (a whole stack, or one memory) — docs/architecture.md §9.
    It names what was erased by counts and ids only: never memory text.

    `digest` is an HMAC over the canonical JSON of the certificate's fields (memories.governance.erasure), so
    anyone holding the certificate can have it checked later; a changed field no longer verifies.
    """

    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"  # `counts` holds what is erased so far
        DONE = "done"
        FAILED = "failed"

    class Scope(models.TextChoices):
        STACK = "stack"
        MEMORY = "memory"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey("accounts.Organization", on_delete=models.CASCADE,
                                     related_name="erasure_certificates")
    # The stack row stays (archived) after a stack erasure; SET_NULL keeps the proof should it
    # ever be deleted, with its identifiers copied below.
    stack = models.ForeignKey("stacks.Stack", null=True, on_delete=models.SET_NULL, related_name="+")
    stack_ref = models.IntegerField()  # the stack's id, kept even if the row goes
    stack_slug = models.CharField(max_length=100)
    scope = models.CharField(max_length=16, choices=Scope.choices)
    memory_ref = models.UUIDField(null=True, blank=True)  # scope=memory: the erased memory's id
    requested_by = models.TextField()
    erased_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    erased_by_label = models.CharField(max_length=254)  # the admin's email when it was erased
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    counts = models.JSONField(default=dict, blank=True)
    requested_at = models.DateTimeField(auto_now_add=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    digest = models.CharField(max_length=64, blank=True, default="")

    class Meta:
        indexes = [models.Index(fields=["stack_ref", "scope", "status"], name="memories_erasure_stack")]


class ErasedRecord(models.Model):
    """A tombstone of an erased memory, as an id only: SHA-256 of "<kind>:<record_id>" per stack.

    The sync engine refuses a push naming one (memories.sync.engine), so a device holding an old copy
    cannot bring erased memories back with their record ids; the hash keeps no client-chosen text.
    """

    stack = models.ForeignKey("stacks.Stack", on_delete=models.CASCADE, related_name="+")
    key_hash = models.CharField(max_length=64)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["stack", "key_hash"], name="memories_erasedrecord_unique")]


class StackDailyActivity(models.Model):
    """How many memories one stack's writers created or changed (content) on one UTC day.

    The rollup behind the dashboard's "memories written per day": the write kernel adds to it in
    the writing transaction, in the same statement that moves the stack's counters
    (memories.writes.rows.counters_statement), so a chart over a school's last 30 days reads at most
    stacks x 30 small rows instead of grouping a million memories. Per stack, not per school: every
    writer of a stack already holds that stack's lock, so the row is never contended, whereas one
    row per school would serialise all of a school's concurrent pushes on it.
    """

    # No index of its own: the unique (stack, day) index serves every lookup by stack.
    stack = models.ForeignKey("stacks.Stack", on_delete=models.CASCADE, related_name="daily_activity",
                              db_index=False)
    day = models.DateField()
    written = models.IntegerField(default=0)

    class Meta:
        verbose_name_plural = "stack daily activity"
        constraints = [models.UniqueConstraint(fields=["stack", "day"], name="memories_activity_stack_day")]


class ChangeEvent(models.Model):
    """One committed write to one stack, for live pages and webhooks: the transactional outbox of
    memories.writes.outbox, published by memories.changes (docs/architecture.md §11).

    Inserted by the writer inside its own transaction (a rolled-back write leaves none), one per
    transaction, stack and topic, however many memories it names; published after commit and then
    stamped `published_at`, or re-published later by `memories.tasks.events_relay`. `seq` is the
    highest `change_seq` the write stamped on the stack's rows, or a fresh value of the same
    sequence for writes that stamp none (checkpoint, boot config, purge, erasure, embedding), so a
    stack's events are ordered by it and a consumer resumes with "events after seq N".
    """

    id = models.BigAutoField(primary_key=True)
    # No index of its own: (stack, seq) below serves every lookup by stack. No database constraint
    # either: its check would take a KEY SHARE lock on the stack row, which writers that lock
    # memory rows first (TTL purge, the embedding job) would then wait for behind a push holding
    # the stack FOR UPDATE while it waits for their rows — a deadlock. Django still cascades.
    stack = models.ForeignKey("stacks.Stack", on_delete=models.CASCADE, related_name="+", db_index=False,
                              db_constraint=False)
    seq = models.BigIntegerField()
    topic = models.CharField(max_length=16)  # memory | checkpoint | boot_config
    action = models.CharField(max_length=32)  # create | update | forget | … | batch (several in one write)
    source = models.CharField(max_length=32)  # api | sync | ingest | decay | ttl | embedding | …
    memory_ids = ArrayField(models.TextField(), default=list, blank=True)
    created_at = models.DateTimeField(default=timezone_now)
    published_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["stack", "seq"], name="memories_event_stack_seq"),
            # What the relay scans: only the (few) events not yet published.
            models.Index(fields=["id"], name="memories_event_unpublished", condition=Q(published_at__isnull=True)),
            models.Index(fields=["created_at"], name="memories_event_created"),
        ]

    def __str__(self) -> str:
        return f"{self.topic}.{self.action}@{self.seq}"


class MemoryAccess(models.Model):
    """Who was served which memories of a stack: one row per request that served memory content
    (search, load, get, list, MEMORY.md, export, pull, MCP, dashboard, live pages, webhooks), with
    the ids as an array and never any text (docs/privacy.md "Access log"). Written after the
    response is produced; purged after the school's `access_log_retention_days` by the TTL job.
    """

    id = models.BigAutoField(primary_key=True)
    stack = models.ForeignKey("stacks.Stack", on_delete=models.CASCADE, related_name="+")
    at = models.DateTimeField(default=timezone_now)
    path = models.CharField(max_length=32)  # search | load | get | list | memory_md | export | pull | mcp | …
    # Who was served (accounts.authors.Author.as_json()); the columns below repeat what filters need.
    author = models.JSONField(default=dict, blank=True)
    agent = models.CharField(max_length=100, blank=True, default="")
    key_id = models.CharField(max_length=64, blank=True, default="")
    user_id = models.BigIntegerField(null=True, blank=True)
    memory_ids = ArrayField(models.UUIDField(), default=list, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["stack", "-at"], name="memories_access_stack_at"),
            GinIndex(fields=["memory_ids"], name="memories_access_memory_ids"),
            models.Index(fields=["at"], name="memories_access_at"),
        ]

    def __str__(self) -> str:
        return f"{self.path}@{self.at:%Y-%m-%d %H:%M}"
