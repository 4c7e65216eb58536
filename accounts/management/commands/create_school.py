"""Create a school with its first admin, print how to sign in (the password is shown once) and, with
`--issue-key`, the admin's first API key (shown once).

Idempotent: run it again with the same school and admin email and it reports what exists and
changes nothing (exit 0) — no new password, no new key; `manage.py issue_key` issues further keys.
The school is found by its slug (`--slug`, or the one derived from the name).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction
from django.utils.text import slugify

from accounts.key_usage import add_url_argument, key_usage_lines, service_url
from accounts.models import Membership, Organization, User
from accounts.selectors import email_taken
from accounts.services import api_key_issue, normalized_email, school_create
from memoryhub.errors import DomainError

FIRST_KEY_NAME = "first admin key"


class Command(BaseCommand):
    help = ("Create a school (organization) and its first admin; --issue-key also prints the admin's first API key. "
            "Running it again for the same school and email changes nothing.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="The school's name, e.g. 'Lincoln High'")
        parser.add_argument("--admin-email", required=True)
        parser.add_argument("--slug", default=None, help="URL-safe id; derived from the name when omitted")
        parser.add_argument("--password", default=None, help="Initial admin password (generated when omitted)")
        parser.add_argument("--issue-key", action="store_true",
                            help="Also issue the admin's first API key (school-wide) and print it once")
        add_url_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            email = normalized_email(options["admin_email"], field="admin_email")
        except DomainError as error:
            raise CommandError(f"{error.message} (--admin-email {options['admin_email']!r})") from None
        if not email:
            raise CommandError("--admin-email is required.")
        slug = options["slug"] or slugify(options["name"])[:80] or "org"
        existing = Organization.objects.filter(slug=slug).first()
        if existing is not None:
            self._report_existing(existing, email, issue_key=options["issue_key"])
            return
        if email_taken(email):
            raise CommandError(f"{email} already has an account (in another school); use another --admin-email, "
                               "or --slug to name the school that account administers.")
        try:
            with transaction.atomic():  # the school, its admin and the first key: all or nothing
                organization, user, password = school_create(name=options["name"], admin_email=email,
                                                             admin_password=options["password"], slug=slug)
                key = secret = None
                if options["issue_key"]:
                    key, secret = api_key_issue(organization=organization, user=user, name=FIRST_KEY_NAME)
        except DomainError as error:
            raise CommandError(error.message) from None
        url = service_url(options["url"])
        self.stdout.write(self.style.SUCCESS(f"Created school {organization.name} ({organization.slug})."))
        self.stdout.write(f"  admin username: {user.username}")
        self.stdout.write(f"  admin email:    {user.email}")
        if not options["password"]:
            self.stdout.write(f"  password:       {password}   (shown once; change it after signing in)")
        self.stdout.write(f"Sign in at {url}/login/ ; the dashboard is {url}/dashboard/.")
        if key is not None and secret is not None:
            for line in key_usage_lines(key, secret, url=url):
                self.stdout.write(line)
        else:
            self.stdout.write(f"For an API key: .venv/bin/python manage.py issue_key --school {organization.slug}")

    def _report_existing(self, organization: Organization, email: str, *, issue_key: bool) -> None:
        admin = User.objects.filter(memberships__organization=organization, memberships__role=Membership.Role.ADMIN,
                                    email__iexact=email).first()
        if admin is None:
            raise CommandError(f"School {organization.slug!r} exists and {email} is not its admin; nothing changed "
                               "(--slug names another school).")
        self.stdout.write(f"School {organization.name} ({organization.slug}) already exists with admin {admin.email} "
                          f"(username {admin.username}); nothing changed.")
        if issue_key:
            self.stdout.write("No key issued: the first key is issued only when the school is created. For another: "
                              f".venv/bin/python manage.py issue_key --school {organization.slug}")
