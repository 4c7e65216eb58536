"""Reads of memories, checkpoints and boot config, with the rules every read shares, and the
access decisions of the memories API that go beyond "may this caller reach this stack".

Callers pass a stack already resolved through `stacks.selectors.stack_for_principal`.
Rules: soft-deleted rows (sync deletes) are never returned; expired rows (`expires_at <= now`)
are invisible to every read from that instant, before the purge job removes them; forgotten rows
are only returned when asked for (`forgotten="include"|"only"`). A requester other than the stack's
own credentials passes its `audience` (memories.privacy.grants.audience_for): it sees only the memories whose
privacy grants admit it, and a hidden memory is a 404 like one that does not exist.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from django.db import connection
from django.db.models import Q, QuerySet
from django.utils import timezone

from accounts.principal import Principal
from memories.models import BootConfigEntry, Checkpoint, ErasureCertificate, Memory, MemoryKind, MemoryRevision
from memories.privacy.grants import Audience, grants_filter, grants_sql
from memories.records.vocabulary import CHECKPOINT_EPISODE_TAGS, CHECKPOINT_OBJECTIVE_PREFIX
from memoryhub.database import ModelRows, uuid_array
from memoryhub.errors import Forbidden, InvalidInput, NotFound
from stacks.models import Stack
from stacks.selectors import ensure_writable, stack_for_principal, stacks_visible_to

ForgottenFilter = Literal["exclude", "include", "only"]

CHECKPOINT_STALE_AFTER = timedelta(hours=6)
GENERIC_TASK_NAMES = frozenset({
    "auto-save", "autosave", "auto save", "checkpoint", "save", "saved", "task", "work", "working",
    "untitled", "todo", "wip", "continue", "session", "none", "n/a",
})


def not_expired(now: datetime | None = None) -> Q:
    return Q(expires_at__isnull=True) | Q(expires_at__gt=now or timezone.now())


def live_q(now: datetime | None = None) -> Q:
    """Stored and unexpired (forgotten ones included): what `memories_live` keeps of a stack."""
    return Q(deleted_at__isnull=True) & not_expired(now)


def memories_live(*, stack: Stack, now: datetime | None = None, audience: Audience | None = None) -> QuerySet[Memory]:
    """The stack's stored, unexpired memories (forgotten ones included) that `audience` may see
    (None: all of them — the stack's own credentials, or a system job)."""
    return grants_filter(Memory.objects.filter(live_q(now), stack_id=stack.pk), audience)


def memory_get(*, stack: Stack, memory_id: uuid.UUID | str, audience: Audience | None = None) -> Memory:
    """One memory of the stack by id (forgotten ones too: they can be inspected and recovered).
    An id that is not a UUID names no memory, and one `audience` may not see is hidden: 404 like any other."""
    try:
        pk = memory_id if isinstance(memory_id, uuid.UUID) else uuid.UUID(memory_id)
    except (TypeError, ValueError):
        raise NotFound("Memory not found.", code="memory_not_found") from None
    memory = memories_live(stack=stack, audience=audience).filter(pk=pk).first()
    if memory is None:
        raise NotFound("Memory not found.", code="memory_not_found")
    return memory


def memories_list(*, stack: Stack, kinds: list[str] | None = None, tags: list[str] | None = None,
                  created_after: datetime | None = None, created_before: datetime | None = None,
                  forgotten: ForgottenFilter = "exclude", audience: Audience | None = None,
                  agent: str | None = None) -> QuerySet[Memory]:
    """Filtered memories of a stack that `audience` may see; `tags` matches memories carrying ALL given tags;
    `agent`: only those first written under this agent label (`written_by`, docs/privacy.md "Provenance")."""
    queryset = memories_live(stack=stack, audience=audience)
    if agent:
        queryset = queryset.filter(written_by__agent=agent)
    if kinds:
        queryset = queryset.filter(kind__in=kinds)
    if tags:
        queryset = queryset.filter(tags__contains=tags)
    if created_after is not None:
        queryset = queryset.filter(created_at__gte=created_after)
    if created_before is not None:
        queryset = queryset.filter(created_at__lt=created_before)
    if forgotten == "exclude":
        queryset = queryset.filter(forgotten_at__isnull=True)
    elif forgotten == "only":
        queryset = queryset.filter(forgotten_at__isnull=False)
    elif forgotten != "include":
        raise InvalidInput("Invalid filter.", fields={"forgotten": ["Must be exclude, include or only."]})
    return queryset


REVISIONS_SHOWN = 100


def memory_revisions(memory: Memory, *, limit: int = REVISIONS_SHOWN) -> list[MemoryRevision]:
    """The memory's newest `limit` revisions, newest first, each with its author (docs/privacy.md
    "Provenance"). The caller read `memory` through `memory_get` (access and grants decided)."""
    return list(MemoryRevision.objects.filter(memory_id=memory.pk).order_by("-created_at", "-id")[:limit])


def memory_agents(*, stack: Stack, audience: Audience | None = None) -> list[str]:
    """The agent labels the stack's memories were written under (`written_by.agent`), sorted: what
    the student page's agent filter offers. Only from memories `audience` may see."""
    labels = (memories_live(stack=stack, audience=audience).filter(written_by__has_key="agent")
              .values_list("written_by__agent", flat=True).distinct())
    return sorted({label for label in labels if isinstance(label, str) and label})


# A memory's row without its two large columns (the vector and the tsvector), under the alias `m`:
# what the written-out statements that read whole memories select and build memories from (a
# search's page and neighbours, memories.search.context; a push's stored rows, memories.sync.lookup).
MEMORY_ROWS = ModelRows(Memory, defer=("embedding", "search_vector"), table_alias="m")
_MEMORIES_BY_ID_SQL = (f"SELECT {MEMORY_ROWS.columns} FROM {MEMORY_ROWS.table}"  # noqa: S608
                       " WHERE m.stack_id = %s AND m.id = ANY(%s::uuid[])")


# `live_q`'s rule over the alias `m`, for written-out statements (a search's legs, `memories_named`);
# its one named parameter is `now`.
LIVE_SQL = "m.deleted_at IS NULL AND (m.expires_at IS NULL OR m.expires_at > %(now)s)"


def memories_named(*, stack_id: int, ids: Sequence[uuid.UUID | str],
                   audience: Audience | None) -> list[tuple[uuid.UUID, datetime, bool]]:
    """(id, created_at, live?) of the stack's memories among `ids` whose grants admit `audience`,
    live or not (`live_q`), in no particular order: one written-out statement. A live page asks it
    for every change it renders (dashboard.live)."""
    if not ids:
        return []
    grants, params = grants_sql(audience, "m")
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT m.id, m.created_at, ({LIVE_SQL}) FROM {MEMORY_ROWS.table}"  # noqa: S608
                       f" WHERE m.stack_id = %(stack)s AND m.id = ANY(%(ids)s::uuid[]) AND {grants}",
                       {**params, "stack": stack_id, "ids": uuid_array(ids), "now": timezone.now()})
        return cursor.fetchall()


