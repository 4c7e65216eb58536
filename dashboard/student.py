"""A student's page: the reads it shows and the few writes it makes (docs/dashboard.md "Pages").

Every function takes a stack the caller already resolved through `stacks.selectors.stack_for_principal`
(the one access decision); nothing here decides who may see what. The reads of memories also take the
viewer's privacy-grants `audience` (memories.privacy.grants.audience_for: a signed-in admin or teacher is
never the stack's own credentials), and pass it to the memories selectors, search and decay reads,
which filter in SQL: the list, the kind tabs' counts, search, the forgetting candidates, one memory
and the JSON export show only what the viewer's grants admit. The stack's header figures (memories
stored, storage) and the retention charts stay totals of the whole stack: counts, never text.

The rules come from the memories app: which memories are live (`memories.selectors`), how search
ranks (`memories.search.hybrid`, the same call the native search API makes), what the decay pass
forgets (`memories.lifecycle.decay_pass`, `memories.lifecycle.decay`). The writes are the memories
services, each audited here in the same transaction (they do not audit themselves); the audit log
gets ids and the admin's reason, never memory text.

Every read is a fixed number of queries whatever the stack holds (tests/dashboard/test_student.py
counts them), so the page stays fast on a large stack.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta
from typing import Any

from django import forms
from django.contrib.postgres.aggregates import ArrayAgg
from django.core.paginator import EmptyPage, Page, Paginator
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, transaction
from django.db.models import Count, Q, Value
from django.utils import timezone

from accounts.authors import AGENT_LABEL_MAX, Path, author_of
from accounts.principal import Principal
from accounts.services import audit_record
from memories.governance.archive import MEMORY_FIELDS, ROW_CHUNK
from memories.lifecycle.decay import (
    NEVER_FADE_KINDS,
    DecayState,
    never_fades_sql,
    salience,
    salience_sql,
)
from memories.lifecycle.decay_pass import forgetting_candidates, forgotten_by
from memories.models import Memory, MemoryKind, MemoryRevision
from memories.privacy.grants import Audience
from memories.search.hybrid import search_memories
from memories.search.query import MAX_QUERY_CHARS, SearchQuery, SearchResult
from memories.selectors import (
    ForgottenFilter,
    checkpoint_episode_q,
    checkpoint_history,
    checkpoint_warnings,
    memories_list,
)
from memories.services import FORGET_REASON_MAX, memory_forget, memory_recover, memory_set_protected
from memories.writes.rows import memory_snapshot
from memoryhub.errors import NotFound
from memoryhub.schedule import BEAT_SCHEDULE
from stacks.models import Stack

PAGE_SIZE = 25
SEARCH_LIMIT = 50
CANDIDATES_SHOWN = 20
CHECKPOINT_HISTORY_SHOWN = 5
REVISIONS_SHOWN = 100
HISTOGRAM_BUCKETS = 10
FORECAST_DAYS = (7, 30, 60, 90)
# The list's columns: everything the row shows, never the embedding vector (1.5 KB a row).
LIST_DEFER = ("embedding", "search_vector")
DASHBOARD_SOURCE = "dashboard"  # the writer named in revisions

FORGOTTEN_CHOICES = (("exclude", "Hide forgotten"), ("include", "Include forgotten"), ("only", "Only forgotten"))


# --- filters ---------------------------------------------------------------------------------------

class MemoryFilterForm(forms.Form):
    """The list's query string. Unknown kinds, garbage dates or pages are errors (400), not ignored."""

    q = forms.CharField(label="Search memories", required=False, max_length=MAX_QUERY_CHARS, strip=True)
    kind = forms.ChoiceField(label="Kind", required=False, choices=[("", "All"), *MemoryKind.choices])
    tag = forms.CharField(label="Tag", required=False, max_length=200, strip=True)
    created_from = forms.DateField(label="Created from", required=False,
                                   widget=forms.DateInput(attrs={"type": "date"}))
    created_to = forms.DateField(label="Created to", required=False, widget=forms.DateInput(attrs={"type": "date"}))
    forgotten = forms.ChoiceField(label="Forgotten", required=False, choices=FORGOTTEN_CHOICES)
    # The agent label the memories were first written under (docs/privacy.md "Provenance"); the page
    # offers the stack's own (`memories.selectors.memory_agents`).
    agent = forms.CharField(label="Written by agent", required=False, max_length=AGENT_LABEL_MAX, strip=True)
    page = forms.IntegerField(required=False, min_value=1, max_value=1_000_000, widget=forms.HiddenInput)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        start, end = data.get("created_from"), data.get("created_to")
        if start and end and start > end:
            self.add_error("created_to", "Must not be before “Created from”.")
        for name in ("q", "tag", "agent"):
            if "\x00" in (data.get(name) or ""):
                self.add_error(name, "Contains a character that is not allowed.")
        return data


