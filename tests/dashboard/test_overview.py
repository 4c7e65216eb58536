"""The school overview (`/dashboard/`): who sees which stacks and figures, the table's sorting,
filters and pages, the charts' data as the write kernel recorded it, and a query count that does
not grow with the number of students or memories."""

from __future__ import annotations

import importlib
import re
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts.models import Membership, Organization
from accounts.services import api_key_revoke
from dashboard import overview as read_model
from memories.models import JobRun, Memory, StackDailyActivity
from memories.services import memory_batch_create, memory_create, memory_forget, memory_update
from stacks.models import Stack
from tests.actors import School
from tests.factories import assign_teacher, bearer_client, make_key, make_org, make_stack, make_user

pytestmark = pytest.mark.django_db


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def slugs_in_table(content: bytes) -> list[str]:
    return re.findall(r'<tr data-stack="([^"]+)"', content.decode())


def note(stack: Stack, text: str = "Fractions need common denominators") -> Memory:
    return memory_create(stack=stack, kind="note", payload={"content": text}, source="api")


def big_school() -> tuple[Organization, Any]:
    org = make_org(tier="unlimited")
    return org, make_user(org)


# --- who sees what --------------------------------------------------------------------------------


def test_admin_sees_every_stack_of_the_school_and_nothing_of_another(school: School, other_school: School) -> None:
    response = signed_in(school.admin).get("/dashboard/")
    assert response.status_code == 200
    assert slugs_in_table(response.content) == ["alice", "bob"]
    page = response.content.decode()
    assert other_school.org.name not in page
    assert 'id="job-runs"' in page or "No job has run yet" in page  # the admin's parts are there
    # Searching for a stack of another school finds nothing, never a hint that it exists.
    foreign = make_stack(other_school.org, "carol-elsewhere")
    searched = signed_in(school.admin).get("/dashboard/", {"q": foreign.slug})
    assert searched.status_code == 200 and slugs_in_table(searched.content) == []


def test_teacher_sees_only_assigned_stacks_and_no_school_wide_figures(school: School) -> None:
    JobRun.objects.create(name="decay", status=JobRun.Status.FAILED, error="boom",
                          organization_counts={str(school.org.pk): {"forgotten": 4}})
    key, _ = make_key(school.org, stack=school.stack, user=school.admin, name="expiring")
    key.expires_at = timezone.now() + timedelta(days=3)
    key.save(update_fields=["expires_at"])
    response = signed_in(school.teacher).get("/dashboard/")
    assert response.status_code == 200
    assert slugs_in_table(response.content) == ["alice"]
    page = response.content.decode()
    assert 'id="job-runs"' not in page and "chart-forgetting" not in page and "chart-storage" not in page
    assert 'data-attention="failed-job"' not in page and 'data-attention="expiring-key"' not in page
    assert 'name="teacher"' not in page  # a teacher's table is theirs already
    # A teacher's filter cannot widen what they see.
    assert slugs_in_table(signed_in(school.teacher).get("/dashboard/", {"q": "bob"}).content) == []
    widened = signed_in(school.teacher).get("/dashboard/", {"teacher": school.admin.pk})
    assert slugs_in_table(widened.content) == ["alice"]
    assert response.context["summary"].stacks == 1


def test_billing_user_is_sent_to_billing_and_strangers_to_sign_in(school: School) -> None:
    billing = make_user(school.org, role=Membership.Role.BILLING)
    response = signed_in(billing).get("/dashboard/")
    assert response.status_code == 302 and response["Location"] == "/dashboard/billing/"
    assert Client().get("/dashboard/").status_code == 302  # to sign in
    homeless = signed_in(make_user()).get("/dashboard/")
    assert homeless.status_code == 403 and b"alice" not in homeless.content


def test_empty_school_says_what_to_do_next() -> None:
    org = make_org()
    admin_page = signed_in(make_user(org)).get("/dashboard/").content.decode()
    assert 'id="overview-empty"' in admin_page
    assert 'href="/dashboard/roster/"' in admin_page and 'href="/dashboard/students/new"' in admin_page
    teacher_page = signed_in(make_user(org, role=Membership.Role.TEACHER)).get("/dashboard/").content.decode()
    assert "Ask a school admin" in teacher_page and 'href="/dashboard/students/new"' not in teacher_page