def memories_by_id(*, stack_id: int, ids: Sequence[uuid.UUID | str]) -> list[Memory]:
    """The stack's memories of these ids, in no particular order, read as MEMORY_ROWS (live or
    not, whatever their grants: the caller has narrowed `ids` to what its reader may see). One
    written-out statement: a live page reads its rows to render this way for every change."""
    with connection.cursor() as cursor:
        cursor.execute(_MEMORIES_BY_ID_SQL, [stack_id, uuid_array(ids)])
        return [MEMORY_ROWS.instance(row) for row in cursor.fetchall()]


# --- checkpoints -----------------------------------------------------------------------------------

def checkpoint_episode_q() -> Q:
    """Memories carrying kernle's checkpoint signature (both tags and the `[CHECKPOINT]` objective,
    docs/kernle-protocol.md §3.12): their checkpoint stands for them, so the dashboard's memory lists
    and load leave them out."""
    return Q(kind=MemoryKind.EPISODE, tags__contains=list(CHECKPOINT_EPISODE_TAGS),
             data__objective__startswith=CHECKPOINT_OBJECTIVE_PREFIX)


def checkpoint_latest(*, stack: Stack) -> Checkpoint | None:
    return Checkpoint.objects.filter(stack_id=stack.pk).order_by("-created_at", "-id").first()


