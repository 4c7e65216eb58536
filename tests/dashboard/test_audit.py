"""The audit page: a school admin reads who did what in their school, filters it, pages it and
downloads it; nobody else reads it, and no other school's events ever show."""

from __future__ import annotations

import csv
import io
import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts.models import AuditEvent, Membership
from accounts.principal import Principal
from accounts.services import api_key_revoke, audit_record
from tests.actors import School
from tests.dashboard.pages import client_for
from tests.factories import make_user

pytestmark = pytest.mark.django_db

URL = "/dashboard/audit/"


def test_an_admin_sees_who_did_what_to_what_with_the_key_prefix_for_key_actions(school: School) -> None:
    audit_record(organization=school.org, action="stack.archived", actor=school.admin, target_type="stack",
                 target_id="alice", ip="203.0.113.9", metadata={"reason": "left the school"})
    api_key_revoke(key=school.agent_key, principal=_key_principal(school), ip="198.51.100.4")

    response = client_for(school.admin).get(URL)

    assert response.status_code == 200
    page = response.content.decode()
    assert "Stack archived" in page and "alice" in page and "203.0.113.9" in page
    assert "reason=left the school" in page
    assert f"via key {school.admin_key.key_prefix}…" in page  # the school key revoked the agent key
    assert "Key revoked" in page and "198.51.100.4" in page
    assert school.admin_secret not in page and school.admin_key.key_hash not in page
    # A person targeted by an event is named by email beside their public id.
    audit_record(organization=school.org, action="member.role_changed", actor=school.admin, target_type="user",
                 target_id=school.teacher.public_id, metadata={"role": "admin"})
    page = client_for(school.admin).get(URL, {"action": "member.role_changed"}).content.decode()
    assert f"{school.teacher.email} <span class=\"muted small mono\">{school.teacher.public_id}</span>" in page


def _key_principal(school: School) -> Principal:
    return Principal(user=school.admin, organization=school.org, api_key=school.admin_key)


def test_another_schools_events_never_show_and_other_roles_get_404(school: School, other_school: School) -> None:
    audit_record(organization=other_school.org, action="stack.archived", actor=other_school.admin,
                 target_type="stack", target_id="secret-other-stack")
    page = client_for(school.admin).get(URL).content.decode()
    assert "secret-other-stack" not in page
    assert other_school.admin.email not in page  # not even among the actor choices

    assert client_for(school.teacher).get(URL).status_code == 404
    billing = make_user(school.org, role=Membership.Role.BILLING)
    assert client_for(billing).get(URL).status_code == 404
    assert Client().get(URL).status_code == 302  # to the sign-in page


def test_filters_narrow_by_action_actor_target_and_dates(school: School) -> None:
    old = audit_record(organization=school.org, action="stack.archived", actor=school.teacher,
                       target_type="stack", target_id="old-stack")
    AuditEvent.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=40))
    audit_record(organization=school.org, action="stack.archived", actor=school.admin, target_type="stack",
                 target_id="new-stack")
    audit_record(organization=school.org, action="member.added", actor=school.admin, target_type="user",
                 target_id="usr_new")
    client = client_for(school.admin)

    by_action = client.get(URL, {"action": "member.added"}).content.decode()
    assert "usr_new" in by_action and "new-stack" not in by_action

    by_actor = client.get(URL, {"actor": str(school.teacher.pk)}).content.decode()
    assert "old-stack" in by_actor and "new-stack" not in by_actor

    by_target = client.get(URL, {"target": "new-st"}).content.decode()
    assert "new-stack" in by_target and "old-stack" not in by_target

    since = (timezone.now() - timedelta(days=7)).date().isoformat()
    recent = client.get(URL, {"since": since}).content.decode()
    assert "new-stack" in recent and "old-stack" not in recent
    until = (timezone.now() - timedelta(days=30)).date().isoformat()
    older = client.get(URL, {"until": until}).content.decode()
    assert "old-stack" in older and "new-stack" not in older

    # The action filter offers the actions present, readable.
    assert re.search(r'<option value="member.added"[^>]*>Member added</option>', by_action)


@pytest.mark.parametrize("query", [
    {"since": "not-a-date"},
    {"since": "2025-02-01", "until": "2025-01-01"},
    {"action": "no.such.action"},
    {"actor": "abc"},
    {"actor": "999999999"},
])
def test_bad_filters_are_a_400_with_the_error_shown_never_a_500(school: School, query: dict[str, str]) -> None:
    response = client_for(school.admin).get(URL, query)
    assert response.status_code == 400
    assert 'class="errorlist"' in response.content.decode()


def test_pages_of_fifty_in_a_stable_newest_first_order_and_queries_do_not_grow(school: School) -> None:
    now = timezone.now()
    events = [AuditEvent(organization=school.org, action="stack.updated", actor=school.admin,
                         actor_key=school.admin_key, target_type="stack", target_id=f"s-{n:03d}",
                         created_at=now) for n in range(120)]
    AuditEvent.objects.bulk_create(events)
    # bulk_create keeps auto_now_add; give them all the same instant so only the id orders them.
    AuditEvent.objects.filter(organization=school.org, action="stack.updated").update(created_at=now)
    client = client_for(school.admin)

    def targets(page: int) -> list[str]:
        rows = client.get(URL, {"action": "stack.updated", "page": str(page)}).content.decode()
        return [f"s-{n:03d}" for n in range(120) if f">s-{n:03d}<" in rows]

    first, second, third = targets(1), targets(2), targets(3)
    assert len(first) == 50 and len(second) == 50 and len(third) == 20
    assert set(first) | set(second) | set(third) == {f"s-{n:03d}" for n in range(120)}
    assert max(first) == "s-119" and min(third) == "s-000"  # newest (highest id) first

    with CaptureQueriesContext(connection) as few:
        client.get(URL, {"action": "stack.updated", "page": "3"})  # 20 rows
    with CaptureQueriesContext(connection) as many:
        client.get(URL, {"action": "stack.updated", "page": "1"})  # 50 rows
    assert len(many) == len(few)


def test_the_csv_download_is_the_filtered_view_and_defuses_formulas(school: School) -> None:
    audit_record(organization=school.org, action="stack.created", actor=school.admin, target_type="stack",
                 target_id="=HYPERLINK(\"x\")")
    audit_record(organization=school.org, action="member.added", actor=school.admin, target_id="usr_x")
    response = client_for(school.admin).get(URL, {"action": "stack.created", "format": "csv"})
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    assert "attachment" in response["Content-Disposition"]
    rows = list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))  # type: ignore[attr-defined]
    assert rows[0][:3] == ["when (UTC)", "who", "action"]
    assert {row[2] for row in rows[1:]} == {"stack.created"}
    assert any(row[4] == "'=HYPERLINK(\"x\")" for row in rows[1:])


def test_an_empty_log_explains_what_will_appear(school: School) -> None:
    AuditEvent.objects.filter(organization=school.org).delete()
    page = client_for(school.admin).get(URL).content.decode()
    assert "Nothing has been recorded yet" in page
