"""MEMORY.md: a read-only bootstrap file for an agent's workspace (docs/algorithms.md §9).

Sections, in order: header, boot config, values (≤ 20 by priority), active goals (≤ 20 by
priority), beliefs with confidence ≥ 0.4 (≤ 50 by confidence), key relationships (top 10 by
interactions, notes cut at 80 characters), the last checkpoint. Forgotten, deleted and expired
memories never appear, nor, for a requester other than the stack's own credentials, memories its
privacy grants do not admit (memories.privacy.grants; the boot config and checkpoint carry no grants).
Every memory line is flattened to one line, so no stored text can inject markdown structure
(headings, lists) into the file.
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime

from django.db.models import F, FloatField, IntegerField, Value
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast, Coalesce
from django.utils import timezone

from memories.privacy.grants import Audience
from memories.records.schemas import goal_priority_rank
from memories.selectors import (
    boot_config_entries,
    checkpoint_context_text,
    checkpoint_latest,
    checkpoint_warnings,
    memories_list,
)
from stacks.models import Stack

MIN_BELIEF_CONFIDENCE = 0.4
MAX_BELIEFS = 50
MAX_VALUES = 20
MAX_GOALS = 20
MAX_RELATIONSHIPS = 10
RELATIONSHIP_NOTE_CHARS = 80
LINE_MAX = 1000

_WHITESPACE = re.compile(r"\s+")


def one_line(text: object, limit: int = LINE_MAX) -> str:
    """Newlines and runs of whitespace become one space; a leading '#', '>' or '-' is escaped."""
    flat = _WHITESPACE.sub(" ", str(text or "")).strip()
    if len(flat) > limit:
        flat = flat[: limit - 3].rstrip() + "..."
    if flat[:1] in ("#", ">", "-", "*", "+", "=", "|"):
        flat = "\\" + flat
    return flat


def stack_memory_md(*, stack: Stack, now: datetime | None = None, include_checkpoint: bool = True,
                    audience: Audience | None = None, served: list[uuid.UUID] | None = None) -> str:
    """The stack's MEMORY.md. `served`, when given, receives the ids of the memories written into it
    (what the access log records: memories.reads.access_log)."""
    now = now or timezone.now()
    live = memories_list(stack=stack, forgotten="exclude", audience=audience)
    lines = [
        "# MEMORY.md — Long-Term Memory",
        "",
        f"<!-- Generated {now.strftime('%Y-%m-%d %H:%M:%S')} UTC for stack {one_line(stack.slug)}. Do not edit: "
        f"regenerate with GET /api/v1/stacks/{one_line(stack.slug)}/export/memory.md -->",
        "",
    ]

    boot = list(boot_config_entries(stack=stack).values_list("key", "value"))
    if boot:
        lines += ["## Boot Config", ""]
        lines += [f"- **{one_line(key)}**: {one_line(value)}" for key, value in boot]
        lines.append("")

    values = (
        live.filter(kind="value")
        .annotate(prio=Coalesce(Cast(KeyTextTransform("priority", "data"), IntegerField()), Value(50)))
        .order_by("-prio", "-created_at")[:MAX_VALUES]
    )
    if values:
        lines += ["## Values", ""]
        lines += [
            f"- **{one_line(v.data.get('name'), 200)}** (priority {v.prio}): {one_line(v.data.get('statement'))}"
            for v in values
        ]
        lines.append("")

    goals = sorted(
        live.filter(kind="goal", data__status="active").order_by("-created_at")[:500],
        key=lambda g: -goal_priority_rank(g.data.get("priority")),
    )[:MAX_GOALS]
    if goals:
        lines += ["## Goals", ""]
        for goal in goals:
            description = goal.data.get("description")
            suffix = f" — {one_line(description)}" if description else ""
            lines.append(f"- [{one_line(goal.data.get('priority'), 20)}] {one_line(goal.data.get('title'))}{suffix}")
        lines.append("")

    beliefs = (
        live.filter(kind="belief", confidence__gte=MIN_BELIEF_CONFIDENCE)
        .exclude(data__is_active=False)
        .order_by("-confidence", "-created_at")[:MAX_BELIEFS]
    )
    if beliefs:
        lines += ["## Beliefs", ""]
        lines += [f"- [{round(b.confidence * 100):d}%] {one_line(b.data.get('statement'))}" for b in beliefs]
        lines.append("")

    relationships = (
        live.filter(kind="relationship")
        .annotate(interactions=Coalesce(Cast(KeyTextTransform("interaction_count", "data"), FloatField()),
                                        Value(0.0)))
        .order_by(F("interactions").desc(), "-created_at")[:MAX_RELATIONSHIPS]
    )
    if relationships:
        lines += ["## Key Relationships", ""]
        for rel in relationships:
            notes = rel.data.get("notes")
            suffix = f": {one_line(notes, RELATIONSHIP_NOTE_CHARS)}" if notes else ""
            lines.append(f"- **{one_line(rel.data.get('entity_name'), 200)}** "
                         f"({one_line(rel.data.get('relationship_type'), 100)}){suffix}")
        lines.append("")

    if served is not None:
        served.extend(memory.pk for section in (values, goals, beliefs, relationships) for memory in section)

    checkpoint = checkpoint_latest(stack=stack) if include_checkpoint else None
    if checkpoint is not None:
        lines += ["## Last Checkpoint", "", f"- **Task**: {one_line(checkpoint.task)}"]
        if checkpoint.progress:
            lines.append(f"- **Progress**: {one_line(checkpoint.progress)}")
        if checkpoint.next_step:
            lines.append(f"- **Next step**: {one_line(checkpoint.next_step)}")
        if checkpoint.blocker:
            lines.append(f"- **Blocker**: {one_line(checkpoint.blocker)}")
        if checkpoint.context:
            lines.append(f"- **Context**: {one_line(checkpoint_context_text(checkpoint))}")
        if checkpoint.pending:
            lines.append("- **Pending**:")
            lines += [f"  - {one_line(item)}" for item in checkpoint.pending]
        saved = checkpoint.saved_at or checkpoint.created_at  # the client's time when it said
        lines.append(f"- **Saved**: {saved.astimezone(UTC).strftime('%Y-%m-%d %H:%M')} UTC")
        lines += [f"- _Warning_: {one_line(w.message)}" for w in checkpoint_warnings(checkpoint, now=now)]
        lines.append("")

    return "\n".join(lines).rstrip() + "\n"
