"""Explicit retrieval feedback: promote ("this hit helped") and demote ("this hit was wrong").

docs/algorithms.md §3: a read is not a review. Search never changes stability, retention or the
decay clock; decay state changes only through explicit signals: these, graded recalls
(memories.lifecycle.reviews) and smart-ingest reinforcement. Each is an FSRS review
(memories.lifecycle.decay.review) bounded by the §3.3 table: a promote at least multiplies stability by 1.5,
a demote at least halves it (stability ≤ 0.5x the prior). The clock restarts (`last_reviewed_at`), as for any review.

Feedback is per stack, i.e. per student/agent (§3.1: never global). It is server-owned decay
state, not content, so it neither bumps `version` nor enters the sync change feed; each feedback
leaves a `MemoryRevision(source="feedback")` with the state before it, which is also how smart
ingest knows a memory "was demoted" or "was promoted" (the latest feedback wins). It locks as the
write kernel does (`memories.writes.rows.locked_memory`) and, after commit, the change listeners
hear `MemoryChange("promote" | "demote", source="feedback")`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from accounts.authors import Author, job_author
from memories.lifecycle.decay import DecayState, Grade, base_stability, memory_retrievability, review
from memories.models import Memory, MemoryRevision
from memories.privacy.redaction.policy import stack_policy
from memories.writes.hooks import prepare_author
from memories.writes.rows import locked_memory, note_revision
from memoryhub.errors import Conflict

PROMOTE = "promote"
DEMOTE = "demote"
PROMOTE_STABILITY_FACTOR = 1.5
DEMOTE_STABILITY_FACTOR = 0.5
FEEDBACK_SOURCE = "feedback"


@dataclass(frozen=True)
class FeedbackOutcome:
    memory: Memory
    action: str
    stability_before: float
    stability_after: float
    retention_before: float


@transaction.atomic
def memory_feedback(*, memory: Memory, action: str, reason: str = "", now: datetime | None = None,
                    author: Author | None = None) -> FeedbackOutcome:
    """Apply promote or demote to a memory the caller may write (resolved by stacks.selectors), as
    `author` (its revision's, docs/privacy.md "Provenance"; None: the server's own)."""
    now = now or timezone.now()
    author = prepare_author(author if author is not None else job_author(FEEDBACK_SOURCE),
                            redaction=stack_policy(memory.stack))
    memory = locked_memory(memory)
    if memory.deleted_at is not None or memory.forgotten_at is not None:
        raise Conflict("Feedback needs a live memory; this one is deleted or forgotten.", code="memory_not_live")
    state = DecayState.of(memory)
    prior = base_stability(state)
    retention = memory_retrievability(state, now)
    if action == PROMOTE:
        outcome = review(state, memory.difficulty, Grade.GOOD, now)
        stability = max(outcome.stability, prior * PROMOTE_STABILITY_FACTOR)
    else:
        outcome = review(state, memory.difficulty, Grade.AGAIN, now)
        stability = min(outcome.stability, prior * DEMOTE_STABILITY_FACTOR)
    note_revision(
        memory, source=FEEDBACK_SOURCE, author=author, action=action, reason=reason[:2000],
        snapshot={
            "stability": memory.stability, "difficulty": memory.difficulty,
            "last_reviewed_at": memory.last_reviewed_at.isoformat() if memory.last_reviewed_at else None,
            "effective_prior_stability": prior, "retention": retention,
        },
    )
    Memory.objects.filter(pk=memory.pk).update(
        stability=stability, difficulty=outcome.difficulty, last_reviewed_at=now
    )
    memory.stability, memory.difficulty, memory.last_reviewed_at = stability, outcome.difficulty, now
    return FeedbackOutcome(memory=memory, action=action, stability_before=prior, stability_after=stability,
                           retention_before=retention)


def latest_feedback(memory_ids: list[str]) -> dict[str, str]:
    """The most recent feedback action per memory ("promote" / "demote"); absent when none."""
    rows = (
        MemoryRevision.objects.filter(memory_id__in=memory_ids, source=FEEDBACK_SOURCE)
        .order_by("memory_id", "-created_at", "-id")
        .distinct("memory_id")
        .values_list("memory_id", "action")
    )
    return {str(memory_id): action for memory_id, action in rows}
