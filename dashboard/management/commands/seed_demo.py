"""Seed a demo school to click through: an admin, teachers, a billing user, student stacks with
assignments and agent keys, and in every student's stack a month of a tutor agent's memories.

Idempotent: run again and existing people, stacks and memories are kept; new keys are issued only
for stacks that have no active demo key, and every secret is printed exactly once. Memories have
deterministic record ids (`demo-<kind>-<n>`), so a second run adds only what is missing.

Everything is written through the services: people and keys through accounts.services, stacks
through stacks.services (which audit), memories through memories.services.memory_batch_create
(the write kernel: schema, redaction, quota, counters, embedding after commit). It sits in the
dashboard app because it writes memories, which the stacks app may not import.

The demo school is created on the enterprise tier, which has no stack limit, so `--students` can be
any number; a demo school from an older release on a smaller tier fails clearly at its stack limit
instead of growing past it.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from accounts.key_usage import add_url_argument, service_url
from accounts.models import ApiKey, Membership, Organization, User
from accounts.services import api_key_issue, member_create, organization_create
from memories.models import Checkpoint, Memory, StackDailyActivity
from memories.services import CheckpointInput, boot_config_set, checkpoint_save, memory_batch_create, memory_forget
from memoryhub.errors import DomainError
from stacks.models import Stack
from stacks.services import stack_create, teacher_assign

DEMO_SLUG = "demo-school"
DEMO_PASSWORD = "demo-password-123"  # noqa: S105 - a demo; the command prints it loudly
DEMO_TIER = "enterprise"  # no stack limit: a demo school has as many students as asked for
SPREAD_DAYS = 30  # memories are dated over the last month, so the overview's charts have a shape
SOURCE = "seed"  # the writer named in revisions

# Each student's tutor works mostly on one subject (by student number) and a little on the next.
SUBJECTS: list[tuple[str, list[str]]] = [
    ("maths", ["fractions", "long division", "negative numbers", "ratios", "the area of a triangle",
               "simultaneous equations"]),
    ("science", ["photosynthesis", "states of matter", "electric circuits", "the water cycle",
                 "forces and friction", "animal and plant cells"]),
    ("English", ["persuasive writing", "paragraph structure", "apostrophes", "imagery in poetry",
                 "reading for inference", "punctuating speech"]),
    ("history", ["the Roman Empire", "the Industrial Revolution", "ancient Egypt", "building a timeline",
                 "primary and secondary sources", "the printing press"]),
    ("Spanish", ["the present tense", "numbers to a hundred", "describing family", "ser and estar",
                 "ordering food", "the weather"]),
]


def _memories(n: int) -> list[dict[str, Any]]:
    """A tutor agent's month with student `n`: every kind, plausible and invented (no real people)."""
    subject, topics = SUBJECTS[(n - 1) % len(SUBJECTS)]
    other, other_topics = SUBJECTS[n % len(SUBJECTS)]
    t = [topics[(n + i) % len(topics)] for i in range(len(topics))]
    o = other_topics[n % len(other_topics)]
    tag = subject.lower()
    items: list[dict[str, Any]] = [
        {"kind": "raw", "content": f"Session log: 25 minutes on {t[0]}. Asked twice why the method works, "
                                   "not just how. Finished the last three questions without hints.",
         "source": "session", "tags": [tag, "session"]},
        {"kind": "raw", "content": f"Student said they found {t[1]} 'boring until the example about football'. "
                                   "Worth reusing sport examples.", "source": "chat", "tags": [tag]},
        {"kind": "raw", "content": f"Homework check-in: {o} worksheet half done; wants to finish it before Friday.",
         "source": "chat", "tags": [other.lower(), "homework"]},
        {"kind": "episode", "objective": f"Introduce {t[0]} with a worked example",
         "outcome": "Understood the idea after a drawing; needed a second example for the general rule.",
         "outcome_type": "success", "lessons": ["Start with a picture before symbols"], "tags": [tag, "lesson"]},
        {"kind": "episode", "objective": f"Practise {t[1]} with five short questions",
         "outcome": "Three of five right; the mistakes were the same slip each time.",
         "outcome_type": "partial", "lessons": ["Name the common slip out loud before the next set"],
         "tags": [tag, "practice"]},
        {"kind": "episode", "objective": f"Revise {t[2]} before the class quiz",
         "outcome": "Made a one-page summary together; felt ready.", "outcome_type": "success",
         "lessons": ["Summaries in the student's own words stick better"], "tags": [tag, "revision"]},
        {"kind": "episode", "objective": f"Start on {o}",
         "outcome": "Got frustrated after ten minutes; we stopped and planned a shorter session.",
         "outcome_type": "failure", "lessons": ["Keep first sessions on a new topic under 15 minutes"],
         "tags": [other.lower()]},
        {"kind": "note", "content": f"Explains {t[0]} well when asked to teach it back.", "note_type": "observation",
         "tags": [tag, "strength"]},
        {"kind": "note", "content": "Prefers short sessions after lunch; concentration drops after 30 minutes.",
         "note_type": "observation", "tags": ["routine"]},
        {"kind": "note", "content": f"Mixes up the steps of {t[1]} when rushed; slowing down fixes it.",
         "note_type": "insight", "tags": [tag, "misconception"]},
        {"kind": "note", "content": "Teacher asked for a weekly summary of progress on Fridays.",
         "note_type": "note", "tags": ["teacher"]},
        {"kind": "note", "content": f"Old note: struggled with {t[3]} at the start of term.", "note_type": "note",
         "tags": [tag]},
        {"kind": "belief", "statement": f"This student learns {subject} best from concrete examples first.",
         "belief_type": "preference", "confidence": 0.85, "tags": [tag]},
        {"kind": "belief", "statement": "Praise for effort works better than praise for speed with this student.",
         "belief_type": "observation", "confidence": 0.7, "tags": ["motivation"]},
        {"kind": "belief", "statement": f"{t[2].capitalize()} is now secure; revisit only before exams.",
         "belief_type": "fact", "confidence": 0.6, "tags": [tag]},
        {"kind": "value", "name": "patience", "statement": "Give the student time to think before offering a hint.",
         "priority": 80},
        {"kind": "value", "name": "honesty", "statement": "Say clearly when an answer is wrong, and why, kindly.",
         "priority": 70},
        {"kind": "goal", "title": f"Be confident with {t[0]} by the end of term",
         "description": "Measured by the end-of-unit test and by explaining it back.", "priority": "high",
         "tags": [tag]},
        {"kind": "goal", "title": f"Finish the {o} worksheet", "priority": "medium", "goal_type": "task",
         "tags": [other.lower(), "homework"]},
        {"kind": "goal", "title": "Read for twenty minutes, four days a week", "priority": "low", "status": "paused",
         "tags": ["reading"]},
        {"kind": "drive", "drive_type": "curiosity", "intensity": 0.7, "focus_areas": [subject, "how things work"]},
        {"kind": "relationship", "entity_name": f"Year group {subject} club", "entity_type": "group",
         "relationship_type": "member", "notes": "Enjoys the puzzles; shy about presenting.", "sentiment": 0.6,
         "interaction_count": 4},
        {"kind": "playbook", "name": "When stuck on a new problem",
         "description": "What helps this student get unstuck without giving the answer away.",
         "trigger_conditions": ["two wrong attempts", "long silence"],
         "steps": [{"action": "Ask what they already know"}, {"action": "Draw it"},
                   {"action": "Try a smaller version of the problem"}],
         "mastery_level": "competent", "times_used": 6, "success_rate": 0.8},
    ]
    counters: dict[str, int] = {}
    now = timezone.now()
    for index, item in enumerate(items):
        kind = item["kind"]
        counters[kind] = counters.get(kind, 0) + 1
        item["record_id"] = f"demo-{kind}-{counters[kind]:02d}"
        # Spread over the month, differently per student, and never in the future.
        days = (index * 7 + n * 3) % SPREAD_DAYS
        item["created_at"] = (now - timedelta(days=days, hours=(index * 5 + n) % 12, minutes=index)).isoformat()
    return items


