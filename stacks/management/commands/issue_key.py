"""Issue an API key from the operator's shell, and print it once with the lines that use it.

The key belongs to a person of the school (`--email`, or the school's first admin) and is issued as
if that person, signed in to the dashboard (`accounts.selectors.principal_for_session`), asked for it
through `POST /api/v1/keys/`: the same rules decide (stacks.selectors.
stack_for_new_key — a school-wide key needs a school admin, a stack key a stack they may write, an
archived stack refuses) and the same service issues it (accounts.services.api_key_issue: only a
hash is stored, the audit log records it). A stacks command because a key may be bound to a stack.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from accounts.key_usage import add_url_argument, key_usage_lines, service_url
from accounts.models import Membership, Organization
from accounts.selectors import principal_for_session
from accounts.services import api_key_issue
from memoryhub.errors import DomainError, NotFound
from stacks.selectors import stack_for_new_key

NAME_MAX = 100  # ApiKey.name


class Command(BaseCommand):
    help = ("Issue an API key for a person of a school (school-wide, or bound to one stack) and print it once "
            "with the lines that use it.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--school", default=None, help="The school's slug")
        parser.add_argument("--email", default=None,
                            help="Whose key it is (default: the school's first admin); names the school if "
                                 "--school is omitted")
        parser.add_argument("--stack", default=None, help="Bind the key to this stack (slug); default: school-wide")
        parser.add_argument("--read-only", action="store_true", help="The key may read but not write")
        parser.add_argument("--stack-agent", action="store_true",
                            help="With --stack: the student's own agent key, which reads every memory of the stack "
                                 "(also those shared only with the student; audited). Without it the key reads "
                                 "what its person may read")
        parser.add_argument("--expires-in-days", type=int, default=None, help="The key stops working after N days")
        parser.add_argument("--name", default="", help="A label shown in key lists")
        add_url_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        if not options["school"] and not options["email"]:
            raise CommandError("Say which school: --school SLUG (or --email of one of its people).")
        days = options["expires_in_days"]
        if days is not None and days < 1:
            raise CommandError("--expires-in-days must be at least 1.")
        if len(options["name"]) > NAME_MAX:
            raise CommandError(f"--name is at most {NAME_MAX} characters.")
        membership = self._membership(options["school"], options["email"])
        organization = membership.organization
        principal = principal_for_session(membership.user)
        if principal is None or principal.organization.pk != organization.pk:
            raise CommandError(f"{membership.user.email} signs in to another school; issue their keys there.")
        try:
            stack = stack_for_new_key(principal, options["stack"], stack_agent=options["stack_agent"])
            key, secret = api_key_issue(
                organization=organization, user=membership.user, stack_id=stack.pk if stack else None,
                name=options["name"], read_only=options["read_only"], stack_agent=options["stack_agent"],
                expires_at=timezone.now() + timedelta(days=days) if days else None, principal=principal)
        except NotFound:
            raise CommandError(f"No stack {options['stack']!r} in {organization.name} ({organization.slug}) that "
                               f"{membership.user.email or membership.user.username} may write.") from None
        except DomainError as error:
            raise CommandError(f"{error.message} (nothing was issued)") from None
        for line in key_usage_lines(key, secret, url=service_url(options["url"])):
            self.stdout.write(line)

    @staticmethod
    def _membership(school: str | None, email: str | None) -> Membership:
        memberships = Membership.objects.select_related("organization", "user")
        if school:
            organization = Organization.objects.filter(slug=school).first()
            if organization is None:
                raise CommandError(f"No school with slug {school!r} (see the dashboard, or create it with "
                                   "`manage.py create_school`).")
            memberships = memberships.filter(organization=organization)
        if email:
            found = list(memberships.filter(user__email__iexact=email.strip()).order_by("created_at")[:2])
            if not found:
                raise CommandError(f"No person with email {email!r}" + (f" in school {school!r}." if school else "."))
            if len(found) > 1:
                raise CommandError(f"{email} belongs to several schools; add --school SLUG.")
            return found[0]
        admin = memberships.filter(role=Membership.Role.ADMIN).order_by("created_at").first()
        if admin is None:
            raise CommandError(f"School {school!r} has no admin to own the key; name a person with --email.")
        return admin
