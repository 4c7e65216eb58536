"""Reads of the agent tools that no REST route answers yet.

`stack_stats` counts what the caller may see: the memories go through memories.selectors (the
privacy grants' predicate included), so a school key's counts never include a memory its grants
hide. The stack's own storage counter (what the quota is charged) is reported beside them.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Q, Sum

from memories.privacy.grants import Audience
from memories.selectors import memories_live
from stacks.models import Stack


def stack_stats(*, stack: Stack, audience: Audience | None) -> dict[str, Any]:
    """Live memories by kind (count and bytes, forgotten ones apart) and when the stack last changed."""
    rows = (memories_live(stack=stack, audience=audience)
            .values("kind")
            .annotate(live=Count("pk", filter=Q(forgotten_at__isnull=True)),
                      forgotten=Count("pk", filter=Q(forgotten_at__isnull=False)),
                      size=Sum("size_bytes", filter=Q(forgotten_at__isnull=True)))
            .order_by("kind"))
    by_kind = {row["kind"]: {"count": row["live"], "bytes": row["size"] or 0, "forgotten": row["forgotten"]}
               for row in rows}
    return {
        "stack": stack.slug,
        "memories": sum(kind["count"] for kind in by_kind.values()),
        "forgotten": sum(kind["forgotten"] for kind in by_kind.values()),
        "bytes": sum(kind["bytes"] for kind in by_kind.values()),
        "by_kind": by_kind,
        "storage_bytes": stack.bytes_used,
        "last_write_at": stack.last_write_at.isoformat() if stack.last_write_at else None,
        "last_sync_at": stack.last_sync_at.isoformat() if stack.last_sync_at else None,
    }