# --- the table: sorting, filters, pages ---------------------------------------------------------


def test_sorting_by_each_column_server_side() -> None:
    org, admin = big_school()
    now = timezone.now()
    make_stack(org, "s-a", memory_count=5, bytes_used=300, last_sync_at=now - timedelta(days=1))
    make_stack(org, "s-b", memory_count=50, bytes_used=100, last_write_at=now - timedelta(hours=1))
    make_stack(org, "s-c", memory_count=1, bytes_used=200, last_sync_at=now, last_write_at=now - timedelta(days=2))
    client = signed_in(admin)

    def order(sort: str) -> list[str]:
        return slugs_in_table(client.get("/dashboard/", {"sort": sort}).content)

    assert order("name") == ["s-a", "s-b", "s-c"] and order("-name") == ["s-c", "s-b", "s-a"]
    assert order("-memories") == ["s-b", "s-a", "s-c"] and order("memories") == ["s-c", "s-a", "s-b"]
    assert order("-storage") == ["s-a", "s-c", "s-b"]
    assert order("-sync") == ["s-c", "s-a", "s-b"]  # never synced: last either way
    assert order("sync") == ["s-a", "s-c", "s-b"]
    assert order("-write") == ["s-b", "s-c", "s-a"]
    page = client.get("/dashboard/", {"sort": "-memories"}).content.decode()
    assert 'aria-sort="descending"' in page


def test_the_students_name_is_the_link_with_the_id_beside_it_and_sorts_the_table() -> None:
    org, admin = big_school()
    make_stack(org, "s-1", display_name="Zoe Young")
    make_stack(org, "s-2", display_name="ada Brook")
    make_stack(org, "s-3")  # no name: the id is the link
    page = signed_in(admin).get("/dashboard/").content.decode()
    assert '<a href="/dashboard/students/s-1/">Zoe Young</a> <code class="muted small nowrap">s-1</code>' in page
    assert '<a href="/dashboard/students/s-3/">s-3</a></td>' in page
    assert slugs_in_table(page.encode()) == ["s-2", "s-3", "s-1"]  # by the shown name, any case


def test_filters_by_text_teacher_and_status() -> None:
    org, admin = big_school()
    ada = make_user(org, role=Membership.Role.TEACHER, first_name="Ada", last_name="Lovelace")
    maths = make_stack(org, "maths-1", display_name="Mina Park")
    make_stack(org, "maths-2", display_name="Ola Berg", status=Stack.Status.ARCHIVED)
    make_stack(org, "art-1", display_name="Park Jun")
    assign_teacher(ada, maths)
    client = signed_in(admin)
    assert slugs_in_table(client.get("/dashboard/", {"q": "maths"}).content) == ["maths-1", "maths-2"]
    assert slugs_in_table(client.get("/dashboard/", {"q": "PARK"}).content) == ["maths-1", "art-1"]  # by name
    assert slugs_in_table(client.get("/dashboard/", {"teacher": ada.pk}).content) == ["maths-1"]
    assert slugs_in_table(client.get("/dashboard/", {"status": "archived"}).content) == ["maths-2"]
    assert slugs_in_table(client.get("/dashboard/", {"status": "active", "q": "maths"}).content) == ["maths-1"]
    page = client.get("/dashboard/").content.decode()
    assert "Ada Lovelace" in page and '<span class="badge">archived</span>' in page
    nothing = client.get("/dashboard/", {"q": "nobody-like-this"}).content.decode()
    assert "No student matches these filters" in nothing


@pytest.mark.parametrize("params", [{"sort": "password"}, {"status": "deleted"}, {"page": "0"},
                                    {"q": "a\x00b"}, {"q": "x" * 500}, {"teacher": "abc"}])
def test_bad_filters_are_a_400_page_with_the_reason_never_a_500(school: School, params: dict[str, str]) -> None:
    response = signed_in(school.admin).get("/dashboard/", params)
    assert response.status_code == 400
    assert b'id="filter-errors"' in response.content
    assert slugs_in_table(response.content) == ["alice", "bob"]  # the unfiltered table


def test_a_teacher_of_another_school_is_no_filter_choice(school: School, other_school: School) -> None:
    response = signed_in(school.admin).get("/dashboard/", {"teacher": other_school.teacher.pk})
    assert response.status_code == 400


