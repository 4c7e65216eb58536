"""Seed a demo school: an admin, teachers, student stacks with assignments and agent keys.

Idempotent: run again and existing people and stacks are kept; new keys are issued only for
stacks that have no active demo key, and every secret is printed exactly once.

A stacks command (it creates stacks, so it sits above accounts). The demo school is created on the
enterprise tier, which has no stack limit, so `--students` can be any number; a demo school from
an older release on a smaller tier fails clearly at its stack limit instead of growing past it.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from accounts.models import ApiKey, Membership, Organization, User
from accounts.services import api_key_issue, member_create, organization_create
from memoryhub.errors import DomainError
from stacks.models import Stack
from stacks.services import stack_create, teacher_assign

DEMO_SLUG = "demo-school"
DEMO_PASSWORD = "demo-password-123"  # noqa: S105 - a demo; the command prints it loudly
DEMO_TIER = "enterprise"  # no stack limit: a demo school has as many students as asked for


class Command(BaseCommand):
    help = "Create (or top up) the demo school with teachers, student stacks and agent keys."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--students", type=int, default=6)
        parser.add_argument("--teachers", type=int, default=2)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            self._seed(students=options["students"], teachers=options["teachers"])
        except DomainError as error:  # e.g. the stack limit of an older demo school's tier
            raise CommandError(f"{error.message} (nothing was changed)") from None

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
        for n in range(1, students + 1):
            slug = f"student-{n:04d}"
            stack = Stack.objects.filter(organization=org, slug=slug).first() or stack_create(
                organization=org, slug=slug, display_name=f"Student {n}", created_by=admin)
            if teacher_users:
                teacher_assign(stack=stack, teacher=teacher_users[(n - 1) % len(teacher_users)])
            if not ApiKey.objects.filter(stack=stack, name="demo-agent", revoked_at__isnull=True).exists():
                _, secret = api_key_issue(organization=org, user=admin, stack_id=stack.pk, name="demo-agent")
                self.stdout.write(f"  agent key for {slug}: {secret}")
        self.stdout.write(self.style.SUCCESS("Demo data ready. Keys above are shown once."))

    def _person(self, org: Organization, email: str, role: str) -> User:
        user = User.objects.filter(email__iexact=email).first()
        if user is None:
            user, _ = member_create(organization=org, email=email, role=role, password=DEMO_PASSWORD)
        return user
