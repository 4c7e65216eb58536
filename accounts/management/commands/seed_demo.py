"""Seed a demo school: an admin, teachers, student stacks with assignments and agent keys.

Idempotent: run again and existing people and stacks are kept; new keys are issued only for
stacks that have no active demo key, and every secret is printed exactly once.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction

from accounts.models import ApiKey, Membership, Organization, User
from accounts.services import api_key_issue, member_create, organization_create
from stacks.models import Stack
from stacks.services import stack_create, teacher_assign

DEMO_SLUG = "demo-school"
DEMO_PASSWORD = "demo-password-123"  # noqa: S105 - a demo; the command prints it loudly


class Command(BaseCommand):
    help = "Create (or top up) the demo school with teachers, student stacks and agent keys."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--students", type=int, default=6)
        parser.add_argument("--teachers", type=int, default=2)

    @transaction.atomic
    def handle(self, *args: Any, **options: Any) -> None:
        org = Organization.objects.filter(slug=DEMO_SLUG).first() or organization_create(
            name="Demo School", slug=DEMO_SLUG)
        admin = self._person(org, "admin@demo-school.test", Membership.Role.ADMIN)
        teachers = [self._person(org, f"teacher{n}@demo-school.test", Membership.Role.TEACHER)
                    for n in range(1, options["teachers"] + 1)]
        self._person(org, "billing@demo-school.test", Membership.Role.BILLING)
        self.stdout.write(f"Demo school: {org.name} ({org.slug}); every demo password is {DEMO_PASSWORD!r}")
        for email in ["admin", *[f"teacher{n}" for n in range(1, len(teachers) + 1)], "billing"]:
            self.stdout.write(f"  sign in at /login/ as {email}@demo-school.test")
        school_key = ApiKey.objects.filter(organization=org, stack__isnull=True, name="demo-school-key",
                                           revoked_at__isnull=True).first()
        if school_key is None:
            _, secret = api_key_issue(organization=org, user=admin, name="demo-school-key")
            self.stdout.write(f"  school key (all stacks): {secret}")
        for n in range(1, options["students"] + 1):
            slug = f"student-{n:04d}"
            stack = Stack.objects.filter(organization=org, slug=slug).first() or stack_create(
                organization=org, slug=slug, display_name=f"Student {n}", created_by=admin)
            if teachers:
                teacher_assign(stack=stack, teacher=teachers[(n - 1) % len(teachers)])
            if not ApiKey.objects.filter(stack=stack, name="demo-agent", revoked_at__isnull=True).exists():
                _, secret = api_key_issue(organization=org, user=admin, stack_id=stack.pk, name="demo-agent")
                self.stdout.write(f"  agent key for {slug}: {secret}")
        self.stdout.write(self.style.SUCCESS("Demo data ready. Keys above are shown once."))

    def _person(self, org: Organization, email: str, role: str) -> User:
        user = User.objects.filter(email__iexact=email).first()
        if user is None:
            user, _ = member_create(organization=org, email=email, role=role, password=DEMO_PASSWORD)
        return user