@dataclass(frozen=True)
class MemoryFilters:
    q: str = ""
    kind: str = ""
    tag: str = ""
    created_from: date | None = None  # inclusive days, in the school's time zone
    created_to: date | None = None
    forgotten: ForgottenFilter = "exclude"
    agent: str = ""
    page: int = 1

    @classmethod
    def of(cls, data: dict[str, Any]) -> MemoryFilters:
        return cls(q=data.get("q") or "", kind=data.get("kind") or "", tag=data.get("tag") or "",
                   created_from=data.get("created_from"), created_to=data.get("created_to"),
                   forgotten=data.get("forgotten") or "exclude", agent=data.get("agent") or "",
                   page=data.get("page") or 1)

    @property
    def created_after(self) -> datetime | None:
        if self.created_from is None:
            return None
        return datetime.combine(self.created_from, time.min, timezone.get_current_timezone())

    @property
    def created_before(self) -> datetime | None:
        """Exclusive: the start of the day after "created to"."""
        if self.created_to is None:
            return None
        return datetime.combine(self.created_to + timedelta(days=1), time.min, timezone.get_current_timezone())

    @property
    def narrowed(self) -> bool:
        """Anything beyond the defaults (so an empty result means "nothing matches", not "nothing yet")."""
        return bool(self.q or self.kind or self.tag or self.created_from or self.created_to or self.agent
                    or self.forgotten != "exclude")


def _filtered(stack: Stack, filters: MemoryFilters, *, audience: Audience | None, with_kind: bool = True) -> Any:
    # A kernle checkpoint episode is shown as what it is, in the checkpoint panel's history
    # (`checkpoint_panel`), not among the episodes (docs/dashboard.md "Pages").
    return memories_list(stack=stack, kinds=[filters.kind] if with_kind and filters.kind else None,
                         tags=[filters.tag] if filters.tag else None, created_after=filters.created_after,
                         created_before=filters.created_before, forgotten=filters.forgotten,
                         audience=audience, agent=filters.agent or None).exclude(checkpoint_episode_q())


def checkpoint_panel(stack: Stack) -> dict[str, Any]:
    """What the checkpoint panel shows (the page and its live socket alike): the checkpoint, its
    warnings, and the CHECKPOINT_HISTORY_SHOWN checkpoints saved before it."""
    latest = list(checkpoint_history(stack=stack)[:CHECKPOINT_HISTORY_SHOWN + 1])
    checkpoint = latest[0] if latest else None
    return {"checkpoint": checkpoint, "checkpoint_warnings": checkpoint_warnings(checkpoint) if checkpoint else [],
            "checkpoint_history": latest[1:]}


def kind_counts(stack: Stack, filters: MemoryFilters, *, audience: Audience | None) -> dict[str, int]:
    """Memories per kind the viewer may see under the current filters but the kind itself (the tabs):
    one grouped COUNT."""
    return kind_counts_and_listed(stack, filters, audience=audience, ids=())[0]


def kind_counts_and_listed(stack: Stack, filters: MemoryFilters, *, audience: Audience | None,
                           ids: Collection[uuid.UUID]) -> tuple[dict[str, int], set[uuid.UUID]]:
    """`kind_counts`, and which of `ids` the page lists under its filters, its kind tab included
    (the live page's "matches", dashboard.live): one grouped statement for both."""
    rows = _filtered(stack, filters, audience=audience, with_kind=False).order_by().values("kind")
    if ids:
        # The kind tab narrows the list, not the counts: a listed row is one of `ids` of that kind.
        listed = Q(pk__in=list(ids), **({"kind": filters.kind} if filters.kind else {}))
        rows = rows.annotate(n=Count("id"), listed=ArrayAgg("id", filter=listed, default=Value([])))
    else:
        rows = rows.annotate(n=Count("id"))
    found = list(rows)
    counts = dict.fromkeys(MemoryKind.values, 0)
    counts.update({row["kind"]: row["n"] for row in found})
    return counts, {pk for row in found for pk in row.get("listed", ())}


