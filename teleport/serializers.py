"""A snapshot as the API (and the MCP tools) show it: metadata and the strip report, never content."""

from __future__ import annotations

from typing import Any

from teleport.models import Snapshot


def snapshot_view(snapshot: Snapshot) -> dict[str, Any]:
    return {"id": str(snapshot.pk), "name": snapshot.name, "stored_bytes": snapshot.stored_bytes,
            "unpacked_bytes": snapshot.unpacked_bytes, "file_count": snapshot.file_count,
            "stripped": snapshot.stripped, "stripped_count": snapshot.stripped_count,
            "created_at": snapshot.created_at.isoformat(), "expires_at": snapshot.expires_at.isoformat()}
