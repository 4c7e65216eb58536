"""The sync room's wire protocol: what kernle and native clients send and get back, as data.

* the vocabulary (wire tables ↔ memory kinds, the keys sync interprets itself, the limits);
* parsing one wire operation into a `SyncOp` (kernle's and the native format), validated through
  the write kernel's `prepare_memory`, so a bad operation becomes that operation's rejection;
* the engine's per-operation outcome (`OpResult`), the opaque native cursor, and the errors a
  stack a key cannot reach turns into;
* `db_now`: the one clock of a sync (the database's, read after the stack lock).

Parsing is hand-written rather than DRF serializers: it runs for every operation of a push of 1,000
on the request path (bench/sync.py), and a rejected operation must become a per-operation conflict,
never a 400 for the whole request.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection

from accounts.models import Organization
from accounts.principal import Principal
from memories.models import MemoryKind
from memories.privacy.redaction.engine import SensitiveIdentifier, refuse_sensitive_identifier
from memories.privacy.redaction.policy import RedactionPolicy
from memories.records.cleaning import NOT_UNICODE, has_lone_surrogate, parse_timestamp
from memories.records.normalize import NormalizedMemory
from memories.records.vocabulary import KIND_FOR_TABLE, LIST_ITEMS
from memories.writes.hooks import prepare_memory
from memoryhub.errors import DomainError, InvalidInput, NotFound, PayloadTooLarge, Unprocessable, utf8_encodable
from memoryhub.pagination import invalid_cursor
from stacks.models import Stack

# --- wire vocabulary ---------------------------------------------------------------------------------

# Tables a kernle push may name (docs/kernle-protocol.md §3.3); `agent_values` is an alias of `values`.
PUSH_TABLES = {table: kind for table, kind in KIND_FOR_TABLE.items() if table != "raw_entries"}
# Tables a 0.15.0 client can apply on pull (§4.2): never raw captures.
PULL_TABLE_FOR_KIND = {
    MemoryKind.EPISODE: "episodes", MemoryKind.NOTE: "notes", MemoryKind.BELIEF: "beliefs",
    MemoryKind.VALUE: "values", MemoryKind.GOAL: "goals", MemoryKind.DRIVE: "drives",
    MemoryKind.RELATIONSHIP: "relationships", MemoryKind.PLAYBOOK: "playbooks",
}
UPSERT_OPERATIONS = frozenset({"update", "insert", "upsert"})

# kernle's SYNC_ARRAY_FIELDS (§3.8): merged as set unions on both sides of a sync.
ARRAY_FIELDS: dict[str, tuple[str, ...]] = {
    MemoryKind.EPISODE: ("lessons", "tags", "emotional_tags", "source_episodes", "derived_from", "context_tags"),
    MemoryKind.NOTE: ("tags", "source_episodes", "derived_from", "context_tags"),
    MemoryKind.BELIEF: ("source_episodes", "derived_from", "context_tags"),
    MemoryKind.VALUE: ("source_episodes", "derived_from", "context_tags"),
    MemoryKind.GOAL: ("source_episodes", "derived_from", "context_tags"),
    MemoryKind.RELATIONSHIP: ("source_episodes", "derived_from", "context_tags"),
    MemoryKind.DRIVE: ("focus_areas", "source_episodes", "derived_from", "context_tags"),
    MemoryKind.PLAYBOOK: ("trigger_conditions", "failure_modes", "recovery_steps", "source_episodes", "tags"),
    MemoryKind.RAW: (),
}
# kernle caps unions at 500 (MAX_SYNC_ARRAY_SIZE); our schema accepts at most LIST_ITEMS per list,
# so a union is capped at the smaller of the two — a merge must never make a record invalid.
ARRAY_CAP = min(500, LIST_ITEMS)

# Keys the sync engine interprets itself and never hands to the schema as client data.
_SYNC_KEYS = frozenset({"version", "deleted", "is_forgotten", "forgotten_at", "forgotten_reason",
                        "local_updated_at", "cloud_synced_at", "id", "stack_id"})
# Timestamp-valued keys kept inside `data`; a naive one is stored with an explicit UTC offset, because
# we echo it on pull and the client cannot compare naive and aware datetimes (§4.2).
_NAIVE_ISO = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?$")
_TIMESTAMP_KEYS = ("last_verified", "last_interaction", "updated_at", "last_used", "captured_at", "timestamp",
                   "last_accessed", "expires_at")
# A 0.15.0 device fails to apply these without their natural key (§3.9, §4.3).
REQUIRED_FOR_PULL = {MemoryKind.DRIVE: "drive_type", MemoryKind.RELATIONSHIP: "entity_name",
                     MemoryKind.PLAYBOOK: "name"}

CLIENT_FORGET_REASON = "client_forget"
# The most operations one push may carry, in either wire format (docs/kernle-protocol.md §3.1, §7.3).
# kernle==0.15.0 sends at most 100 per `sync push` (its --limit default) and 1,000 per `sync full`
# (`get_queued_changes(limit=1000)` in kernle/cli/commands/sync.py): the cap refuses nothing the
# client sends on its own. Above it a push is refused whole, before the stack is locked: a body of
# tiny operations fits the 16 MiB body limit tens of thousands of times over, and each costs a
# parse, a row and a result held for the whole request.
PUSH_MAX_OPERATIONS = 1000
NATIVE_PAGE_DEFAULT = 500
NATIVE_PAGE_MAX = 1000
RECORD_ID_MAX = 200
_CURSOR_PREFIX = "c1:"


# --- the engine's input and output -------------------------------------------------------------------

@dataclass
class SyncOp:
    """One parsed operation, wire-format independent."""

    index: int
    kind: str
    record_id: str
    delete: bool
    payload: dict[str, Any] = field(default_factory=dict)  # client data minus sync/server keys
    client_updated_at: datetime | None = None
    client_version: int | None = None
    created_at: datetime | None = None
    wants_delete: bool = False  # `data.deleted == true` on an update: a soft delete
    wants_forget: bool = False  # strength 0.0 or legacy is_forgotten
    normalized: NormalizedMemory | None = None


@dataclass
class OpResult:
    index: int
    ok: bool
    error: str = ""
    code: str = ""
    fields: dict[str, Any] = field(default_factory=dict)
    version: int | None = None


# --- parsing -----------------------------------------------------------------------------------------

class OpRejected(Exception):
    """One operation is refused (a per-operation conflict); the rest of the push goes on."""

    def __init__(self, message: str, *, code: str = "invalid", fields: dict[str, Any] | None = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.fields = fields or {}


def _record_id(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise OpRejected("missing or invalid record_id", fields={"record_id": ["Must be a string."]})
    record_id = str(value).strip()
    if not record_id or len(record_id) > RECORD_ID_MAX or "\x00" in record_id:
        raise OpRejected("missing or invalid record_id",
                         fields={"record_id": [f"1-{RECORD_ID_MAX} characters, no null bytes."]})
    if has_lone_surrogate(record_id):
        raise OpRejected("missing or invalid record_id", fields={"record_id": [NOT_UNICODE]})
    return record_id


def _client_version(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int) and -(2**31) <= value < 2**31:
        return value
    if isinstance(value, float) and value.is_integer() and -(2**31) <= value < 2**31:
        return int(value)
    return None


def _prepare_upsert(op: SyncOp, data: Any, op_time: Any, now: datetime, redaction: RedactionPolicy) -> None:
    """Interpret the sync keys of `data`, strip server-controlled fields, validate through the schema."""
    if not isinstance(data, dict):
        raise OpRejected("Missing data for insert/update", fields={"data": ["Must be an object."]})
    try:  # a record id is stored and returned as sent: one holding a secret is refused (a delete may name it)
        refuse_sensitive_identifier(op.record_id, field="record_id")
    except SensitiveIdentifier as exc:
        raise OpRejected(exc.message, code=exc.code, fields=exc.fields) from None
    op.client_version = _client_version(data.get("version"))
    op.wants_delete = data.get("deleted") is True
    strength = data.get("strength")
    op.wants_forget = data.get("is_forgotten") is True or (
        isinstance(strength, (int, float)) and not isinstance(strength, bool) and strength == 0.0)
    op.client_updated_at = (parse_timestamp(data.get("local_updated_at")) or parse_timestamp(op_time) or now)
    op.created_at = parse_timestamp(data.get("created_at"))
    op.payload = {k: v for k, v in data.items() if k not in _SYNC_KEYS}
    for key in _TIMESTAMP_KEYS:
        value = op.payload.get(key)
        if isinstance(value, str) and _NAIVE_ISO.match(value):
            # Stored with an explicit offset, so every later pull echoes an aware timestamp (§4.2).
            op.payload[key] = value + "+00:00"
    op.normalized = normalize_payload(op.kind, op.payload, redaction)


def normalize_payload(kind: str, payload: dict[str, Any], redaction: RedactionPolicy) -> NormalizedMemory:
    """A record's payload made storable (the kernel's `prepare_memory`, under the stack's school's
    redaction policy), or the operation's rejection."""
    try:
        # A drive / relationship / playbook without its natural key is stored, not refused: it is
        # the device's data. It is only kept out of kernle pulls (§3.9, `_APPLIABLE_SQL`).
        return prepare_memory(kind, payload, redaction=redaction, natural_key_optional=True)
    except (InvalidInput, PayloadTooLarge, Unprocessable) as exc:  # Unprocessable: a CRITICAL secret
        raise OpRejected(_describe(exc), code=exc.code, fields=exc.fields) from None


