"""The school overview's read model: what `/dashboard/` shows, at a cost that does not grow with the
number of students.

Which stacks the caller sees is `stacks.selectors.stacks_visible_to` (an admin: the school's; a
teacher: the assigned ones), which keys `accounts.selectors.keys_visible_to`, whose share of the
job runs `memories.selectors.job_runs_scope`: every figure here is computed over those, never over
a rule restated here. Job runs, the school's quota, forgetting per week and expiring keys are
school-wide figures: only a principal who acts for the whole school (`is_org_wide`) gets them.

Everything is read from counters and rollups the write kernel maintains in the writing transaction
(`Stack.memory_count`, `bytes_used`, `last_sync_at`, `last_write_at`; `memories.StackDailyActivity`)
or from small indexed sets (the partial index `memories_embedding_backlog`; `memories_jobrun_name_time`),
so a page is a fixed number of queries, each bounded by the page size, the school's stack count or
the days shown — never by the number of memories (tests/dashboard/test_overview.py counts them).
The recent time to searchable comes from Redis (memoryhub.time_to_searchable: the workers' samples,
at most a thousand per school), filtered to the caller's stacks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.paginator import Page, Paginator
from django.db.models import BigIntegerField, Count, F, Min, OuterRef, Prefetch, Q, QuerySet, Subquery, Sum, Value
from django.db.models.fields.json import KT
from django.db.models.functions import Cast, Coalesce, Lower, NullIf, TruncWeek
from django.utils import timezone

from accounts.models import ApiKey, Membership
from accounts.principal import Principal
from accounts.selectors import keys_visible_to, members_visible_to
from accounts.tiers import tier_for
from memories.governance.guardian_requests import requests_due_soon
from memories.lifecycle.jobs import JOB_DECAY, JOB_RUN_RETENTION, JOB_TTL_PURGE, job_run_share, job_runs_recent
from memories.lifecycle.ttl import retention_needs_review
from memories.models import JobRun, Memory, StackDailyActivity
from memories.selectors import job_runs_scope
from memoryhub import time_to_searchable
from memoryhub.errors import ServiceUnavailable
from memoryhub.replica import primary_values, read_alias
from stacks.models import GuardianRequest, Stack, TeacherAssignment
from stacks.selectors import stacks_visible_to

PAGE_SIZE = 50
ACTIVITY_DAYS = 30
JOB_RUNS_SHOWN = 6
KEY_EXPIRY_WARNING = timedelta(days=14)
FAILED_JOBS_WINDOW = timedelta(days=7)
# A push of a few hundred records is embedded within seconds of its commit; this many memories
# still waiting when someone opens the page means the embedding worker is behind or down.
BACKLOG_ATTENTION = 500
# The school-wide backlog is counted up to here and shown as "10,000+" beyond: a worker that has
# been down for days must not make the page scan its whole backlog on every load.
BACKLOG_COUNT_CAP = 10_000
# Students paused or awaiting consent named under "Needs attention" (docs/consent.md); past it, "and more".
CONSENT_ATTENTION_SHOWN = 10
# A memory still waiting for its vector counts toward the time to searchable if it was written this
# recently: older waiting rows are a model switch's re-embedding (docs/algorithms.md §10.3), which
# would report the age of memories written long ago, not how long new ones wait.
WAITING_LOOKBACK = timedelta(hours=1)

# Sort keys the table offers (GET ?sort=, "-" first for descending) → the ordering. Stacks that
# never synced or were never written sort last in either direction; the slug breaks ties so pages
# never overlap. "name" sorts by the name the table shows (the display name, else the slug).
SORT_FIELDS = {
    "name": "shown_name",
    "memories": "memory_count",
    "storage": "bytes_used",
    "sync": "last_sync_at",
    "write": "last_write_at",
}
SORT_CHOICES = [key for name in SORT_FIELDS for key in (name, f"-{name}")]
DEFAULT_SORT = "name"
STATUS_CHOICES = [value for value, _ in Stack.Status.choices]


@dataclass(frozen=True)
class StackFilters:
    """What the table shows: a text search over slug and display name, an assigned teacher (user
    id), a status, and the sort key (one of SORT_CHOICES)."""

    search: str = ""
    teacher_id: int | None = None
    status: str = ""
    sort: str = DEFAULT_SORT


def _ordering(sort: str) -> list[Any]:
    descending = sort.startswith("-")
    column = SORT_FIELDS.get(sort.lstrip("-"), SORT_FIELDS[DEFAULT_SORT])
    if column == "shown_name":
        shown = Lower(Coalesce(NullIf("display_name", Value("")), "slug"))
        return [shown.desc(), "-slug"] if descending else [shown.asc(), "slug"]
    expression = F(column).desc(nulls_last=True) if descending else F(column).asc(nulls_last=True)
    return [expression, "slug"]


def overview_stacks(principal: Principal, filters: StackFilters) -> QuerySet[Stack]:
    """The caller's stacks matching `filters`, in the asked order, with their teachers."""
    stacks = stacks_visible_to(principal)
    if filters.search:
        stacks = stacks.filter(Q(slug__icontains=filters.search) | Q(display_name__icontains=filters.search))
    if filters.teacher_id is not None:
        stacks = stacks.filter(teacher_assignments__user_id=filters.teacher_id)
    if filters.status:
        stacks = stacks.filter(status=filters.status)
    teachers = TeacherAssignment.objects.select_related("user").order_by("user__email", "user_id")
    return stacks.order_by(*_ordering(filters.sort)).prefetch_related(
        Prefetch("teacher_assignments", queryset=teachers, to_attr="assignments"))


