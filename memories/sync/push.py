"""Push: the two entry points that write (kernle's `POST /sync/push`, the native batch push).

Each resolves and locks the stack, reads the change time from the database after the lock, parses
every operation (memories.sync.protocol), hands the parsed ones to the engine (memories.sync.engine)
and renders the per-operation outcome in its wire format. The whole push is one transaction
(`with_retry_per_record`); it is acknowledged only after it commits (the view answers after the
service returns), and embedding is queued after commit by the write kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction

from accounts.authors import Author
from accounts.models import Organization
from accounts.principal import Principal
from billing import entitlements
from memories.privacy.redaction.policy import ALL_CATEGORIES, stack_policy
from memories.sync.checkpoints import save_pushed_checkpoints
from memories.sync.engine import apply_batch, apply_native_operations, with_retry_per_record
from memories.sync.protocol import (
    OpRejected,
    OpResult,
    SyncOp,
    db_now,
    not_reachable,
    parse_kernle_op,
    push_operations,
    wire_key,
)
from memoryhub.errors import DomainError, NotFound, QuotaExceeded, utf8_encodable
from memoryhub.metrics import PUSH_OPERATIONS
from stacks.models import Stack
from stacks.selectors import stack_for_principal
from stacks.services import stack_create, stack_id_validated

# --- the stack a push writes to ----------------------------------------------------------------------------

def kernle_stack_for_push(principal: Principal, raw_slug: Any) -> tuple[Stack | None, str]:
    """Resolve and lock the stack a kernle push names (docs/kernle-protocol.md §3.4). Caller is in a transaction.

    Returns (stack, "") or, when a personal account may not provision another stack, (None, the
    quota message) so every upsert of the push becomes a conflict naming the limit (§3.10).
    A stack-bound key naming another stack, or a school key naming a stack its school does not
    have, is a 404 with a clear message and nothing is stored.
    """
    slug = stack_id_validated(raw_slug)
    try:
        return stack_for_principal(principal, slug, write=True, lock=True), ""
    except NotFound:
        if not _may_provision(principal):
            raise not_reachable(principal, slug, push=True) from None
    # Serialise provisioning per organization so two first pushes cannot both pass the stack quota.
    Organization.objects.select_for_update().filter(pk=principal.organization.pk).first()
    try:
        entitlements.ensure_can_create_stack(organization=principal.organization)
    except QuotaExceeded as exc:
        return None, exc.message
    try:
        with transaction.atomic():
            stack_create(organization=principal.organization, slug=slug, kind=_provisioned_kind(principal),
                         principal=principal)
    except DomainError:
        pass  # created concurrently by another push: lock and use it
    return stack_for_principal(principal, slug, write=True, lock=True), ""


def _may_provision(principal: Principal) -> bool:
    """An unbound, writable key of a personal account auto-provisions stacks on first push; so does a
    school's school-wide key when the school turned `provision_stacks_on_push` on (docs/kernle-protocol.md
    §3.4). Otherwise school stacks are created by the school's admins."""
    if not (principal.is_key and principal.bound_stack_id is None and not principal.read_only):
        return False
    if principal.organization.kind == Organization.Kind.PERSONAL:
        return True
    # Read from the row, not from the credential cache's copy: an admin's change counts at once.
    return Organization.objects.filter(pk=principal.organization.pk, kind=Organization.Kind.SCHOOL,
                                       provision_stacks_on_push=True).exists()


def _provisioned_kind(principal: Principal) -> str:
    """A school provisions its students' stacks; a personal account its agents'."""
    return Stack.Kind.STUDENT if principal.organization.kind == Organization.Kind.SCHOOL else Stack.Kind.AGENT


# --- kernle push ---------------------------------------------------------------------------------------

@dataclass
class KernlePushResult:
    synced: int
    conflicts: list[dict[str, Any]]
    acknowledged: list[dict[str, Any]]
    server_time: datetime


def kernle_push(*, principal: Principal, stack_id: Any, operations: Any, author: Author) -> KernlePushResult:
    """Apply a kernle push (docs/kernle-protocol.md §3) as `author` (the records' and revisions'
    provenance, docs/privacy.md "Provenance"). Whole-request errors are raised before any write
    (`operations` not a list 400, over PUSH_MAX_OPERATIONS 413, invalid stack id 400, unreachable
    stack 404, read-only key 403, archived stack 409); every other problem is one operation's conflict."""
    checked = push_operations(operations)
    return with_retry_per_record(lambda per_record: _kernle_push(principal, stack_id, checked, per_record, author))


