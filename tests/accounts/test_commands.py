"""create_school and seed_demo management commands."""

from __future__ import annotations

import re
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from accounts.models import ApiKey, Membership, Organization
from stacks.models import Stack, TeacherAssignment
from tests.factories import bearer_client

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_create_school_prints_a_working_admin_login_and_is_idempotent() -> None:
    output = run("create_school", "Lincoln High", "--admin-email", "head@lincoln.test", "--slug", "lincoln")
    password = re.search(r"password:\s+(\S+)", output).group(1)  # type: ignore[union-attr]
    org = Organization.objects.get(slug="lincoln")
    assert org.kind == "school"
    membership = Membership.objects.get(organization=org)
    assert membership.role == "admin" and membership.user.email == "head@lincoln.test"
    assert Client().login(username="head@lincoln.test", password=password)
    again = run("create_school", "Lincoln High", "--admin-email", "head@lincoln.test", "--slug", "lincoln")
    assert "already exists" in again and Organization.objects.count() == 1
    with pytest.raises(CommandError):
        run("create_school", "Lincoln High", "--admin-email", "other@lincoln.test", "--slug", "lincoln")


def test_seed_demo_creates_a_school_with_teachers_stacks_and_working_keys_idempotently() -> None:
    output = run("seed_demo", "--students", "4", "--teachers", "2")
    org = Organization.objects.get(slug="demo-school")
    assert Stack.objects.filter(organization=org).count() == 4
    assert TeacherAssignment.objects.filter(stack__organization=org).count() == 4
    roles = sorted(Membership.objects.filter(organization=org).values_list("role", flat=True))
    assert roles == ["admin", "billing", "teacher", "teacher"]
    secrets = re.findall(r"knl_sk_[0-9a-f]{32}", output)
    assert len(secrets) == 5  # one school key + one per student
    agent = re.search(r"agent key for student-0001: (knl_sk_\w+)", output).group(1)  # type: ignore[union-attr]
    response = bearer_client(agent).get("/api/v1/stacks/")
    assert [s["stack_id"] for s in response.json()["results"]] == ["student-0001"]
    assert "/login/ as admin@demo-school.test with the password 'demo-password-123'" in output

    # Every student's stack has a month of memories of every kind, through the write kernel.
    from memories.models import BootConfigEntry, Checkpoint, Memory

    stack = Stack.objects.get(organization=org, slug="student-0001")
    memories = Memory.objects.filter(stack=stack)
    assert stack.memory_count == memories.count() >= 20
    assert set(memories.values_list("kind", flat=True)) == {
        "raw", "episode", "note", "belief", "value", "goal", "drive", "relationship", "playbook"}
    days = {m.created_at.date() for m in memories}
    assert len(days) >= 10  # spread over the month, not all today
    assert memories.filter(forgotten_at__isnull=False).count() == 1
    assert Checkpoint.objects.filter(stack=stack).count() == 1
    assert set(BootConfigEntry.objects.filter(stack=stack).values_list("key", flat=True)) == {
        "tone", "session_minutes"}
    total = Memory.objects.filter(stack__organization=org).count()
    # The overview's per-day rollup counts them on the days they are dated, not all today.
    from memories.models import StackDailyActivity

    activity = dict(StackDailyActivity.objects.filter(stack=stack).values_list("day", "written"))
    assert sum(activity.values()) == memories.count() and len(activity) == len(days)

    again = run("seed_demo", "--students", "4", "--teachers", "2")
    assert not re.findall(r"knl_sk_", again)  # nothing new to show
    assert ApiKey.objects.filter(organization=org).count() == 5
    assert Stack.objects.filter(organization=org).count() == 4
    assert Memory.objects.filter(stack__organization=org).count() == total  # no duplicates
    assert Checkpoint.objects.filter(stack__organization=org).count() == 4


# --- from a password to a key: create_school --issue-key and issue_key ---------------------------------

KEY = re.compile(r"knl_sk_[0-9a-f]{32}")


def _exported(output: str) -> dict[str, str]:
    """The `export MEMORYHUB_URL=… MEMORYHUB_KEY=…` line a command printed, as a dict."""
    line = next(line for line in output.splitlines() if line.strip().startswith("export MEMORYHUB_URL="))
    return dict(part.split("=", 1) for part in line.split()[1:])


def _state() -> tuple[int, ...]:
    from accounts.models import AuditEvent, User

    return (Organization.objects.count(), User.objects.count(), Membership.objects.count(), ApiKey.objects.count(),
            AuditEvent.objects.count())


def test_create_school_twice_without_a_slug_changes_nothing_the_second_time() -> None:
    first = run("create_school", "Hill School", "--admin-email", "a@hill.test", "--issue-key")
    assert Organization.objects.get().slug == "hill-school"
    before = _state()
    again = run("create_school", "Hill School", "--admin-email", "A@Hill.test", "--issue-key")
    assert "already exists" in again and "nothing changed" in again
    assert "password" not in again and not KEY.search(again)  # no new secret of any kind
    assert "manage.py issue_key --school hill-school" in again
    assert _state() == before
    assert len(KEY.findall(first)) == 1