def memory_page(stack: Stack, filters: MemoryFilters, *, audience: Audience | None) -> Page:
    """One page of the filtered memories the viewer may see, newest first. A page past the end is a 404."""
    queryset = _filtered(stack, filters, audience=audience).defer(*LIST_DEFER).order_by("-created_at", "-id")
    try:
        return Paginator(queryset, PAGE_SIZE).page(filters.page)
    except EmptyPage:
        if filters.page == 1:
            return Paginator(queryset, PAGE_SIZE, allow_empty_first_page=True).page(1)
        raise NotFound("There is no such page of memories.", code="page_not_found") from None


def memory_search(stack: Stack, filters: MemoryFilters, *, audience: Audience | None) -> SearchResult:
    """The native search API's call (memories.api.search.StackSearchView) with the page's filters.

    Search covers live memories only, as the API's does; the tag filter is "any of these tags" there,
    which for one tag is the same as the list's. The agent filter keeps the best matches written
    under that agent.
    """
    query = SearchQuery(text=filters.q, limit=SEARCH_LIMIT, kinds=(filters.kind,) if filters.kind else (),
                        tags=(filters.tag,) if filters.tag else (), created_after=filters.created_after,
                        created_before=filters.created_before)
    result = search_memories(stack_ids=[stack.pk], query=query, audience=audience)
    if filters.agent:
        result.hits = [hit for hit in result.hits if (hit.memory.written_by or {}).get("agent") == filters.agent]
    return result


# --- decay: candidates and the retention chart ------------------------------------------------------

def next_decay_pass_at(now: datetime) -> datetime:
    """When the scheduled decay pass next runs (memoryhub/schedule.py), so the candidates are what
    THAT pass will forget."""
    schedule = BEAT_SCHEDULE["memories-decay-pass"]["schedule"]
    return now + schedule.remaining_estimate(now)


@dataclass
class Retention:
    threshold: float
    next_pass_at: datetime
    candidates: list[Memory]
    histogram: dict[str, Any]  # chart spec: live memories by salience now
    forecast: dict[str, Any]  # chart spec: live memories kept vs forgotten by each horizon
    live: int = 0
    fading: int = 0  # of the live memories, those that can fade (not protected, values or drives)
    forgotten_next_pass: int = 0
    forecast_rows: list[tuple[str, int]] = field(default_factory=list)


_HISTOGRAM_SQL = f"""
SELECT LEAST(width_bucket(s.salience, 0.0::float8, 1.0::float8, {HISTOGRAM_BUCKETS}), {HISTOGRAM_BUCKETS}) AS bucket,
       s.never_fades, count(*)
FROM (SELECT {salience_sql("m", "%(now)s")} AS salience, {never_fades_sql("m")} AS never_fades
      FROM memories_memory m
      WHERE m.stack_id = %(stack)s AND m.forgotten_at IS NULL AND m.deleted_at IS NULL
        AND (m.expires_at IS NULL OR m.expires_at > %(now)s)) s
GROUP BY 1, 2
"""  # noqa: S608 - only module constants are interpolated; values are bound parameters


def salience_histogram(stack: Stack, now: datetime) -> list[tuple[int, int]]:
    """Live memories per tenth of salience at `now`: [(can fade, never fade)] for 0.0-0.1 … 0.9-1.0."""
    buckets = [[0, 0] for _ in range(HISTOGRAM_BUCKETS)]
    with connection.cursor() as cursor:
        cursor.execute(_HISTOGRAM_SQL, {"stack": stack.pk, "now": now})
        for bucket, never_fades, count in cursor.fetchall():
            buckets[max(1, int(bucket)) - 1][1 if never_fades else 0] += int(count)
    return [(fading, kept) for fading, kept in buckets]