def _backdate_activity(stack: Stack, written: list[Memory]) -> None:
    """Count the demo's memories on the days they claim to be from, not today.

    The write kernel adds each write to today's row of the per-day rollup behind the overview's
    "memories written per day" (StackDailyActivity). Seeded memories carry a `created_at` spread over
    the last month, as if an agent had pushed them day by day; moving their count to those days
    gives the chart the month it would have had. Demo data only: no real write is ever re-dated.
    """
    today = timezone.now().astimezone(UTC).date()
    per_day = Counter(m.created_at.astimezone(UTC).date() for m in written)
    StackDailyActivity.objects.filter(stack=stack, day=today).update(written=F("written") - len(written))
    for day, count in per_day.items():
        row, created = StackDailyActivity.objects.get_or_create(stack=stack, day=day, defaults={"written": count})
        if not created:
            StackDailyActivity.objects.filter(pk=row.pk).update(written=F("written") + count)
    StackDailyActivity.objects.filter(stack=stack, day=today, written__lte=0).delete()


# The one memory per stack the demo forgets (an outdated note), so the forgetting views have data.
FORGOTTEN = ("note", "demo-note-05")


class Command(BaseCommand):
    help = "Create (or top up) the demo school: teachers, student stacks with a month of memories, agent keys."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--students", type=int, default=6)
        parser.add_argument("--teachers", type=int, default=2)
        add_url_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            self._seed(students=options["students"], teachers=options["teachers"])
        except DomainError as error:  # e.g. the stack limit of an older demo school's tier
            raise CommandError(f"{error.message} (nothing was changed)") from None
        url = service_url(options["url"])
        self.stdout.write(self.style.SUCCESS("Demo data ready. Keys above are shown once."))
        self.stdout.write(f"Sign in at {url}/login/ as admin@demo-school.test with the password {DEMO_PASSWORD!r}"
                          f" (teachers: teacher1@demo-school.test …, billing: billing@demo-school.test).")

    @transaction.atomic
    def _seed(self, *, students: int, teachers: int) -> None:
        org = Organization.objects.filter(slug=DEMO_SLUG).first() or organization_create(
            name="Demo School", slug=DEMO_SLUG, tier=DEMO_TIER)
        admin = self._person(org, "admin@demo-school.test", Membership.Role.ADMIN)
        teacher_users = [self._person(org, f"teacher{n}@demo-school.test", Membership.Role.TEACHER)
                         for n in range(1, teachers + 1)]
        self._person(org, "billing@demo-school.test", Membership.Role.BILLING)
        self.stdout.write(f"Demo school: {org.name} ({org.slug}); every demo password is {DEMO_PASSWORD!r}")
        for email in ["admin", *[f"teacher{n}" for n in range(1, len(teacher_users) + 1)], "billing"]:
            self.stdout.write(f"  sign in at /login/ as {email}@demo-school.test")
        school_key = ApiKey.objects.filter(organization=org, stack__isnull=True, name="demo-school-key",
                                           revoked_at__isnull=True).first()
        if school_key is None:
            _, secret = api_key_issue(organization=org, user=admin, name="demo-school-key")
            self.stdout.write(f"  school key (all stacks): {secret}")
        created = 0
        for n in range(1, students + 1):
            slug = f"student-{n:04d}"
            stack = Stack.objects.filter(organization=org, slug=slug).first() or stack_create(
                organization=org, slug=slug, display_name=f"Student {n}", created_by=admin)
            if teacher_users:
                teacher_assign(stack=stack, teacher=teacher_users[(n - 1) % len(teacher_users)])
            if not ApiKey.objects.filter(stack=stack, name="demo-agent", revoked_at__isnull=True).exists():
                _, secret = api_key_issue(organization=org, user=admin, stack_id=stack.pk, name="demo-agent",
                                          stack_agent=True)  # the student's tutor agent: the stack's own key
                self.stdout.write(f"  agent key for {slug}: {secret}")
            created += self._memories(stack, n)
        self.stdout.write(f"  {created} demo memories written" if created else "  demo memories already there")

    def _memories(self, stack: Stack, n: int) -> int:
        """Write the demo memories `stack` lacks (by record id); returns how many were written."""
        have = set(Memory.objects.filter(stack=stack, record_id__startswith="demo-")
                   .values_list("kind", "record_id"))
        missing = [item for item in _memories(n) if (item["kind"], item["record_id"]) not in have]
        if missing:
            written = memory_batch_create(stack=stack, items=missing, source=SOURCE)
            _backdate_activity(stack, written)
            outdated = next((m for m in written if (m.kind, m.record_id) == FORGOTTEN), None)
            if outdated is not None:
                memory_forget(memory=outdated, reason="outdated", source=SOURCE)
        if not Checkpoint.objects.filter(stack=stack).exists():
            subject, topics = SUBJECTS[(n - 1) % len(SUBJECTS)]
            checkpoint_save(stack=stack, checkpoint=CheckpointInput(
                task=f"Work through {topics[n % len(topics)]} ({subject})",
                progress="Worked example done; two of five practice questions right.",
                next_step="Start the next session with the slip we named, then three more questions.",
                context={"session": n, "subject": subject}))
        boot_config_set(stack=stack, key="tone", value="warm, encouraging, never sarcastic")
        boot_config_set(stack=stack, key="session_minutes", value="25")
        return len(missing)

    def _person(self, org: Organization, email: str, role: str) -> User:
        user = User.objects.filter(email__iexact=email).first()
        if user is None:
            user, _ = member_create(organization=org, email=email, role=role, password=DEMO_PASSWORD)
        return user