_CHECKPOINT_ROWS = ModelRows(Checkpoint)
# The two reads a load starts with, written out and sent as one query string: `checkpoint_latest`'s
# row and the boot config in key order. tests/memories/test_load.py holds them to the querysets.
_WORKING_STATE_SQL = (
    f"SELECT {_CHECKPOINT_ROWS.columns} "  # noqa: S608 (model metadata only)
    f"FROM {_CHECKPOINT_ROWS.table} WHERE stack_id = %(stack)s ORDER BY created_at DESC, id DESC LIMIT 1; "
    f"SELECT key, value FROM {BootConfigEntry._meta.db_table} WHERE stack_id = %(stack)s ORDER BY key"
)


def working_state(*, stack: Stack) -> tuple[Checkpoint | None, list[tuple[str, str]]]:
    """The stack's latest checkpoint (`checkpoint_latest`) and its boot config as (key, value) in key
    order, in one round trip: what every load reads before it ranks memories (docs/algorithms.md §8.4).
    WHY written out: both querysets were compiled on every load, and each took a round trip."""
    with connection.cursor() as cursor:
        cursor.execute(_WORKING_STATE_SQL, {"stack": stack.pk})
        row = cursor.fetchone()
        cursor.nextset()
        boot = [(key, value) for key, value in cursor.fetchall()]
    return (None if row is None else _CHECKPOINT_ROWS.instance(row)), boot


def checkpoint_history(*, stack: Stack) -> QuerySet[Checkpoint]:
    return Checkpoint.objects.filter(stack_id=stack.pk).order_by("-created_at", "-id")


def checkpoint_context_text(checkpoint: Checkpoint) -> str:
    """The checkpoint's context as one text: a context sent as text (stored {"text": …}, docs/api.md
    "Checkpoint") is that text, any other object its JSON; "" when there is none."""
    context = checkpoint.context
    if not context:
        return ""
    if isinstance(context, dict) and set(context) == {"text"} and isinstance(context["text"], str):
        return context["text"]
    return json.dumps(context, ensure_ascii=False, sort_keys=True)


@dataclass(frozen=True)
class CheckpointWarning:
    code: str
    message: str


