"""Guardians in a roster import (docs/guardians.md "Guardians in the roster"): the plain CSV's
`guardian_email` column and OneRoster's parent rows linked through `agentSourcedIds` are previewed
per student, then invited (one invitation per family, e-mailed) or linked when applied; importing
the same file again changes nothing, and a member of staff cannot be named as a guardian."""

from __future__ import annotations

import pytest
from django.core import mail

from accounts.models import AuditEvent, Invitation, Membership
from stacks.models import GuardianLink
from stacks.roster import roster_parsed
from tests.actors import School
from tests.dashboard.pages import client_for
from tests.dashboard.test_roster import ONEROSTER_HEADER, apply, error_rows, outcomes, preview, token_of
from tests.factories import make_user

pytestmark = pytest.mark.django_db


def test_a_plain_roster_invites_each_family_once_for_all_its_children(school: School) -> None:
    known = make_user(school.org, role=Membership.Role.GUARDIAN, email="known@example.test")
    text = "\n".join(["student_id,name,grade,guardian_email",
                      "s-1,Ada,5,mum@example.test;known@example.test",
                      "s-2,Bea,3,mum@example.test",
                      "s-3,Cy,4,"])
    admin = client_for(school.admin)

    response = preview(admin, text)

    page = response.content.decode()
    assert response.status_code == 200 and outcomes(response) == {2: "create", 3: "create", 4: "create"}
    assert "invite guardian mum@example.test" in page and "link guardian known@example.test" in page
    assert "and e-mails 1 guardian invitation." in page  # one per family, however many children
    assert "guardian_email, optional" in page  # the format as read
    assert not Invitation.objects.exists()  # a preview writes nothing
    assert apply(admin, token_of(response)).status_code == 302

    invitation = Invitation.objects.get(organization=school.org)
    assert (invitation.email, invitation.role) == ("mum@example.test", "guardian")
    assert set(invitation.guardian_of.values_list("slug", flat=True)) == {"s-1", "s-2"}
    assert len(mail.outbox) == 1 and mail.outbox[0].to == ["mum@example.test"]
    assert list(GuardianLink.objects.filter(user=known).values_list("stack__slug", flat=True)) == ["s-1"]
    summary = AuditEvent.objects.get(organization=school.org, action="roster.imported")
    assert summary.metadata["guardians_invited"] == 1
    assert "1 guardian invitation created, 1 e-mailed" in admin.get("/dashboard/roster/").content.decode()

    again = preview(admin, text)  # the same file again: nothing left to do
    assert set(outcomes(again).values()) == {"unchanged"}


def test_oneroster_parent_rows_follow_their_agent_sourced_ids() -> None:
    data = "\n".join([
        ONEROSTER_HEADER,
        "stu-1,active,,true,org1,student,ada,,Ada,Lovelace,,S-1,,,,,05,",
        "stu-2,active,,true,org1,student,bo,,Bo,Lovelace,,S-2,,,,par-9,03,",
        'par-9,active,,true,org1,parent,pp,,Pat,Parent,,P-9,pat@example.test,,,"stu-1,stu-2",,',
        "par-8,active,,true,org1,guardian,gg,,Gus,Guard,,P-8,gus@example.test,,,stu-404,,",
    ]).encode()

    rows = roster_parsed(data).rows

    assert [row.guardians for row in rows[:2]] == [(("pat@example.test", "Pat Parent"),)] * 2
    assert rows[2].skip == "parent/guardian pat@example.test: imported with the student on row 2, 3"
    assert rows[3].skip == "parent/guardian gus@example.test of no student in this file"


def test_a_member_of_staff_or_a_bad_address_is_an_error_row_and_nothing_is_imported(school: School) -> None:
    text = "\n".join(["student_id,name,guardian_email",
                      f"s-1,Ada,{school.teacher.email}",
                      "s-2,Bea,not-an-address",
                      "s-3,Cy,fine@example.test"])
    admin = client_for(school.admin)

    response = preview(admin, text)

    assert response.status_code == 400
    errors = dict(error_rows(response))
    assert "belongs to a member of staff (teacher)" in errors[2]
    assert "not a valid e-mail address" in errors[3]
    assert not Invitation.objects.exists() and not GuardianLink.objects.exists()
