"""Building blocks for tests: organizations, people, stacks, keys and authenticated clients.

These write through the real services and the real database; nothing is mocked.
"""

from __future__ import annotations

import itertools
from typing import Any

import psycopg
from django.conf import settings
from django.db import connection
from rest_framework.test import APIClient

from accounts.models import ApiKey, Membership, Organization, User
from accounts.services import api_key_issue
from stacks.models import Stack, TeacherAssignment

_counter = itertools.count(1)


def make_org(name: str | None = None, *, kind: str = Organization.Kind.SCHOOL) -> Organization:
    n = next(_counter)
    name = name or f"School {n}"
    return Organization.objects.create(name=name, slug=f"school-{n}", kind=kind)


def make_user(org: Organization | None = None, *, role: str = Membership.Role.ADMIN, **fields: Any) -> User:
    n = next(_counter)
    user = User.objects.create_user(
        username=fields.pop("username", f"user{n}"),
        email=fields.pop("email", f"user{n}@example.test"),
        password=fields.pop("password", "correct horse battery staple"),
        **fields,
    )
    if org is not None:
        Membership.objects.create(user=user, organization=org, role=role)
    return user


def make_stack(org: Organization, slug: str | None = None, **fields: Any) -> Stack:
    return Stack.objects.create(organization=org, slug=slug or f"student-{next(_counter)}", **fields)


def assign_teacher(teacher: User, stack: Stack) -> None:
    TeacherAssignment.objects.create(user=teacher, stack=stack)


def make_key(org: Organization, *, stack: Stack | None = None, user: User | None = None,
             read_only: bool = False, name: str = "test") -> tuple[ApiKey, str]:
    """An API key and its secret. `stack` given: an agent key bound to it; else a school key."""
    owner = user or make_user(org)
    return api_key_issue(organization=org, user=owner, stack_id=stack.pk if stack else None,
                         name=name, read_only=read_only)


def bearer_client(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def session_client(user: User) -> APIClient:
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def other_connection(*, autocommit: bool = False) -> psycopg.Connection:
    """A second connection to the test database: another process's session, with its own locks and
    transactions (a push in progress, a job run still going). The caller closes it."""
    db = settings.DATABASES["default"]
    return psycopg.connect(host=db["HOST"], port=db["PORT"], user=db["USER"], dbname=db["NAME"],
                           password=db.get("PASSWORD") or None, autocommit=autocommit)


def index_definitions(table: str = "memories_memory") -> dict[str, str]:
    """Index name -> definition (pg_get_indexdef) of every index of the table."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s", [table])
        return dict(cursor.fetchall())