def test_create_school_issue_key_prints_a_working_key_once_and_stores_only_its_hash(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("DEBUG")
    output = run("create_school", "Hill School", "--admin-email", "a@hill.test", "--issue-key",
                 "--url", "http://127.0.0.1:8123")
    exported = _exported(output)
    secret = exported["MEMORYHUB_KEY"]
    assert exported["MEMORYHUB_URL"] == "http://127.0.0.1:8123"
    assert KEY.fullmatch(secret)
    key = ApiKey.objects.get()
    assert key.stack_id is None and not key.read_only and key.user.email == "a@hill.test"
    assert secret not in str(ApiKey.objects.filter(pk=key.pk).values().get())  # only a hash is stored
    assert secret not in caplog.text  # never logged
    from accounts.models import AuditEvent

    assert AuditEvent.objects.filter(action="key.issued", target_id=key.public_id).exists()
    listed = bearer_client(secret).get("/api/v1/stacks/")
    assert listed.status_code == 200
    created = bearer_client(secret).post("/api/v1/stacks/", {"stack_id": "ada"}, format="json")
    assert created.status_code == 201, created.content


def test_create_school_for_an_email_of_another_account_says_so_and_creates_nothing() -> None:
    run("create_school", "Hill School", "--admin-email", "a@hill.test")
    before = _state()
    with pytest.raises(CommandError, match=re.escape("a@hill.test already has an account")):
        run("create_school", "Dale School", "--admin-email", "a@hill.test", "--issue-key")
    with pytest.raises(CommandError, match="not its admin"):
        run("create_school", "Hill School", "--admin-email", "b@hill.test")
    assert _state() == before


def test_issue_key_school_wide_stack_bound_read_only_expiring() -> None:
    run("create_school", "Hill School", "--admin-email", "a@hill.test")
    school = Organization.objects.get(slug="hill-school")
    admin_secret = _exported(run("issue_key", "--school", "hill-school", "--name", "ops"))["MEMORYHUB_KEY"]
    assert bearer_client(admin_secret).post("/api/v1/stacks/", {"stack_id": "ada"}, format="json").status_code == 201
    from tests.factories import TEST_TIER, make_stack

    Organization.objects.filter(pk=school.pk).update(tier=TEST_TIER)  # a free school has one stack
    school.refresh_from_db()
    make_stack(school, "ben")

    output = run("issue_key", "--email", "a@hill.test", "--stack", "ada", "--read-only", "--expires-in-days", "3")
    assert "export KERNLE_STACK_ID=ada" in output and "read-only" in output
    secret = _exported(output)["MEMORYHUB_KEY"]
    key = ApiKey.objects.get(stack__slug="ada")
    assert key.organization == school and key.read_only and key.name == ""
    assert key.expires_at is not None and 2.9 < (key.expires_at - key.created_at).total_seconds() / 86400 < 3.1
    client = bearer_client(secret)
    assert client.get("/api/v1/stacks/ada/memories").status_code == 200
    assert client.get("/api/v1/stacks/ben/memories").status_code == 404  # bound to its stack
    assert client.post("/api/v1/stacks/ada/memories", {"kind": "note", "content": "x"},
                       format="json").status_code == 403  # read-only
    assert ApiKey.objects.get(name="ops").stack_id is None


@pytest.mark.parametrize(("args", "message"), [
    ((), "Say which school"),
    (("--school", "nope"), "No school with slug 'nope'"),
    (("--school", "hill-school", "--stack", "zed"), "No stack 'zed' in Hill School (hill-school)"),
    (("--email", "ghost@hill.test"), "No person with email 'ghost@hill.test'"),
    (("--school", "hill-school", "--expires-in-days", "0"), "--expires-in-days must be at least 1"),
    (("--school", "hill-school", "--stack", "old"), "archived"),
])
def test_issue_key_refuses_clearly_and_issues_nothing(args: tuple[str, ...], message: str) -> None:
    run("create_school", "Hill School", "--admin-email", "a@hill.test")
    from tests.factories import make_stack

    make_stack(Organization.objects.get(slug="hill-school"), "old", status=Stack.Status.ARCHIVED)
    with pytest.raises(CommandError, match=re.escape(message)):
        run("issue_key", *args)
    assert not ApiKey.objects.exists()


@pytest.mark.slow
def test_a_command_error_is_one_line_and_exit_1_without_a_traceback() -> None:
    import os

    from tests.conftest import run_manage
    from tests.factories import database_url_for_processes

    done = run_manage("issue_key", "--school", "no-such-school",
                      env=dict(os.environ, DATABASE_URL=database_url_for_processes()))
    assert done.returncode == 1
    assert done.stderr.strip() == ("CommandError: No school with slug 'no-such-school' (see the dashboard, or "
                                   "create it with `manage.py create_school`).")
    assert "Traceback" not in done.stdout + done.stderr