@dataclass
class StackRow:
    stack: Stack
    teachers: list[str]
    backlog: int


def stack_page(principal: Principal, filters: StackFilters,
               page_number: int | str | None) -> tuple[Page, list[StackRow]]:
    """One page (PAGE_SIZE) of the table; a page past the end is the last one."""
    page = Paginator(overview_stacks(principal, filters), PAGE_SIZE).get_page(page_number)
    stacks = list(page.object_list)
    backlog = embedding_backlog_by_stack([stack.pk for stack in stacks])
    rows = [StackRow(stack=stack, teachers=[_person(a.user) for a in getattr(stack, "assignments", [])],
                     backlog=backlog.get(stack.pk, 0)) for stack in stacks]
    return page, rows


def _person(user: Any) -> str:
    return user.get_full_name() or user.email or user.username


def embedding_backlog_by_stack(stack_ids: list[int]) -> dict[int, int]:
    """Memories awaiting a current embedding, per stack: the predicate of the partial index
    `memories_embedding_backlog` (memories/models.py), so this reads that index only."""
    if not stack_ids:
        return {}
    # A count a moment old is fine here: the replica, when there is one (memoryhub/replica.py).
    rows = (Memory.objects.using(read_alias())
            .filter(stack_id__in=stack_ids, embedded_version__isnull=True, deleted_at__isnull=True)
            .values("stack_id").annotate(n=Count("*")).values_list("stack_id", "n"))
    return dict(rows)


def teacher_choices(principal: Principal) -> list[tuple[int, str]]:
    """The school's teachers, for the table's teacher filter (school admins only: a teacher's table
    holds only their own stacks)."""
    if not principal.is_org_wide:
        return []
    members = members_visible_to(principal).filter(role=Membership.Role.TEACHER).order_by("user__email")
    return [(member.user_id, _person(member.user)) for member in members]


# --- summary, charts and what needs attention ---------------------------------------------------


@dataclass
class Summary:
    stacks: int
    students: int
    active: int
    archived: int
    memories: int
    bytes_used: int


def summary(principal: Principal) -> Summary:
    totals = stacks_visible_to(principal).aggregate(
        stacks=Count("pk"),
        students=Count("pk", filter=Q(kind=Stack.Kind.STUDENT)),
        active=Count("pk", filter=Q(status=Stack.Status.ACTIVE)),
        memories=Sum("memory_count"),
        bytes_used=Sum("bytes_used"),
    )
    return Summary(stacks=totals["stacks"], students=totals["students"], active=totals["active"],
                   archived=totals["stacks"] - totals["active"], memories=int(totals["memories"] or 0),
                   bytes_used=int(totals["bytes_used"] or 0))


