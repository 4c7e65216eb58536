"""The Celery beat schedule, in code: periodic jobs and how often they run."""

from __future__ import annotations

from typing import Any

BEAT_SCHEDULE: dict[str, dict[str, Any]] = {}

# Embed whatever the after-commit embedding tasks missed (dead worker, broker blip, model change).
BEAT_SCHEDULE["memories-embedding-sweep"] = {
    "task": "memories.embedding_sweep",
    "schedule": 60.0,
    "options": {"expires": 55},
}
