"""The Celery beat schedule, in code: periodic jobs and how often they run."""

from __future__ import annotations

from typing import Any

BEAT_SCHEDULE: dict[str, dict[str, Any]] = {}