def _kernle_push(principal: Principal, stack_id: Any, operations: list[Any], per_record: bool,
                 author: Author) -> KernlePushResult:
    stack, stack_refusal = kernle_stack_for_push(principal, stack_id)
    now = db_now()
    results: list[OpResult] = [OpResult(index=i, ok=False) for i in range(len(operations))]
    parsed: list[SyncOp] = []
    # The school's redaction choice, once for the push (no stack: its upserts are refused anyway).
    redaction = stack_policy(stack) if stack is not None else ALL_CATEGORIES
    for index, raw in enumerate(operations):
        try:
            op = parse_kernle_op(index, raw, now, redaction)
        except OpRejected as rejected:
            results[index] = OpResult(index=index, ok=False, error=rejected.message, code=rejected.code,
                                      fields=rejected.fields)
            continue
        if stack is None and not op.delete:
            results[index] = OpResult(index=index, ok=False, error=stack_refusal, code="stack_limit_reached")
            continue
        if stack is None:
            results[index] = OpResult(index=index, ok=True)  # nothing to delete in a stack that does not exist
            continue
        parsed.append(op)
    if stack is not None:
        apply_batch(stack=stack, ops=parsed, results=results, now=now, storage_limited=True, strict_quota=False,
                    per_record=per_record, author=author)
        save_pushed_checkpoints(stack=stack, operations=operations, results=results)

    conflicts: list[dict[str, Any]] = []
    acknowledged: list[dict[str, Any]] = []
    for index, raw in enumerate(operations):
        table, record_id, operation = wire_key(raw)
        if record_id is not None:
            # Every operation is acknowledged, refused ones too: kernle 0.15.0 keeps an operation
            # queued until it is acknowledged and re-sends it on every push, and no refusal of ours
            # gets better by being re-sent unchanged. A refusal is also listed in `conflicts`,
            # which the client writes into its conflict log (docs/kernle-protocol.md §3.11).
            acknowledged.append({"table": table, "record_id": str(record_id)})
        if not results[index].ok:
            conflicts.append({"table": table, "record_id": None if record_id is None else str(record_id),
                              "operation": operation, "error": results[index].error or "rejected"})
    PUSH_OPERATIONS.labels("kernle", "applied").inc(len(operations) - len(conflicts))
    PUSH_OPERATIONS.labels("kernle", "conflict").inc(len(conflicts))
    return KernlePushResult(synced=len(operations) - len(conflicts), conflicts=conflicts,
                            acknowledged=acknowledged, server_time=now)


# --- native push ---------------------------------------------------------------------------------------

@dataclass
class NativePushResult:
    results: list[dict[str, Any]]
    applied: int
    rejected: int
    server_time: datetime


def native_push(*, principal: Principal, stack_slug: str, operations: Any, author: Author) -> NativePushResult:
    """Apply up to PUSH_MAX_OPERATIONS operations to one stack, in order, each on its own, as `author`.

    Not a list: 400; more operations: 413 `too_many_operations` (the kernle push's rule). Over the
    storage quota the whole batch is refused (402 naming the limit) and nothing is stored.
    """
    checked = push_operations(operations)
    return with_retry_per_record(lambda per_record: _native_push(principal, stack_slug, checked, per_record, author))


def _native_push(principal: Principal, stack_slug: str, operations: list[Any], per_record: bool,
                 author: Author) -> NativePushResult:
    stack = stack_for_principal(principal, stack_slug, write=True, lock=True)
    now = db_now()
    results = apply_native_operations(stack=stack, operations=operations, now=now, per_record=per_record,
                                      author=author)
    save_pushed_checkpoints(stack=stack, operations=operations, results=results, native=True)
    body = []
    for index, raw in enumerate(operations):
        result = results[index]
        entry: dict[str, Any] = {
            "index": index,
            "kind": utf8_encodable(raw.get("kind")) if isinstance(raw, dict) else None,
            "record_id": wire_key(raw)[1],
            "status": "applied" if result.ok else "rejected",
        }
        if result.ok:
            entry["version"] = result.version
        else:
            entry["error"] = {"code": result.code or "invalid", "message": result.error, "fields": result.fields}
        body.append(entry)
    applied = sum(1 for r in results if r.ok)
    PUSH_OPERATIONS.labels("native", "applied").inc(applied)
    PUSH_OPERATIONS.labels("native", "conflict").inc(len(results) - applied)
    return NativePushResult(results=body, applied=applied, rejected=len(results) - applied, server_time=now)