def test_pages_of_fifty_with_a_page_past_the_end_showing_the_last() -> None:
    org, admin = big_school()
    Stack.objects.bulk_create([Stack(organization=org, slug=f"kid-{i:03d}") for i in range(120)])
    client = signed_in(admin)
    first = client.get("/dashboard/")
    assert slugs_in_table(first.content) == [f"kid-{i:03d}" for i in range(50)]
    assert b"Page 1 of 3" in first.content and b"page=2" in first.content
    third = client.get("/dashboard/", {"page": "3", "sort": "-name"})
    assert slugs_in_table(third.content) == [f"kid-{i:03d}" for i in range(19, -1, -1)]
    assert slugs_in_table(client.get("/dashboard/", {"page": 99}).content) == slugs_in_table(
        client.get("/dashboard/", {"page": 3}).content)


def test_an_htmx_request_for_the_table_gets_the_table_alone(school: School) -> None:
    response = signed_in(school.admin).get("/dashboard/", {"sort": "-name"}, HTTP_HX_REQUEST="true",
                                           HTTP_HX_TARGET="stacks-panel")
    assert response.status_code == 200
    page = response.content.decode()
    assert page.lstrip().startswith('<section id="stacks-panel"')
    assert "Needs attention" not in page and "<html" not in page
    assert slugs_in_table(response.content) == ["bob", "alice"]


# --- what the figures count ------------------------------------------------------------------------


def test_the_written_per_day_chart_counts_what_the_kernel_wrote_through_services_and_sync() -> None:
    org, admin = big_school()
    stack, other = make_stack(org, "writer"), make_stack(org, "quiet")
    assert stack.last_write_at is None
    first = note(stack)
    memory_batch_create(stack=stack, items=[{"kind": "note", "content": f"item {i}"} for i in range(3)], source="api")
    memory_update(memory=first, payload={"content": "Fractions need a common denominator first"}, source="api")
    memory_forget(memory=Memory.objects.get(pk=first.pk), reason="test", source="dashboard")  # no write of content
    # A kernle-native push through the API: two new records, then one of them changed.
    _, secret = make_key(org, stack=stack, user=admin)
    agent = bearer_client(secret)
    ops = [{"op": "upsert", "kind": "note", "record_id": f"r{i}", "updated_at": "2026-11-21T23:00:00+00:00",
            "data": {"content": f"pushed {i}"}} for i in range(2)]
    assert agent.post("/api/v1/stacks/writer/sync/push", {"operations": ops}, format="json").status_code == 200
    ops[0]["data"] = {"content": "pushed 0, revised"}
    ops[0]["updated_at"] = "2026-11-22T23:00:00+00:00"
    assert agent.post("/api/v1/stacks/writer/sync/push", {"operations": ops[:1]}, format="json").status_code == 200

    today = timezone.now().date()
    assert StackDailyActivity.objects.get(stack=stack, day=today).written == 1 + 3 + 1 + 2 + 1
    assert not StackDailyActivity.objects.filter(stack=other).exists()
    stack.refresh_from_db()
    assert stack.last_write_at is not None and stack.last_sync_at is not None
    response = signed_in(admin).get("/dashboard/", {"sort": "-write"})
    chart = response.context["written_chart"]
    per_day = chart["datasets"][0]["data"]
    assert len(chart["labels"]) == 30 and per_day[-1] == 8 and sum(per_day) == 8
    assert slugs_in_table(response.content) == ["writer", "quiet"]


def test_the_migration_backfill_counts_stored_memories_once_per_creation_day() -> None:
    migration = importlib.import_module("memories.migrations.0015_stack_daily_activity")
    org, _ = big_school()
    stack = make_stack(org)
    note(stack)
    old = note(stack, "An older memory")
    two_days_ago = timezone.now() - timedelta(days=2)
    Memory.objects.filter(pk=old.pk).update(created_at=two_days_ago)
    StackDailyActivity.objects.all().delete()
    Stack.objects.filter(pk=stack.pk).update(last_write_at=None)
    with connection.cursor() as cursor:
        cursor.execute(migration.BACKFILL_ACTIVITY_SQL)
        cursor.execute(migration.BACKFILL_LAST_WRITE_SQL)
    days = dict(StackDailyActivity.objects.filter(stack=stack).values_list("day", "written"))
    assert days == {timezone.now().date(): 1, two_days_ago.date(): 1}
    stack.refresh_from_db()
    assert stack.last_write_at is not None and stack.last_write_at > two_days_ago


