"""The shapes MemoryHub answers with: thin TypedDicts over the JSON, named after the OpenAPI
document's components (``/api/schema/``).

One source of truth: ``SCHEMA_COMPONENTS`` maps each component to its TypedDict here, and the
service's test suite (tests/clients/test_python_client.py) reads the live schema and fails when
a key, its type, or whether it is required differ. Dates stay ISO 8601 strings, as sent.
A key the schema marks optional is in a ``total=False`` part.
"""

from __future__ import annotations

from typing import Any, TypedDict


class Author(TypedDict, total=False):
    """Who wrote a memory or made a change; members not known are left out."""

    path: str
    key_id: str
    key_name: str
    user_id: int
    user: str
    agent: str


class Revision(TypedDict):
    version: int
    action: str
    source: str
    reason: str
    author: Author
    created_at: str


class Memory(TypedDict):
    """A memory of any kind: the kind's own fields are in ``data``, yours in ``extra``."""

    id: str
    kind: str
    record_id: str
    text: str
    data: Any
    extra: Any
    tags: list[str]
    confidence: float
    source_type: str
    source_entity: str
    derived_from: list[str]
    source_episodes: list[str]
    emotional_valence: float
    emotional_arousal: float
    emotional_tags: list[str]
    subject_ids: list[str]
    access_grants: list[str]
    consent_grants: list[str]
    strength: float
    times_accessed: int
    last_accessed: str | None
    is_protected: bool
    forgotten: bool
    forgotten_at: str | None
    forgotten_reason: str
    expires_at: str | None
    version: int
    created_at: str
    updated_at: str
    size_bytes: int
    awaiting_embedding: bool
    redaction_report: Any
    written_by: Author


class MemoryDetail(Memory):
    """One memory read on its own: with its newest revisions and their authors."""

    revisions: list[Revision]


class MemoryBatchResult(TypedDict):
    created: int
    memories: list[Memory]


class SearchHit(TypedDict):
    """One search result, with why it ranked where it did (the explanation fields)."""

    id: str
    record_id: str
    stack: str
    kind: str
    text: str
    tags: list[str]
    confidence: float
    created_at: str
    score: float
    combined_score: float
    fused_score: float
    keyword_score: float | None
    semantic_score: float | None
    match_type: str
    retention: float
    boosts: dict[str, Any]
    context_of: str | None


class SearchResponse(TypedDict):
    legs: dict[str, Any]
    results: list[SearchHit]
    query: str
    total: int
    method: str
    embedding_model: str
    took_ms: float
    timings_ms: dict[str, Any]


class LoadCheckpoint(TypedDict):
    id: int
    task: str
    created_at: str
    saved_at: str | None
    pending: list[str]
    text: str
    tokens: int
    truncated: bool
    warnings: list[dict[str, Any]]


class LoadedMemory(TypedDict):
    id: str
    kind: str
    record_id: str
    text: str
    score: float
    tokens: int
    truncated: bool
    created_at: str
    details: dict[str, Any]


class LoadEcho(TypedDict):
    id: str
    kind: str
    hint: str
    score: float


class LoadMeta(TypedDict):
    budget_total: int
    budget_used: int
    excluded_count: int
    item_chars: int


class LoadResult(TypedDict):
    """A budget-aware load: the checkpoint, boot config, then memories by priority."""

    checkpoint: LoadCheckpoint | None
    boot_config: dict[str, Any]
    memories: list[LoadedMemory]
    echoes: list[LoadEcho]
    meta: LoadMeta
    generated_at: str


class Checkpoint(TypedDict):
    id: int
    task: str
    progress: str
    next_step: str
    blocker: str
    context: Any
    pending: Any
    saved_at: str | None
    episode_record_id: str
    created_at: str
    age_seconds: int
    warnings: list[dict[str, Any]]


class BootConfigEntry(TypedDict):
    key: str
    value: str
    updated_at: str


