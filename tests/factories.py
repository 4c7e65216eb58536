"""Building blocks for tests: organizations, people, stacks, keys and authenticated clients.

These write through the real services and the real database; nothing is mocked.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections import namedtuple
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import psycopg
from django.conf import settings
from django.db import connection
from rest_framework.test import APIClient

from accounts.models import ApiKey, Membership, Organization, User
from accounts.services import api_key_issue, membership_add, organization_create, user_create
from stacks.models import Stack
from stacks.services import stack_archive, stack_create, teacher_assign

_counter = itertools.count(1)

# The tier `make_org` gives a school unless a test names one. Many tests give a school several
# stacks; on the free tier (one active stack) `stack_create` would refuse the second, which is not
# what they test. "pro" has room for ten and still a storage limit, so writes still run the storage
# check. Quota tests name the tier they test: make_org(tier="free").
TEST_TIER = "pro"


def make_org(name: str | None = None, *, kind: str = Organization.Kind.SCHOOL, tier: str = TEST_TIER) -> Organization:
    n = next(_counter)
    return organization_create(name=name or f"School {n}", slug=f"school-{n}", kind=kind, tier=tier)


def make_user(org: Organization | None = None, *, role: str = Membership.Role.ADMIN, **fields: Any) -> User:
    n = next(_counter)
    user = user_create(
        username=fields.pop("username", f"user{n}"),
        email=fields.pop("email", f"user{n}@example.test"),
        password=fields.pop("password", "correct horse battery staple"),
        **fields,
    )
    if org is not None:
        membership_add(organization=org, user=user, role=role)
    return user


def make_stack(org: Organization, slug: str | None = None, *, status: str = Stack.Status.ACTIVE,
               **fields: Any) -> Stack:
    """A stack made by `stack_create` (so under its quota), archived through `stack_archive` if
    `status` says so. Other `fields` are counters no service sets directly (e.g. `bytes_used`, to
    stand for memories stored): they are written straight after. The stack keeps `org` as its
    `organization` object, so a test that changes `org.tier` afterwards is seen through the stack."""
    descriptive = {name: fields.pop(name) for name in ("display_name", "kind") if name in fields}
    stack = stack_create(organization=org, slug=slug or f"student-{next(_counter)}", **descriptive)
    if status == Stack.Status.ARCHIVED:
        stack_archive(stack=stack)
        stack.refresh_from_db(fields=["status", "archived_at", "updated_at"])
    if fields:
        Stack.objects.filter(pk=stack.pk).update(**fields)
        for name, value in fields.items():
            setattr(stack, name, value)
    return stack


def assign_teacher(teacher: User, stack: Stack) -> None:
    teacher_assign(stack=stack, teacher=teacher)


def make_key(org: Organization, *, stack: Stack | None = None, user: User | None = None,
             read_only: bool = False, name: str = "test", stack_agent: bool | None = None) -> tuple[ApiKey, str]:
    """An API key and its secret. `stack` given: an agent key bound to it — the stack's own agent
    key (`stack_agent`, what a student's tutor agent holds) unless `stack_agent=False`, which makes
    a key that reads what its issuer may read; else a school key."""
    owner = user or make_user(org)
    return api_key_issue(organization=org, user=owner, stack_id=stack.pk if stack else None,
                         name=name, read_only=read_only,
                         stack_agent=stack is not None if stack_agent is None else stack_agent)


def bearer_client(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def session_client(user: User) -> APIClient:
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def database_conninfo() -> str:
    """How another process reaches the test database (a libpq connection string)."""
    db = settings.DATABASES["default"]
    return psycopg.conninfo.make_conninfo(host=db["HOST"], port=db["PORT"], user=db["USER"], dbname=db["NAME"],
                                          password=db.get("PASSWORD") or None)


def other_connection(*, autocommit: bool = False) -> psycopg.Connection:
    """A second connection to the test database: another process's session, with its own locks and
    transactions (a push in progress, a job run still going). The caller closes it."""
    return psycopg.connect(database_conninfo(), autocommit=autocommit)


SqlParams = Sequence[Any] | Mapping[str, Any] | None


def sql_rows(sql: str, params: SqlParams = None) -> list[Any]:
    """Run `sql` on the test's connection. Each row is a namedtuple whose fields are the result's
    column names, so tests read `row.page`, never `row[1]`; name computed columns (`... AS page`)."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row_type = namedtuple("Row", [column.name for column in cursor.description])  # type: ignore[misc]
        return [row_type._make(values) for values in cursor.fetchall()]


def sql_values(sql: str, params: SqlParams = None) -> list[Any]:
    """The values of a one-column result (ids, EXPLAIN's plan lines), in order."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        assert len(cursor.description) == 1, f"one column expected: {sql}"
        return [value for (value,) in cursor.fetchall()]


def sql_value(sql: str, params: SqlParams = None) -> Any:
    """The value of a one-row, one-column result (`SHOW x`, `SELECT count(*)`)."""
    (value,) = sql_values(sql, params)
    return value


def index_definitions(table: str = "memories_memory") -> dict[str, str]:
    """Index name -> definition (pg_get_indexdef) of every index of the table."""
    rows = sql_rows("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s", [table])
    return {row.indexname: row.indexdef for row in rows}


def database_url_for_processes() -> str:
    """The test database as a URL, for processes the tests start (a worker, a web server, a command)."""
    db = settings.DATABASES["default"]
    return f"postgresql://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


def wait_for_health(base_url: str, *, alive: Callable[[], bool], log: Path, timeout: float = 90) -> None:
    """Poll `GET /health` of a server the test started until it answers 200; fail with its log if
    the process dies or the time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            raise AssertionError("the web server died:\n" + log.read_text()[-4000:])
        try:
            if httpx.get(f"{base_url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"the web server did not answer /health in {timeout:.0f} s:\n" + log.read_text()[-4000:])


def kernle_note_inserts(count: int) -> list[dict[str, Any]]:
    """`count` kernle push operations, each inserting a new note."""
    return [{"operation": "insert", "table": "notes", "record_id": str(uuid.uuid4()), "local_updated_at": None,
             "version": 1, "data": {"content": f"Fractions practice, part {i}", "note_type": "note"}}
            for i in range(count)]
