"""Promotion: lessons that recur across recent episodes become beliefs (docs/algorithms.md §5).

* Scans the `limit` (1-200, default 50) most recent live episodes (not forgotten, deleted or
  expired); fewer than 3 → nothing to do (`reason="not_enough_episodes"`).
* Lessons are matched after normalisation — case, runs of whitespace and trailing punctuation
  ("Test first." == "test  first") — fixing Kernle's case-sensitive matching.
* A lesson is a pattern when it appears in at least 2 distinct episodes; patterns are ranked by
  frequency (ties: newest sighting first), at most 20.
* A pattern whose normalised text already is an active belief of the stack is skipped, so running
  promotion again (the periodic task does) creates nothing twice.
* `auto=True` creates beliefs (belief_type "pattern", confidence 0.7, source_type "consolidation",
  source_entity "promotion", derived_from up to 10 `episode:<record_id>` refs, source_episodes the
  same ids) through `memory_create` — quotas and validation apply as for any write.
  `auto=False` only suggests.
* Privacy grants (docs/privacy.md "Privacy grants"): a request through the API passes the caller's
  `audience` (None for the stack's own credentials and for the scheduled job, which runs as the
  system). Both reads — the episodes scanned and the beliefs a pattern is checked against — carry
  the grants predicate, so a hidden episode is neither counted nor quoted (its lessons, its record
  id) and a hidden belief is treated as absent: the suggestion is made (and, in auto mode, a
  belief created) as if it did not exist, rather than `skipped_existing` telling the caller that a
  memory it cannot see holds that text.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from accounts.authors import Author
from memories.lifecycle.jobs import JOB_PROMOTION, Progress, run_job
from memories.models import JobRun, Memory
from memories.privacy.grants import Audience
from memories.selectors import memories_list
from memories.services import memory_create
from memoryhub.errors import DomainError
from stacks.models import Stack

logger = logging.getLogger(__name__)

MIN_EPISODES = 3
MIN_OCCURRENCES = 2
MAX_SUGGESTIONS = 20
MAX_REFS = 10
DEFAULT_LIMIT = 50
MAX_LIMIT = 200
PROMOTED_CONFIDENCE = 0.7

_SPACES = re.compile(r"\s+")
_TRAILING = re.compile(r"[\s.!?,;:…]+$")


def normalize_lesson(text: str) -> str:
    return _TRAILING.sub("", _SPACES.sub(" ", text).strip().lower())


@dataclass
class PromotionSuggestion:
    lesson: str            # the text as first written (most recent episode)
    normalized: str
    occurrences: int
    episode_ids: list[str]  # record ids, newest first
    belief_id: str | None = None  # set when auto mode created it


@dataclass
class PromotionResult:
    episodes_scanned: int
    suggestions: list[PromotionSuggestion] = field(default_factory=list)
    created: int = 0
    skipped_existing: int = 0
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "episodes_scanned": self.episodes_scanned, "created": self.created,
            "skipped_existing": self.skipped_existing, "reason": self.reason,
            "suggestions": [s.__dict__ for s in self.suggestions],
        }


@transaction.atomic
def promote_lessons(*, stack: Stack, auto: bool = True, limit: int = DEFAULT_LIMIT,
                    source: str = "promotion", audience: Audience | None = None,
                    author: Author | None = None) -> PromotionResult:
    """`audience`: the requester's privacy grants (None: the stack's own credentials or the system).
    `author`: who asked (the beliefs' `written_by`, docs/privacy.md "Provenance"); None: the
    promotion job (`job_author(source)`)."""
    limit = max(1, min(MAX_LIMIT, int(limit)))
    episodes = list(memories_list(stack=stack, kinds=["episode"], audience=audience)
                    .order_by("-created_at").values_list("record_id", "data")[:limit])
    result = PromotionResult(episodes_scanned=len(episodes))
    if len(episodes) < MIN_EPISODES:
        result.reason = "not_enough_episodes"
        return result

    seen: dict[str, PromotionSuggestion] = {}
    order: list[str] = []
    for record_id, data in episodes:  # newest first
        for lesson in {normalize_lesson(x): x for x in (data or {}).get("lessons") or [] if isinstance(x, str)}.items():
            key, original = lesson
            if not key:
                continue
            if key not in seen:
                seen[key] = PromotionSuggestion(lesson=original.strip(), normalized=key, occurrences=0, episode_ids=[])
                order.append(key)
            seen[key].occurrences += 1
            seen[key].episode_ids.append(record_id)

    patterns = [seen[k] for k in order if seen[k].occurrences >= MIN_OCCURRENCES]
    patterns.sort(key=lambda s: -s.occurrences)  # stable: ties keep newest-sighting order

    existing = {
        normalize_lesson(statement or "")
        for statement in memories_list(stack=stack, kinds=["belief"], audience=audience)
        .exclude(data__is_active=False)
        .values_list("data__statement", flat=True)
    }
    for suggestion in patterns:
        if len(result.suggestions) >= MAX_SUGGESTIONS:
            break
        if suggestion.normalized in existing:
            result.skipped_existing += 1
            continue
        result.suggestions.append(suggestion)

    if auto:
        for suggestion in result.suggestions:
            refs = suggestion.episode_ids[:MAX_REFS]
            belief = memory_create(stack=stack, kind="belief", source=source, author=author, payload={
                "statement": suggestion.lesson, "belief_type": "pattern", "confidence": PROMOTED_CONFIDENCE,
                "source_type": "consolidation", "source_entity": "promotion",
                "derived_from": [f"episode:{ref}" for ref in refs], "source_episodes": refs,
            })
            suggestion.belief_id = str(belief.pk)
            result.created += 1
    return result


# --- promotion as a recorded job ----------------------------------------------------------------

PROMOTION_LOOKBACK_MARGIN = timedelta(minutes=5)


def promotion_stack_ids(*, since: datetime | None) -> list[int]:
    """Active stacks with an episode written since `since` (all active stacks with episodes if None).

    One set-based query; only those stacks can have a new pattern, so a run is bounded by recent
    activity, not by the number of stacks.
    """
    episodes = Memory.objects.filter(kind="episode", deleted_at__isnull=True, forgotten_at__isnull=True,
                                     stack__status=Stack.Status.ACTIVE)
    if since is not None:
        episodes = episodes.filter(server_updated_at__gte=since)
    return sorted(set(episodes.values_list("stack_id", flat=True).distinct()))


def _promotion_work(*, now: datetime, counts: dict[str, Any], progress: Progress | None) -> None:
    last = (JobRun.objects.filter(name=JOB_PROMOTION, status=JobRun.Status.SUCCEEDED)
            .order_by("-started_at").values_list("started_at", flat=True).first())
    since = last - PROMOTION_LOOKBACK_MARGIN if last else None
    counts.update(stacks=0, beliefs_created=0, stacks_failed=0)
    for stack in Stack.objects.filter(pk__in=promotion_stack_ids(since=since)).select_related("organization"):
        try:
            result = promote_lessons(stack=stack, auto=True)
        except DomainError as exc:  # e.g. a full quota: that stack waits, the others go on
            counts["stacks_failed"] += 1
            logger.info("promotion skipped stack %s: %s", stack.pk, exc.code)
        else:
            counts["beliefs_created"] += result.created
        counts["stacks"] += 1
        if progress is not None:
            progress(1)


def promotion_run(*, now: datetime | None = None, progress: Progress | None = None) -> JobRun:
    """Promote recurring episode lessons to beliefs in every stack with new episodes since the last
    successful run (`promote_lessons` above, auto mode; it skips patterns that are
    already beliefs, so repeating a run creates nothing twice). Counts: stacks, beliefs_created,
    stacks_failed."""
    at = now or timezone.now()
    return run_job(JOB_PROMOTION, lambda counts: _promotion_work(now=at, counts=counts, progress=progress))

