"""Create a school with its first admin and print how to sign in (the password is shown once)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from accounts.models import Membership, Organization, User
from accounts.services import school_create
from memoryhub.errors import DomainError


class Command(BaseCommand):
    help = "Create a school (organization) and its first admin. Idempotent for an existing school slug."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="The school's name, e.g. 'Lincoln High'")
        parser.add_argument("--admin-email", required=True)
        parser.add_argument("--slug", default=None, help="URL-safe id; derived from the name when omitted")
        parser.add_argument("--password", default=None, help="Initial admin password (generated when omitted)")

    def handle(self, *args: Any, **options: Any) -> None:
        slug = options["slug"]
        existing = Organization.objects.filter(slug=slug).first() if slug else None
        if existing is not None:
            admin = User.objects.filter(memberships__organization=existing, memberships__role=Membership.Role.ADMIN,
                                        email__iexact=options["admin_email"]).first()
            if admin is None:
                raise CommandError(f"School {slug!r} exists and {options['admin_email']} is not its admin.")
            self.stdout.write(f"School {existing.name} ({existing.slug}) already exists; admin {admin.username}.")
            return
        try:
            organization, user, password = school_create(name=options["name"], admin_email=options["admin_email"],
                                                         admin_password=options["password"], slug=slug)
        except DomainError as error:
            raise CommandError(error.message) from None
        self.stdout.write(self.style.SUCCESS(f"Created school {organization.name} ({organization.slug})."))
        self.stdout.write(f"  admin username: {user.username}")
        self.stdout.write(f"  admin email:    {user.email}")
        if not options["password"]:
            self.stdout.write(f"  password:       {password}   (shown once; change it after signing in)")
        self.stdout.write("Sign in at /login/ ; create stacks and keys at /api/v1/stacks/ and /api/v1/keys/.")