def embedding_backlog_total(principal: Principal) -> int:
    """The caller's stacks' backlog, counted up to BACKLOG_COUNT_CAP (+1, so "more than" shows)."""
    alias = read_alias()  # a count a moment old is fine; who sees which stacks is decided on the primary
    visible = primary_values(stacks_visible_to(principal).values("pk"), alias)
    waiting = (Memory.objects.using(alias)
               .filter(stack_id__in=visible, embedded_version__isnull=True, deleted_at__isnull=True))
    return waiting.values("pk")[: BACKLOG_COUNT_CAP + 1].count()


def written_per_day(principal: Principal, *, today: date | None = None,
                    days: int = ACTIVITY_DAYS) -> list[tuple[date, int]]:
    """Memories created or changed per UTC day over the last `days` days (today included), from
    the kernel's rollup; days nobody wrote are 0."""
    today = today or timezone.now().date()
    first = today - timedelta(days=days - 1)
    alias = read_alias()  # a chart a moment old is fine; who sees which stacks is decided on the primary
    rows = (StackDailyActivity.objects.using(alias)
            .filter(stack_id__in=primary_values(stacks_visible_to(principal).values("pk"), alias),
                    day__gte=first, day__lte=today)
            .values("day").annotate(n=Sum("written")).values_list("day", "n"))
    by_day = dict(rows)
    return [(first + timedelta(days=i), int(by_day.get(first + timedelta(days=i), 0))) for i in range(days)]


@dataclass
class WeeklyForgetting:
    weeks: list[date]
    forgotten: list[int]  # tombstoned by the decay pass
    purged: list[int]  # removed by the TTL purge (retention, expiry)