def retention(stack: Stack, *, now: datetime | None = None, audience: Audience | None = None) -> Retention:
    """What the next decay pass will forget (the pass's own rule), and the charts that explain it.
    The candidates listed are those the viewer's grants admit; the charts count the whole stack."""
    now = now or timezone.now()
    next_pass = next_decay_pass_at(now)
    threshold = stack.organization.forget_threshold
    candidates = forgetting_candidates(stack=stack, now=next_pass, limit=CANDIDATES_SHOWN, audience=audience)
    histogram = salience_histogram(stack, now)
    can_fade = sum(count for count, _ in histogram)
    live = can_fade + sum(kept for _, kept in histogram)
    horizons = [next_pass, *(now + timedelta(days=days) for days in FORECAST_DAYS)]
    forgotten = forgotten_by(stack=stack, times=horizons)
    labels = ["Next pass", *(f"In {days} days" for days in FORECAST_DAYS)]
    tenth = 1.0 / HISTOGRAM_BUCKETS
    return Retention(
        threshold=threshold, next_pass_at=next_pass, candidates=candidates, live=live, fading=can_fade,
        forgotten_next_pass=forgotten[0], forecast_rows=list(zip(labels, forgotten, strict=True)),
        histogram={
            "type": "bar", "stacked": True, "y_label": "Live memories",
            "labels": [f"{i * tenth:.1f}-{(i + 1) * tenth:.1f}" for i in range(HISTOGRAM_BUCKETS)],
            "datasets": [{"label": "Can fade", "data": [fading for fading, _ in histogram]},
                         {"label": "Never fade (protected, values, drives)", "data": [kept for _, kept in histogram]}],
        },
        forecast={
            "type": "bar", "stacked": True, "y_label": "Memories live now",
            "labels": labels,
            "datasets": [{"label": "Kept", "data": [max(0, live - n) for n in forgotten]},
                         {"label": "Forgotten by decay", "data": forgotten, "color": "#a4161a"}],
        },
    )


# --- one memory ------------------------------------------------------------------------------------

@dataclass
class RevisionRow:
    revision: MemoryRevision
    changed: list[str]  # the fields this change altered (snapshot before vs the state after)


@dataclass
class MemoryDetail:
    memory: Memory
    salience: float
    never_fades: bool
    revisions: list[RevisionRow]
    revision_count: int
    data_items: list[tuple[str, str, Any]]  # (field, "none" | "list" | "json" | "text", value)


# Snapshot fields that change on every write and say nothing to a reader.
_DIFF_IGNORED = frozenset({"version", "server_updated_at", "embedded_version", "embedding_model", "salience"})


def memory_detail(memory: Memory, *, now: datetime | None = None) -> MemoryDetail:
    """A memory with its salience now and its newest revisions (newest first), each with what it changed."""
    now = now or timezone.now()
    revisions = list(MemoryRevision.objects.filter(memory_id=memory.pk).order_by("-created_at", "-id")
                     [:REVISIONS_SHOWN])
    count = len(revisions)
    if count == REVISIONS_SHOWN:
        count = MemoryRevision.objects.filter(memory_id=memory.pk).count()
    # Walk back from the current state: a revision keeps the state BEFORE its change, so what it
    # changed is where its snapshot differs from the state after it (the next newer one's, or now).
    after = memory_snapshot(memory)
    rows = []
    for revision in revisions:
        snapshot = revision.snapshot if isinstance(revision.snapshot, dict) else {}
        changed = sorted(name for name, value in snapshot.items()
                         if name not in _DIFF_IGNORED and name in after and after[name] != value)
        rows.append(RevisionRow(revision=revision, changed=changed))
        after = {**after, **snapshot}
    return MemoryDetail(
        memory=memory, salience=salience(DecayState.of(memory), now),
        never_fades=memory.is_protected or memory.kind in NEVER_FADE_KINDS,
        revisions=rows, revision_count=count,
        data_items=[(name, _shape(value), value) for name, value in sorted((memory.data or {}).items())],
    )


def _shape(value: Any) -> str:
    """How the detail page shows a kind-specific field (memories.records.schemas decides what they hold)."""
    if value is None or value == "" or value == []:
        return "none"
    if isinstance(value, list) and all(isinstance(item, (str, int, float)) for item in value):
        return "list"
    if isinstance(value, (dict, list)):
        return "json"
    return "text"


# --- writes ----------------------------------------------------------------------------------------

