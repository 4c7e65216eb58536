"""Promotion: lessons that recur across recent episodes become beliefs (memory-science.md §8.5).

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
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from memories.selectors import memories_list
from memories.services import memory_create
from stacks.models import Stack

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
                    source: str = "promotion") -> PromotionResult:
    limit = max(1, min(MAX_LIMIT, int(limit)))
    episodes = list(
        memories_list(stack=stack, kinds=["episode"]).order_by("-created_at").values_list("record_id", "data")[:limit]
    )
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
        for statement in memories_list(stack=stack, kinds=["belief"])
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
            belief = memory_create(stack=stack, kind="belief", source=source, payload={
                "statement": suggestion.lesson, "belief_type": "pattern", "confidence": PROMOTED_CONFIDENCE,
                "source_type": "consolidation", "source_entity": "promotion",
                "derived_from": [f"episode:{ref}" for ref in refs], "source_episodes": refs,
            })
            suggestion.belief_id = str(belief.pk)
            result.created += 1
    return result
