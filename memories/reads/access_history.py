"""Reading the access log: who may read a stack's log, its rows filtered, a memory's "Seen by", the
rows an archive carries, and the purge after each school's retention (docs/privacy.md "Access log").

Who may read it: the school's admins (signed in, or a school-wide key) and the stack's own
credentials (its own agent key and that key's kernle token). Anyone who cannot see the stack gets
the one access decision's 404; anyone else who can (a teacher, another key bound to the stack) a 403
`access_log_forbidden`: the log says who read a student's memories, which is the school's and the
student's business, not every reader's.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q, QuerySet
from django.utils import timezone

from accounts.models import Organization, User
from accounts.principal import Principal
from memories.models import MemoryAccess
from memoryhub.errors import Forbidden
from stacks.models import Stack
from stacks.selectors import stack_for_principal

ACCESS_PURGE_BATCH = 5_000
SEEN_BY_LIMIT = 50


def may_read_access_log(principal: Principal, stack: Stack) -> bool:
    """The rule above, for a stack the caller already reaches through `stack_for_principal`."""
    if principal.is_org_wide:
        return True
    return principal.is_stack_agent and principal.bound_stack_id == stack.pk


def stack_for_access_log(principal: Principal, slug: str) -> Stack:
    """The stack whose access log `principal` asks for: 404 when it cannot see the stack, 403 when it
    may see the stack but not who read it."""
    stack = stack_for_principal(principal, slug)
    if not may_read_access_log(principal, stack):
        raise Forbidden("Only school admins and the stack's own credentials may read its access log.",
                        code="access_log_forbidden")
    return stack


def _person_filter(person: str) -> Q:
    """A `usr_…` id or an e-mail address → the rows of that person (nobody of that name: no rows).
    Only rows of the one stack are filtered, so naming someone reveals nothing about them."""
    lookup = Q(public_id=person) if person.startswith("usr_") else Q(email__iexact=person)
    return Q(user_id__in=list(User.objects.filter(lookup).values_list("pk", flat=True)[:1]))


def access_log_rows(*, stack: Stack, memory: uuid.UUID | None = None, agent: str | None = None,
                    person: str | None = None, path: str | None = None, since: datetime | None = None,
                    until: datetime | None = None) -> QuerySet[MemoryAccess]:
    """A stack's access-log rows, filtered (every filter optional; newest first once paginated)."""
    rows = MemoryAccess.objects.filter(stack_id=stack.pk)
    if memory is not None:
        rows = rows.filter(memory_ids__contains=[memory])  # the GIN index on memory_ids
    if agent is not None:
        rows = rows.filter(agent=agent)
    if person is not None:
        rows = rows.filter(_person_filter(person))
    if path is not None:
        rows = rows.filter(path=path)
    if since is not None:
        rows = rows.filter(at__gte=since)
    if until is not None:
        rows = rows.filter(at__lt=until)
    return rows.order_by("-at", "-id")


def memory_seen_by(*, stack: Stack, memory_id: uuid.UUID | str, limit: int = SEEN_BY_LIMIT) -> list[dict[str, Any]]:
    """The newest reads that served one memory: who (the reader's e-mail, key or endpoint), agent,
    path and when — the dashboard memory page's "Seen by"."""
    rows = (MemoryAccess.objects.filter(stack_id=stack.pk, memory_ids__contains=[uuid.UUID(str(memory_id))])
            .order_by("-at", "-id").values("at", "path", "author")[:limit])
    return [{"at": row["at"], "path": row["path"], "channel": row["author"].get("path", ""), "who": _who(row["author"]),
             "key_id": row["author"].get("key_id", ""), "agent": row["author"].get("agent", "")}
            for row in rows]


def _who(author: dict[str, Any]) -> str:
    """A credential by its name (a key, a webhook endpoint), a signed-in person by their e-mail."""
    if author.get("key_id"):
        return str(author.get("key_name") or author["key_id"])
    return str(author.get("user", ""))


def access_log_for_archive(*, stack: Stack) -> QuerySet[MemoryAccess]:
    """Every kept row of the stack, oldest first, for its portable archive."""
    return MemoryAccess.objects.filter(stack_id=stack.pk).order_by("at", "id")


def access_log_purge(*, now: datetime | None = None, batch_size: int = ACCESS_PURGE_BATCH) -> int:
    """Delete the rows older than their school's `access_log_retention_days`, in batches of
    `batch_size` (each its own statement, so no long lock); the number deleted."""
    now = now or timezone.now()
    deleted = 0
    for school in Organization.objects.only("pk", "access_log_retention_days").order_by("pk").iterator():
        days = school.access_log_retention_days
        if not isinstance(days, int) or days < 1:
            continue  # never purge on a value a school could not have set
        stacks = Stack.objects.filter(organization_id=school.pk).values("pk")
        selection = MemoryAccess.objects.filter(stack_id__in=stacks, at__lt=now - timedelta(days=days))
        while True:
            ids = list(selection.order_by("at").values_list("pk", flat=True)[:batch_size])
            if not ids:
                break
            count, _ = MemoryAccess.objects.filter(pk__in=ids).delete()
            deleted += count
            if len(ids) < batch_size:
                break
    return deleted