def _describe(exc: DomainError) -> str:
    """A conflict reason the CLI shows verbatim: the message plus the offending fields."""
    if not exc.fields:
        return exc.message
    parts = []
    for name, messages in exc.fields.items():
        text = "; ".join(str(m) for m in messages) if isinstance(messages, list) else str(messages)
        parts.append(f"{name}: {text}")
    return f"{exc.message} ({', '.join(parts)})"


def wire_key(raw_op: Any) -> tuple[Any, Any, Any]:
    """(table, record_id, operation) of a raw kernle operation, each None when unusable: for answers.

    Echoed strings are made UTF-8-encodable: a lone surrogate in a name the client sent would
    otherwise make the whole response unrenderable (one operation's defect stays its own)."""
    if not isinstance(raw_op, dict):
        return None, None, None
    table = raw_op.get("table")
    record_id = raw_op.get("record_id")
    operation = raw_op.get("operation")
    return (utf8_encodable(table) if isinstance(table, str) else None,
            utf8_encodable(record_id) if isinstance(record_id, (str, int)) and not isinstance(record_id, bool)
            else None,
            utf8_encodable(operation) if isinstance(operation, str) else None)


def parse_kernle_op(index: int, raw: Any, now: datetime, redaction: RedactionPolicy) -> SyncOp:
    if not isinstance(raw, dict):
        raise OpRejected("operation must be an object")
    table = raw.get("table")
    kind = PUSH_TABLES.get(table) if isinstance(table, str) else None
    if kind is None:
        raise OpRejected("unsupported table", code="unsupported_table")
    operation = raw.get("operation")
    operation = operation.lower() if isinstance(operation, str) else operation
    if operation != "delete" and operation not in UPSERT_OPERATIONS:
        raise OpRejected(f"unsupported operation {operation!r}", code="unsupported_operation")
    op = SyncOp(index=index, kind=kind, record_id=_record_id(raw.get("record_id")), delete=operation == "delete")
    if not op.delete:
        if raw.get("data") is None:
            raise OpRejected("Missing data for insert/update", code="missing_data")
        _prepare_upsert(op, raw.get("data"), raw.get("local_updated_at"), now, redaction)
    return op


