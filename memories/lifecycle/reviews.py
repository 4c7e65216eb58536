"""Explicit reviews (a recall graded by the agent) and the stored salience side table they and
the decay pass share; the decay maths is `memories.lifecycle.decay`."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from accounts.authors import Author
from memories.lifecycle.decay import (
    FORGOTTEN_REASON_DECAY,
    DecayState,
    Grade,
    ReviewOutcome,
    memory_retrievability,
    review,
    salience,
)
from memories.models import Memory
from memories.services import memory_recover
from memories.writes.hooks import after_commit
from memories.writes.rows import locked_memory
from memoryhub.errors import Conflict, InvalidInput, NotFound

logger = logging.getLogger(__name__)

# --- explicit reviews -------------------------------------------------------------------------


@dataclass(frozen=True)
class ReviewResult:
    memory: Memory
    outcome: ReviewOutcome
    salience: float  # at `now`, after the review
    recovered: bool  # a decay tombstone was undone


@transaction.atomic
def record_review(*, memory: Memory, grade: Grade | int, now: datetime | None = None,
                  source: str = "feedback", author: Author | None = None) -> ReviewResult:
    """Record one explicit review of a memory and update its FSRS state (docs/algorithms.md §2-§3).

    Call it for explicit signals only — never for a plain read or search hit (§3.1: a read is not a
    review). Grades (`memories.lifecycle.decay.Grade`): AGAIN for a demote / a failed recall, GOOD for a
    reinforcement by smart ingest or an agent's successful recall, EASY for a recall graded easy
    (a promote is a GOOD review with a 1.5x stability floor, see search/retrieval_feedback.py).

    Effects, under a row lock: `stability` and `difficulty` move per FSRS-6 (prior stability: the
    stored one, or the kind's initial stability if never reviewed; R read at `now`);
    `last_reviewed_at = now` restarts the decay clock; the stored salience (`MemorySalience`) is
    refreshed. Decay state is server-side ranking state, so a review neither bumps `version` nor
    stamps the change feed.

    `author`: who reported it (the recovery's revision names them, docs/privacy.md "Provenance").

    A successful recall (grade ≥ HARD) of a memory the decay pass tombstoned brings it back through
    `memories.services.memory_recover` (revision, version, change feed); a memory forgotten on
    purpose stays forgotten (409). Deleted or expired memories: 404. The caller resolved the stack
    through `stacks.selectors` with write access.

    Locks as the write kernel does (`locked_memory`: stack row, then memory row); after commit the
    change listeners hear `MemoryChange("review", source=source)` (and "recover" first, from the
    recovery).
    """
    at = now or timezone.now()
    try:
        grade = Grade(int(grade))
    except (TypeError, ValueError) as exc:
        raise InvalidInput("Invalid grade.", fields={"grade": ["One of 1 (again), 2 (hard), 3 (good), 4 (easy)."]}) \
            from exc
    try:
        locked = locked_memory(memory)
    except Memory.DoesNotExist:  # purged since the caller read it
        locked = None
    if locked is None or locked.deleted_at is not None or (locked.expires_at is not None and locked.expires_at <= at):
        raise NotFound("Memory not found.", code="memory_not_found")
    recovered = False
    if locked.forgotten_at is not None:
        if locked.forgotten_reason != FORGOTTEN_REASON_DECAY or grade == Grade.AGAIN:
            raise Conflict("The memory is forgotten; recover it first.", code="memory_forgotten")
        locked = memory_recover(memory=locked, source=source, author=author)
        recovered = True
    outcome = review(DecayState.of(locked), locked.difficulty, grade, at)
    locked.stability = outcome.stability
    locked.difficulty = outcome.difficulty
    locked.last_reviewed_at = at
    Memory.objects.filter(pk=locked.pk).update(
        stability=locked.stability, difficulty=locked.difficulty, last_reviewed_at=at)
    current = salience(DecayState.of(locked), at)
    _store_salience(memory_id=locked.pk, value=current, at=at)
    after_commit(stack_id=locked.stack_id, source=source, changes=[("review", [locked.pk])])
    return ReviewResult(memory=locked, outcome=outcome, salience=current, recovered=recovered)


_STORE_SALIENCE_SQL = """
INSERT INTO memories_memorysalience AS ms (memory_id, salience, computed_at) VALUES (%s, %s, %s)
ON CONFLICT (memory_id) DO UPDATE SET salience = EXCLUDED.salience, computed_at = EXCLUDED.computed_at
    WHERE ms.computed_at <= EXCLUDED.computed_at
"""


def _store_salience(*, memory_id: Any, value: float, at: datetime) -> None:
    # The same upsert and the same "never overwrite a later value" rule as the decay pass, so a
    # review and a pass that race each other leave the later computation in place.
    with connection.cursor() as cursor:
        cursor.execute(_STORE_SALIENCE_SQL, [memory_id, value, at])


def memory_decay_view(memory: Memory, now: datetime | None = None) -> dict[str, Any]:
    """Decay figures of one memory at `now`, for API responses."""
    at = now or timezone.now()
    state = DecayState.of(memory)
    return {
        "salience": round(salience(state, at), 6),
        "retrievability": round(memory_retrievability(state, at), 6),
        "stability": memory.stability if memory.last_reviewed_at else None,
        "difficulty": memory.difficulty if memory.last_reviewed_at else None,
        "last_reviewed_at": memory.last_reviewed_at,
    }