class ForgetForm(forms.Form):
    reason = forms.CharField(label="Reason", max_length=FORGET_REASON_MAX, strip=True,
                             help_text=f"Why, in a few words (at most {FORGET_REASON_MAX} characters). "
                                       "Kept with the memory and in the audit log.")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if "\x00" in (data.get("reason") or ""):
            self.add_error("reason", "Contains a character that is not allowed.")
        return data


MEMORY_ACTIONS = ("forget", "recover", "protect", "unprotect")
_AUDIT_ACTIONS = {"forget": "memory.forgotten", "recover": "memory.recovered", "protect": "memory.protected",
                  "unprotect": "memory.unprotected"}


@transaction.atomic
def memory_change(*, principal: Principal, stack: Stack, memory: Memory, action: str, reason: str = "",
                  ip: str | None) -> Memory:
    """Forget / recover / protect / unprotect through the memories services, audited in the same
    transaction. The stack was resolved with write=True (archived → 409). Service refusals
    (already forgotten, protected) are Conflicts (409). The revision and the audit event name the
    signed-in person and the dashboard as the change's author (docs/privacy.md "Provenance")."""
    author = author_of(principal, path=Path.DASHBOARD)
    if action == "forget":
        memory = memory_forget(memory=memory, reason=reason, source=DASHBOARD_SOURCE, author=author)
    elif action == "recover":
        memory = memory_recover(memory=memory, source=DASHBOARD_SOURCE, author=author)
    elif action in ("protect", "unprotect"):
        memory = memory_set_protected(memory=memory, protected=action == "protect", source=DASHBOARD_SOURCE,
                                      author=author)
    else:
        raise NotFound("There is no such action.", code="not_found")
    metadata: dict[str, Any] = {"stack": stack.slug, "kind": memory.kind, "version": memory.version,
                                "author": author.as_json()}
    if action == "forget":
        metadata["reason"] = memory.forgotten_reason  # the admin's words, never the memory's text
    audit_record(organization=stack.organization, action=_AUDIT_ACTIONS[action], principal=principal,
                 target_type="memory", target_id=str(memory.pk), ip=ip, metadata=metadata)
    return memory


# --- exports ---------------------------------------------------------------------------------------

EXPORT_FORMAT = "memoryhub.memories.v1"
_EXPORT_FLUSH_ROWS = 100


def audit_export(*, principal: Principal, stack: Stack, ip: str | None, export_format: str) -> None:
    audit_record(organization=stack.organization, action="stack.exported", principal=principal,
                 target_type="stack", target_id=stack.slug, ip=ip, metadata={"format": export_format})


def export_filename(stack: Stack, now: datetime, suffix: str) -> str:
    return f"memoryhub-{stack.slug}-{now.strftime('%Y%m%dT%H%M%SZ')}{suffix}"


def memories_json_chunks(*, stack: Stack, now: datetime, audience: Audience | None) -> Iterator[bytes]:
    """The stack's live memories as one JSON document, streamed: `{"format", "stack", "exported_at",
    "memories": [...]}`, each memory with the columns of the archive's memory lines
    (memories.governance.archive.MEMORY_FIELDS: no embedding vector). Forgotten memories are left out, as from
    every export (memories.services.memory_forget); the ZIP archive of the API keeps everything.
    Rows come through a server-side cursor, so a large stack never sits in memory. Only memories the
    viewer's privacy grants admit (`audience`, memories.privacy.grants) are exported."""
    head = {"format": EXPORT_FORMAT, "stack": {"slug": stack.slug, "display_name": stack.display_name},
            "exported_at": now}
    yield json.dumps(head, cls=DjangoJSONEncoder, ensure_ascii=False)[:-1].encode() + b', "memories": ['
    rows = (memories_list(stack=stack, audience=audience).order_by("created_at", "id").values(*MEMORY_FIELDS)
            .iterator(chunk_size=ROW_CHUNK))
    pending: list[str] = []
    first = True
    for row in rows:
        pending.append(json.dumps(row, cls=DjangoJSONEncoder, ensure_ascii=False))
        if len(pending) >= _EXPORT_FLUSH_ROWS:
            yield (("" if first else ",") + ",".join(pending)).encode()
            first, pending = False, []
    if pending:
        yield (("" if first else ",") + ",".join(pending)).encode()
    yield b"]}\n"