class SmartIngestResponse(TypedDict):
    """What smart ingest decided (create / reinforce / update / supersede) and the memory."""

    decision: str
    memory: dict[str, Any]
    similarity: float | None
    measure: str
    prediction_error: float
    target_id: str | None
    reason: str
    forced: bool
    contradiction: bool
    considered: list[dict[str, Any]]


class MemoryCard(TypedDict):
    title: str
    summary_bullets: list[str]
    decisions: list[str]
    todos: list[str]
    entities: list[str]
    keywords: list[str]
    notable_quotes: list[str]
    tags: list[str]


class SessionStored(TypedDict):
    """A session stored as an episode, with its memory card (a searchable note)."""

    card: MemoryCard
    episode: Memory
    card_memory: Memory
    redaction: list[dict[str, Any]]
    stored: bool
    raw_export: bool


class SessionDryRun(TypedDict):
    card: MemoryCard
    session: dict[str, Any]
    redaction: list[dict[str, Any]]
    stored: bool
    raw_export: bool


class NativeChange(TypedDict):
    """One change of a pull: an ``upsert`` with the record in ``data``, or a tombstone."""

    op: str
    id: str
    kind: str | None
    record_id: str | None
    version: int | None
    client_version: int | None
    created_at: str | None
    updated_at: str | None
    server_updated_at: str
    forgotten: bool
    forgotten_at: str | None
    reason: Any
    data: dict[str, Any]


class NativePullResponse(TypedDict):
    changes: list[NativeChange]
    next_cursor: str
    has_more: bool


class NativeOpError(TypedDict):
    code: str
    message: str
    fields: dict[str, Any]


class _NativeOpResultRequired(TypedDict):
    index: int
    kind: str | None
    record_id: str | None
    status: str


class NativeOpResult(_NativeOpResultRequired, total=False):
    version: int
    error: NativeOpError


class NativePushResponse(TypedDict):
    results: list[NativeOpResult]
    applied: int
    rejected: int
    server_time: str


class Stack(TypedDict):
    stack_id: str
    display_name: str
    kind: str
    status: str
    memory_count: int
    bytes_used: int
    last_sync_at: str | None
    created_at: str
    updated_at: str
    archived_at: str | None


class KeySummary(TypedDict):
    id: str
    key_id: str
    name: str
    key_prefix: str
    stack_id: str | None
    read_only: bool
    stack_agent: bool
    issued_by_key: str | None
    created_at: str
    last_used_at: str | None
    expires_at: str | None
    revoked_at: str | None
    is_active: bool


class KeyCreated(KeySummary):
    """A new key: ``key`` is the secret, shown this once."""

    key: str
    api_key: str


class KeyCycled(KeyCreated):
    old_key_id: str
    new_key: dict[str, Any]


# OpenAPI component name → the TypedDict that mirrors it (checked against the live schema).
SCHEMA_COMPONENTS: dict[str, type] = {
    "Author": Author, "Revision": Revision, "Memory": Memory, "MemoryDetail": MemoryDetail,
    "MemoryBatchResult": MemoryBatchResult, "SearchHit": SearchHit, "SearchResponse": SearchResponse,
    "LoadCheckpoint": LoadCheckpoint, "LoadedMemory": LoadedMemory, "LoadEcho": LoadEcho, "LoadMeta": LoadMeta,
    "LoadResult": LoadResult, "Checkpoint": Checkpoint, "BootConfigEntry": BootConfigEntry,
    "SmartIngestResponse": SmartIngestResponse, "MemoryCard": MemoryCard, "SessionStored": SessionStored,
    "SessionDryRun": SessionDryRun, "NativeChange": NativeChange, "NativePullResponse": NativePullResponse,
    "NativeOpError": NativeOpError, "NativeOpResult": NativeOpResult, "NativePushResponse": NativePushResponse,
    "Stack": Stack, "KeySummary": KeySummary, "KeyCreated": KeyCreated, "KeyCycled": KeyCycled,
}