def parse_native_op(index: int, raw: Any, now: datetime, redaction: RedactionPolicy) -> SyncOp:
    if not isinstance(raw, dict):
        raise OpRejected("An operation must be an object.")
    kind = raw.get("kind")
    if kind not in MemoryKind.values:
        raise OpRejected("Unknown memory kind.", code="unsupported_kind",
                         fields={"kind": [f"One of: {', '.join(MemoryKind.values)}."]})
    action = raw.get("op", "upsert")
    if action not in ("upsert", "delete"):
        raise OpRejected("Unknown operation.", code="unsupported_operation", fields={"op": ["upsert or delete."]})
    op = SyncOp(index=index, kind=kind, record_id=_record_id(raw.get("record_id")), delete=action == "delete")
    if not op.delete:
        if raw.get("data") is None:
            raise OpRejected("An upsert needs data.", code="missing_data", fields={"data": ["Required."]})
        _prepare_upsert(op, raw.get("data"), raw.get("updated_at"), now, redaction)
    return op


def push_operations(operations: Any) -> list[Any]:
    """The operations of a push, either wire format, checked as a whole before anything is read.

    Not a list: 400 `invalid_operations`. More than PUSH_MAX_OPERATIONS: 413 `too_many_operations`
    with the limit in `fields.max_operations` (docs/kernle-protocol.md §3.2, §8). A 4xx is final for
    the kernle CLI: it prints the answer, keeps the changes queued and does not retry on its own."""
    if not isinstance(operations, list):
        raise InvalidInput("operations must be a list.", code="invalid_operations",
                           fields={"operations": ["Must be a list."]})
    if len(operations) > PUSH_MAX_OPERATIONS:
        raise PayloadTooLarge(
            f"At most {PUSH_MAX_OPERATIONS:,} operations per push (got {len(operations):,}): "
            f"send them in batches of at most {PUSH_MAX_OPERATIONS:,}.",
            code="too_many_operations",
            fields={"operations": [f"At most {PUSH_MAX_OPERATIONS:,} operations (got {len(operations):,})."],
                    "max_operations": PUSH_MAX_OPERATIONS, "received": len(operations)})
    return operations


