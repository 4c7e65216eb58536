"""The words and limits of a memory record: the kinds, the wire tables, the size limits, the closed
vocabularies and the keys only the server sets (docs/kernle-protocol.md §3.3, §3.7).

Plain values, imported by the rest of the records room and by whoever needs a limit.
"""

from __future__ import annotations

# Kinds are spelled here as plain strings so this module imports nothing from Django models.
KINDS = ("raw", "episode", "note", "belief", "value", "goal", "drive", "relationship", "playbook")

# Wire tables (docs/kernle-protocol.md §3.3) → kind.
KIND_FOR_TABLE = {
    "episodes": "episode", "notes": "note", "beliefs": "belief", "values": "value",
    "agent_values": "value", "goals": "goal", "drives": "drive", "relationships": "relationship",
    "playbooks": "playbook", "raw_captures": "raw", "raw_entries": "raw",
}

SHORT = 200          # names, types, labels
MEDIUM = 2_000       # titles, statements of identity
LONG = 20_000        # free text (objective, outcome, statement, content, description)
RAW_MAX = 100_000    # a raw capture
LIST_ITEMS = 500     # items in any list field: kernle unions lists up to 500 (MAX_SYNC_ARRAY_SIZE)
ITEM_MAX = 2_000     # one list item
EXTRA_MAX_BYTES = 64 * 1024
MEMORY_MAX_BYTES = 256 * 1024  # the whole stored record; larger is refused (413)

SOURCE_TYPES = frozenset({
    "direct_experience", "inference", "external", "consolidation", "processing", "seed",
    "observation", "imported", "unknown", "promotion", "api", "ingest", "",
})
GOAL_STATUSES = frozenset({
    "active", "done", "dropped", "completed", "paused", "abandoned", "achieved", "blocked",
    "cancelled", "pending", "in_progress", "archived",
})
GOAL_PRIORITY_LABELS = {"low": 25, "medium": 50, "high": 75, "urgent": 90, "critical": 100}

# Keys a client can never set; dropped, not kept in `extra` (docs/kernle-protocol.md §3.7).
SERVER_CONTROLLED = frozenset({
    "id", "stack_id", "agent_ref", "agent_id", "deleted", "version", "embedding", "synced_at",
    "server_updated_at", "cloud_synced_at", "is_forgotten", "forgotten_at", "forgotten_reason",
    "change_seq", "embedding_model", "embedded_version", "stability", "difficulty", "salience",
    "last_reviewed_at", "size_bytes", "kind", "record_id", "deleted_at", "search_vector", "text",
    "owner", "stack", "redaction_report",
})

# The signature of a kernle checkpoint saved as an episode (`kernle checkpoint save`, kernle/core/checkpoint.py):
# both tags and an objective starting with the prefix. Such an episode also saves the stack's
# checkpoint (memories.sync.checkpoints) and is left out of load's episodes (docs/kernle-protocol.md §3.12).
CHECKPOINT_EPISODE_TAGS = ("checkpoint", "working_state")
CHECKPOINT_OBJECTIVE_PREFIX = "[CHECKPOINT]"
# kernle's outcome when the checkpoint had no context: not worth keeping as the checkpoint's context.
CHECKPOINT_DEFAULT_OUTCOME = "Working state checkpoint"