def checkpoint_warnings(checkpoint: Checkpoint, *, now: datetime | None = None) -> list[CheckpointWarning]:
    """Why an agent should not trust this checkpoint blindly: it is old, or says nothing."""
    now = now or timezone.now()
    warnings: list[CheckpointWarning] = []
    # From the client's own time when it told us (a kernle checkpoint synced hours after it was saved
    # is as old as the work it describes), else from when we stored it.
    age = now - (checkpoint.saved_at or checkpoint.created_at)
    if age > CHECKPOINT_STALE_AFTER:
        hours = int(age.total_seconds() // 3600)
        warnings.append(CheckpointWarning(
            "stale", f"This checkpoint is {hours} hours old; the work may have moved on since."))
    if checkpoint.task.strip().lower().rstrip(".!") in GENERIC_TASK_NAMES:
        warnings.append(CheckpointWarning(
            "generic_task", f"The task name {checkpoint.task!r} is generic; save a checkpoint that says what "
                            "you are doing."))
    return warnings


# --- boot config -----------------------------------------------------------------------------------

def boot_config_entries(*, stack: Stack) -> QuerySet[BootConfigEntry]:
    return BootConfigEntry.objects.filter(stack_id=stack.pk).order_by("key")


def boot_config_get(*, stack: Stack, key: str) -> BootConfigEntry:
    entry = BootConfigEntry.objects.filter(stack_id=stack.pk, key=key).first()
    if entry is None:
        raise NotFound("No such boot config key.", code="boot_key_not_found")
    return entry


# --- access decisions of the memories API ---------------------------------------------------------
# Which stacks a caller reaches, and whether it may write them, is stacks.selectors'; these add
# what only the memories API asks.

def ensure_may_search_across_stacks(principal: Principal) -> None:
    """Searching across stacks is for school (organization-wide) keys only: not an agent's
    stack-bound key, and not the dashboard (which searches one stack at a time)."""
    if not (principal.is_key and principal.is_org_wide):
        raise Forbidden("Only a school (organization) key may search across stacks.", code="school_key_required")


def stacks_for_school_search(principal: Principal, *, slugs: list[str]) -> list[Stack]:
    """The stacks a school key searches: those named by `slugs` (each must exist: 404 otherwise),
    or every stack of its school."""
    ensure_may_search_across_stacks(principal)
    stacks = stacks_visible_to(principal)
    if slugs:
        stacks = stacks.filter(slug__in=slugs)
    found = list(stacks.only("pk", "slug"))
    if slugs and len(found) != len(set(slugs)):
        raise NotFound("Stack not found.", code="stack_not_found")
    return found


def stack_for_kernle_search(principal: Principal, *, stack_id: str | None) -> Stack:
    """The stack kernle's `POST /memories/search` searches (docs/kernle-protocol.md §5.2): the body's
    `stack_id`, else the credential's bound stack, else the most recently pushed stack the caller
    can see. None of them → 404 "No stack to search" (the client then falls back to its local
    search instead of showing an empty answer)."""
    if stack_id:
        return stack_for_principal(principal, stack_id)
    visible = stacks_visible_to(principal)
    if principal.bound_stack_id is not None:
        bound = visible.filter(pk=principal.bound_stack_id).first()
        if bound is not None:
            return bound
    latest = visible.filter(last_sync_at__isnull=False).order_by("-last_sync_at", "-pk").first()
    if latest is None:
        raise NotFound("No stack to search", code="no_stack")
    return latest


def ensure_may_promote(principal: Principal, stack: Stack, *, auto: bool) -> None:
    """Promotion suggestions only read the stack; `auto` creates beliefs, which is a write
    (a read-only key: 403; an archived stack: 409)."""
    if auto:
        ensure_writable(principal, stack)


def job_runs_scope(principal: Principal) -> int | None:
    """Whose share of the job runs the caller sees: None for staff (every run with its service-wide
    counts), else the id of the caller's organization — a school admin (signed in, or through a
    school-wide key) sees every run with only their school's counts (memories.lifecycle.jobs.
    job_run_share), never another school's. Teachers and stack-bound keys see none (403)."""
    if principal.user.is_staff:
        return None
    if principal.is_org_wide:
        return principal.organization.pk
    raise Forbidden("Only administrators can see job runs.", code="admin_only")


def stack_for_erasure(principal: Principal, slug: str) -> Stack:
    """The stack a caller may erase (memories.governance.erasure): one they can see (else 404, by the one access
    decision), and they must be a school admin or a writable school-wide key (else 403) — never a
    teacher or a student's agent key. An archived stack may be erased."""
    stack = stack_for_principal(principal, slug)
    ensure_may_erase(principal)
    return stack


def ensure_may_erase(principal: Principal) -> None:
    if principal.read_only or not principal.is_org_wide:
        raise Forbidden("Only school admins may erase student data.", code="admin_required")


def erasure_certificates_of(principal: Principal) -> QuerySet[ErasureCertificate]:
    """The certificates of the caller's school, newest first, for its admins (none for anyone else)."""
    if not principal.is_org_wide:
        return ErasureCertificate.objects.none()
    return ErasureCertificate.objects.filter(organization_id=principal.organization.pk).order_by("-requested_at")


def erasure_certificate_get(principal: Principal, certificate_id: str) -> ErasureCertificate:
    """A certificate of the caller's school, for its admins (404 for anyone else)."""
    try:
        uuid.UUID(str(certificate_id))
    except ValueError:
        raise NotFound("Erasure certificate not found.", code="erasure_not_found") from None
    if not principal.is_org_wide:
        raise NotFound("Erasure certificate not found.", code="erasure_not_found")
    cert = (ErasureCertificate.objects.select_related("organization")
            .filter(pk=certificate_id, organization_id=principal.organization.pk).first())
    if cert is None:
        raise NotFound("Erasure certificate not found.", code="erasure_not_found")
    return cert