def forgetting_per_week(principal: Principal, *, now: datetime | None = None) -> WeeklyForgetting | None:
    """The school's share of the decay pass's and the TTL purge's runs, per ISO week (Monday), over
    the weeks the job runs are kept (JOB_RUN_RETENTION). None for a caller who does not see job
    runs; the per-school share is `JobRun.organization_counts` (memories.lifecycle.jobs)."""
    if not principal.is_org_wide:
        return None
    now = now or timezone.now()
    since = now - JOB_RUN_RETENTION
    first_week = since.date() - timedelta(days=since.weekday())
    organization = str(principal.organization.pk)
    rows = (JobRun.objects.using(read_alias()).filter(name__in=[JOB_DECAY, JOB_TTL_PURGE], started_at__gte=since)
            .exclude(status=JobRun.Status.SKIPPED)
            .annotate(week=TruncWeek("started_at"))
            .values("week", "name")
            .annotate(forgotten=Sum(Cast(KT(f"organization_counts__{organization}__forgotten"), BigIntegerField())),
                      purged=Sum(Cast(KT(f"organization_counts__{organization}__purged"), BigIntegerField())))
            .values_list("week", "name", "forgotten", "purged"))
    weeks = [first_week + timedelta(weeks=i) for i in range((now.date() - first_week).days // 7 + 1)]
    forgotten = dict.fromkeys(weeks, 0)
    purged = dict.fromkeys(weeks, 0)
    for week, name, n_forgotten, n_purged in rows:
        day = week.date()
        if day in forgotten:
            if name == JOB_DECAY:
                forgotten[day] += int(n_forgotten or 0)
            else:
                purged[day] += int(n_purged or 0)
    return WeeklyForgetting(weeks=weeks, forgotten=list(forgotten.values()), purged=list(purged.values()))


@dataclass
class Quota:
    used: int
    limit: int | None  # None: the plan has no storage limit
    plan: str
    label: str

    @property
    def percent(self) -> float | None:
        if self.limit is None:
            return None
        return round(100 * self.used / self.limit, 1) if self.limit else 100.0

    @property
    def percent_label(self) -> str:
        percent = self.percent
        if percent is None:
            return "no limit"
        return "under 0.1%" if self.used and percent < 0.1 else f"{percent}%"


def storage_quota(principal: Principal, used: int) -> Quota | None:
    """The school's storage against its plan's limit (accounts.tiers, as billing.entitlements
    enforces it: the sum of `Stack.bytes_used`, which an org-wide caller's `used` is). None for a
    teacher, who sees only their stacks' figures, or when the plan cannot be read right now."""
    if not principal.is_org_wide:
        return None
    try:
        tier = tier_for(principal.organization)
    except ServiceUnavailable:
        return None
    return Quota(used=used, limit=tier.storage_bytes, plan=tier.name, label=tier.storage_label)


JOB_LABELS = {"decay": "Decay", "ttl_purge": "Retention purge", "promotion": "Lesson promotion",
              "embedding_sweep": "Embedding sweep", "stack_vector_indexes": "Vector indexes"}


@dataclass
class JobRunView:
    run: JobRun
    counts: dict[str, Any]

    @property
    def label(self) -> str:
        return JOB_LABELS.get(self.run.name, self.run.name)

    @property
    def count_items(self) -> list[tuple[str, Any]]:
        return [(name.replace("_", " "), value) for name, value in self.counts.items()]


def latest_job_runs(principal: Principal) -> list[JobRunView]:
    """The newest runs of the periodic jobs with the caller's share of their counts (admins)."""
    if not principal.is_org_wide:
        return []
    organization_id = job_runs_scope(principal)
    runs = job_runs_recent()[:JOB_RUNS_SHOWN]
    return [JobRunView(run=run, counts=run.counts if organization_id is None else job_run_share(run, organization_id))
            for run in runs]


@dataclass(frozen=True)
class SearchableDelay:
    """How long the caller's stacks' new memories take to become searchable by meaning lately."""

    seconds: float
    still_waiting: bool  # the figure is a memory still waiting, not the p95 of those stored
    window_minutes: int = time_to_searchable.WINDOW_SECONDS // 60  # what "recent" means for the p95

    @property
    def label(self) -> str:
        if self.seconds < 120:
            return f"{round(self.seconds)} seconds"
        if self.seconds < 2 * 3600:
            return f"{round(self.seconds / 60)} minutes"
        return f"{round(self.seconds / 3600, 1):g} hours"


def searchable_delay(principal: Principal, *, now: datetime | None = None) -> SearchableDelay:
    """The caller's stacks' recent time to searchable (docs/algorithms.md §10.2.3): the larger of
    the p95 over the vectors stored in the last minutes (memoryhub.time_to_searchable) and the wait
    of the oldest memory written within WAITING_LOOKBACK that still has no vector — when the worker
    stops, nothing is stored and only the waiting memory tells.

    The samples are the school's (its Redis list), kept only for stacks `stacks_visible_to` gives
    the caller: a teacher's figure is their students', another school's is never read."""
    now = now or timezone.now()
    samples = time_to_searchable.recent(principal.organization.pk, now=now.timestamp())
    visible = set(stacks_visible_to(principal).filter(pk__in={stack_id for stack_id, _ in samples})
                  .values_list("pk", flat=True)) if samples else set()
    stored = [seconds for stack_id, seconds in samples if stack_id in visible]
    p95 = time_to_searchable.quantile(stored, 0.95) if stored else 0.0
    oldest = oldest_recent_waiting(principal, since=now - WAITING_LOOKBACK)
    waited = max(0.0, (now - oldest).total_seconds()) if oldest is not None else 0.0
    return SearchableDelay(seconds=max(p95, waited), still_waiting=waited > p95)


def oldest_recent_waiting(principal: Principal, *, since: datetime) -> datetime | None:
    """When the oldest memory of the caller's stacks written since `since` and still awaiting a
    vector was written (None: none). One probe of the backlog's partial index on (stack,
    server_updated_at) per stack, so a large backlog costs no more than a small one."""
    alias = read_alias()  # a moment old is fine; who sees which stacks is decided on the primary
    first_waiting = (Memory.objects.using(alias)
                     .filter(stack_id=OuterRef("pk"), embedded_version__isnull=True, deleted_at__isnull=True,
                             server_updated_at__gte=since)
                     .order_by("server_updated_at").values("server_updated_at")[:1])
    oldest: datetime | None = (Stack.objects.using(alias)
                               .filter(pk__in=primary_values(stacks_visible_to(principal).values("pk"), alias))
                               .annotate(first_waiting=Subquery(first_waiting))
                               .aggregate(oldest=Min("first_waiting"))["oldest"])
    return oldest


@dataclass
class Attention:
    failed_runs: list[JobRunView] = field(default_factory=list)
    backlog: int = 0
    backlog_capped: bool = False
    expiring_keys: list[ApiKey] = field(default_factory=list)
    retention_review: bool = False  # a kind kept without a limit that no admin has chosen
    slow_searchable: SearchableDelay | None = None  # over TIME_TO_SEARCHABLE_ATTENTION_SECONDS
    paused: list[Stack] = field(default_factory=list)  # agents' writes refused (docs/consent.md)
    awaiting_consent: list[Stack] = field(default_factory=list)  # the school requires consent; none in force
    more_students: bool = False  # more paused or awaiting students than CONSENT_ATTENTION_SHOWN
    # Guardians' requests due within two days or overdue (admins; docs/guardians.md "Requests").
    requests_due: list[tuple[GuardianRequest, bool]] = field(default_factory=list)  # (request, overdue)

    @property
    def backlog_alert(self) -> bool:
        return self.backlog >= BACKLOG_ATTENTION

    @property
    def empty(self) -> bool:
        return not (self.failed_runs or self.backlog_alert or self.expiring_keys or self.retention_review
                    or self.slow_searchable or self.paused or self.awaiting_consent or self.requests_due)


def needs_attention(principal: Principal, *, now: datetime | None = None) -> Attention:
    """Failed job runs of the last week, keys expiring within two weeks and a retention left without
    a limit nobody chose (school admins), and, in the caller's stacks, an embedding backlog over
    BACKLOG_ATTENTION and a recent time to searchable of TIME_TO_SEARCHABLE_ATTENTION_SECONDS or more."""
    now = now or timezone.now()
    backlog = embedding_backlog_total(principal)
    attention = Attention(backlog=min(backlog, BACKLOG_COUNT_CAP), backlog_capped=backlog > BACKLOG_COUNT_CAP)
    delay = searchable_delay(principal, now=now)
    if delay.seconds >= settings.TIME_TO_SEARCHABLE_ATTENTION_SECONDS:
        attention.slow_searchable = delay
    _consent_attention(principal, attention)
    if principal.is_org_wide:
        job_runs_scope(principal)  # the one rule on who sees runs; an admin passes
        failed = job_runs_recent().filter(status=JobRun.Status.FAILED, started_at__gte=now - FAILED_JOBS_WINDOW)[:5]
        attention.failed_runs = [JobRunView(run=run, counts={}) for run in failed]
        attention.expiring_keys = list(
            keys_visible_to(principal)
            .filter(revoked_at__isnull=True, expires_at__gt=now, expires_at__lte=now + KEY_EXPIRY_WARNING)
            .select_related("user").order_by("expires_at")[:10])
        attention.retention_review = retention_needs_review(principal.organization)
        attention.requests_due = [(row, row.due_at <= now) for row in
                                  requests_due_soon(principal, now=now)[:CONSENT_ATTENTION_SHOWN]]
    return attention


def _consent_attention(principal: Principal, attention: Attention) -> None:
    """The caller's active students whose memory is paused or, when the school requires consent,
    who have none in force: one query of at most CONSENT_ATTENTION_SHOWN + 1 rows, whatever the
    number of students."""
    condition = Q(paused_at__isnull=False)
    if principal.organization.consent_required:
        condition |= Q(consent_given_at__isnull=True)
    rows = list(stacks_visible_to(principal).filter(condition, status=Stack.Status.ACTIVE)
                .order_by("display_name", "slug")
                .only("slug", "display_name", "paused_at", "consent_given_at")[:CONSENT_ATTENTION_SHOWN + 1])
    attention.more_students = len(rows) > CONSENT_ATTENTION_SHOWN
    rows = rows[:CONSENT_ATTENTION_SHOWN]
    attention.paused = [row for row in rows if row.paused_at is not None]
    attention.awaiting_consent = [row for row in rows if row.paused_at is None]