def test_attention_lists_failed_runs_backlog_and_keys_about_to_expire(school: School, other_school: School,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(read_model, "BACKLOG_ATTENTION", 2)
    for text in ("one", "two", "three"):
        note(school.stack, text)  # never embedded here: no worker runs in these tests
    note(other_school.stack)
    JobRun.objects.create(name="ttl_purge", status=JobRun.Status.FAILED, error="secret detail")
    JobRun.objects.filter(status=JobRun.Status.FAILED).update(started_at=timezone.now() - timedelta(hours=1))
    soon, _ = make_key(school.org, stack=school.stack, user=school.admin, name="soon")
    later, _ = make_key(school.org, user=school.admin, name="later")
    revoked, _ = make_key(school.org, user=school.admin, name="revoked")
    foreign, _ = make_key(other_school.org, user=other_school.admin, name="foreign")
    now = timezone.now()
    for key, days in ((soon, 3), (later, 40), (revoked, 2), (foreign, 2)):
        key.expires_at = now + timedelta(days=days)
        key.save(update_fields=["expires_at"])
    api_key_revoke(key=revoked)
    response = signed_in(school.admin).get("/dashboard/")
    attention = response.context["attention"]
    assert [k.pk for k in attention.expiring_keys] == [soon.pk]
    assert attention.backlog == 3 and attention.backlog_alert and not attention.backlog_capped
    assert [item.run.name for item in attention.failed_runs] == ["ttl_purge"]
    page = response.content.decode()
    assert 'data-attention="backlog"' in page and 'data-attention="expiring-key"' in page
    assert "secret detail" not in page  # a school sees that a run failed, not the service's error
    row = re.search(r'<tr data-stack="alice">.*?</tr>', page, re.S)
    assert row and '<span class="badge warn">3</span>' in row.group(0)


def test_forgetting_per_week_is_the_schools_share_of_the_job_runs(school: School, other_school: School) -> None:
    mine, theirs = str(school.org.pk), str(other_school.org.pk)
    JobRun.objects.create(name="decay", status=JobRun.Status.SUCCEEDED,
                          organization_counts={mine: {"forgotten": 7}, theirs: {"forgotten": 100}})
    JobRun.objects.create(name="decay", status=JobRun.Status.SUCCEEDED, organization_counts={theirs: {"forgotten": 1}})
    JobRun.objects.create(name="ttl_purge", status=JobRun.Status.SUCCEEDED, organization_counts={mine: {"purged": 2}})
    JobRun.objects.create(name="decay", status=JobRun.Status.SKIPPED)
    response = signed_in(school.admin).get("/dashboard/")
    chart = response.context["forgetting_chart"]
    forgotten, purged = (dataset["data"] for dataset in chart["datasets"])
    assert forgotten[-1] == 7 and sum(forgotten) == 7 and purged[-1] == 2 and len(chart["labels"]) >= 5
    runs = response.context["job_runs"]
    assert {item.run.name for item in runs} == {"decay", "ttl_purge"}
    assert {"forgotten": 100} not in [item.counts for item in runs]  # only this school's share
    assert [("forgotten", 7)] in [item.count_items for item in runs]


def test_storage_is_shown_against_the_plans_quota(school: School) -> None:
    Stack.objects.filter(pk=school.stack.pk).update(bytes_used=256 * 1024 * 1024)
    response = signed_in(school.admin).get("/dashboard/")
    quota = response.context["quota"]
    assert quota.plan == "pro" and quota.limit == 1024 ** 3 and quota.percent_label == "25.0%"
    chart = response.context["storage_chart"]
    assert [d["data"] for d in chart["datasets"]] == [[256.0], [768.0]] and chart["max"] == 1024.0
    assert b"256.0\xc2\xa0MB" in response.content


def test_an_unlimited_plan_shows_its_storage_as_a_figure_without_a_limit_bar() -> None:
    org, admin = big_school()  # the unlimited plan
    make_stack(org, "s-1", bytes_used=30 * 1024)
    response = signed_in(admin).get("/dashboard/")
    page = response.content.decode()
    assert response.context["quota"].limit is None and response.context["storage_chart"] is None
    assert 'id="storage"' in page and "chart-storage" not in page  # no bar filling its own axis
    assert re.search(r'<p class="stat" id="storage-used">30\.0\xa0KB</p>', page)
    assert "which has no storage limit" in page


def test_a_school_with_unreviewed_no_limit_retention_is_asked_until_an_admin_sets_it(
        school: School, other_school: School) -> None:
    new_school = signed_in(school.admin).get("/dashboard/").content.decode()
    assert 'data-attention="retention"' not in new_school  # a new school has a limit for every kind
    # A school from before the finite defaults: one kind (or all) without a limit, never reviewed.
    Organization.objects.filter(pk=school.org.pk).update(retention_days={"raw": 365})
    page = signed_in(school.admin).get("/dashboard/").content.decode()
    assert 'data-attention="retention"' in page and 'href="/dashboard/privacy/"' in page
    teacher = signed_in(school.teacher).get("/dashboard/").content.decode()
    assert 'data-attention="retention"' not in teacher  # a school setting: admins are asked
    assert 'data-attention="retention"' not in signed_in(other_school.admin).get("/dashboard/").content.decode()

    # The admin saves the Privacy page leaving the other kinds blank: "no limit" is now a choice.
    posted = signed_in(school.admin).post("/dashboard/privacy/", {
        "retention_raw": "365", "redaction_categories": ["EMAIL", "PHONE", "IP_ADDRESS"],
        "empty_grants_policy": "school"})
    assert posted.status_code == 302
    organization = Organization.objects.get(pk=school.org.pk)
    assert organization.retention_days == {"raw": 365} and organization.retention_reviewed_at is not None
    assert 'data-attention="retention"' not in signed_in(school.admin).get("/dashboard/").content.decode()


# --- cost -------------------------------------------------------------------------------------------


def _school_with(org: Organization, n_stacks: int, teachers: list[Any], admin: Any) -> None:
    existing = Stack.objects.filter(organization=org).count()
    for i in range(existing, existing + n_stacks):
        stack = make_stack(org, f"kid-{i:03d}", display_name=f"Kid {i}")
        assign_teacher(teachers[i % len(teachers)], stack)
        memory_batch_create(stack=stack, items=[{"kind": "note", "content": f"memory {j} of {i}"} for j in range(3)],
                            source="api")
        key, _ = make_key(org, stack=stack, user=admin, name=f"key {i}")
        key.expires_at = timezone.now() + timedelta(days=5)
        key.save(update_fields=["expires_at"])
    JobRun.objects.create(name="decay", status=JobRun.Status.FAILED,
                          organization_counts={str(org.pk): {"forgotten": 1}})


def _queries(client: Client, params: dict[str, str | int] | None = None) -> list[str]:
    with CaptureQueriesContext(connection) as captured:
        response = client.get("/dashboard/", params or {})
    assert response.status_code == 200
    return [query["sql"] for query in captured.captured_queries]


def test_query_count_does_not_grow_with_students_or_memories() -> None:
    org = make_org(tier="unlimited")
    admin = make_user(org)
    teachers = [make_user(org, role=Membership.Role.TEACHER) for _ in range(3)]
    _school_with(org, 5, teachers, admin)
    admin_client, teacher_client = signed_in(admin), signed_in(teachers[0])
    variants: list[dict[str, str | int]] = [{}, {"sort": "-memories", "status": "active", "q": "kid"},
                                      {"teacher": teachers[1].pk, "sort": "-write"}]
    small = [_queries(admin_client, params) for params in variants] + [_queries(teacher_client)]
    _school_with(org, 55, teachers, admin)  # 60 students, 180 memories, 60 keys about to expire
    large = [_queries(admin_client, params) for params in variants] + [_queries(teacher_client)]
    assert [len(q) for q in large] == [len(q) for q in small], "\n".join(large[0])
    assert len(large[0]) <= 20, "\n".join(large[0])
    assert len(slugs_in_table(admin_client.get("/dashboard/").content)) == 50  # a full page