# --- the native cursor -----------------------------------------------------------------------------------

def cursor_encode(change_seq: int) -> str:
    return base64.urlsafe_b64encode(f"{_CURSOR_PREFIX}{change_seq}".encode()).decode().rstrip("=")


def cursor_decode(cursor: str | None) -> int:
    """0 for "from the beginning" (absent or empty); anything we did not issue is the API's one
    refusal of a cursor, 400 `invalid_cursor` (memoryhub.pagination), never a restart."""
    if not cursor:
        return 0
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        text = base64.b64decode(padded.encode("ascii"), altchars=b"-_", validate=True).decode("ascii")
    except (ValueError, UnicodeError, binascii.Error):
        raise invalid_cursor() from None
    digits = text[len(_CURSOR_PREFIX):]
    # Exactly what cursor_encode writes: the prefix and ASCII digits of a change_seq (a bigint).
    if not text.startswith(_CURSOR_PREFIX) or not (digits.isascii() and digits.isdigit()) or int(digits) >= 2**63:
        raise invalid_cursor()
    return int(digits)


# --- stacks a key cannot reach, and the clock ---------------------------------------------------------------

def bound_slug(principal: Principal) -> str | None:
    """The slug of the stack a stack-bound key is bound to (None for an unbound credential)."""
    if principal.bound_stack_id is None:
        return None
    return Stack.objects.filter(pk=principal.bound_stack_id).values_list("slug", flat=True).first()


def not_reachable(principal: Principal, slug: str, *, push: bool = False) -> NotFound:
    """The 404 for a stack this credential cannot reach, naming the bound stack when that is why, and
    (`push`) for a school's writable school-wide key, the setting that would create the stack on its
    first push (docs/kernle-protocol.md §3.4)."""
    bound = bound_slug(principal)
    if bound is not None and bound != slug:
        return NotFound(f"This key is bound to stack '{bound}' and cannot reach stack '{slug}'.",
                        code="stack_not_reachable", fields={"stack_id": ["Not reachable with this key."]})
    if (push and principal.is_key and bound is None and not principal.read_only
            and principal.organization.kind == Organization.Kind.SCHOOL):
        return NotFound(f"Stack '{slug}' not found. A school key creates a student's stack on its first push "
                        "only when the school's admins turn on `provision_stacks_on_push` (dashboard: Privacy "
                        "page, \"Create students' stacks on first push\"; API: PUT /api/v1/privacy); otherwise an "
                        "admin adds the student first.",
                        code="stack_not_found", fields={"stack_id": ["Not found."]})
    return NotFound(f"Stack '{slug}' not found.", code="stack_not_found", fields={"stack_id": ["Not found."]})


def db_now() -> datetime:
    """The database clock: one clock for every web process, read after the stack lock."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        value: datetime = cursor.fetchone()[0]
    return value

