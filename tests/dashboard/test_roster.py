"""The roster: add one student, import a roster CSV (preview, then apply: all rows or none),
archive and unarchive, assign and unassign teachers — school admins only.

The first tests read files with stacks.roster directly; the rest drive the pages as an admin would.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.http import HttpResponse
from django.test import Client

from accounts.models import AuditEvent, Membership, Organization, User
from memoryhub.errors import InvalidInput, PayloadTooLarge
from stacks.models import Stack, TeacherAssignment
from stacks.roster import MAX_FILE_BYTES, MAX_ROWS, RosterFormat, roster_parsed
from tests.actors import School
from tests.dashboard.pages import client_for
from tests.factories import make_key, make_org, make_stack, make_user

DATA = Path(__file__).parent / "data"
ROSTER = "/dashboard/roster/"
ONEROSTER_HEADER = ("sourcedId,status,dateLastModified,enabledUser,orgSourcedIds,role,username,userIds,givenName,"
                    "familyName,middleName,identifier,email,sms,phone,agentSourcedIds,grades,password")


# --- reading files (no database) ---------------------------------------------------------------


def test_a_plain_roster_is_read_with_spreadsheet_row_numbers() -> None:
    data = ("\ufeffstudent_id,name,grade,teacher_email\r\n"
            "s-1,Ada Lovelace,5,t@x.test\r\n"
            "\r\n"  # a blank row in the sheet: not imported, still counted
            "s-2,\"Turing, Alan\",6,a@x.test; b@x.test\r\n"
            "bad id!,Grace,5,\r\n").encode()

    roster = roster_parsed(data)

    assert roster.format is RosterFormat.PLAIN
    assert [(row.row, row.student_id, row.name, row.grade, row.teacher_emails, row.problem) for row in roster.rows] == [
        (2, "s-1", "Ada Lovelace", "5", ("t@x.test",), ""),
        (4, "s-2", "Turing, Alan", "6", ("a@x.test", "b@x.test"), ""),
        (5, "bad id!", "Grace", "5", (), "Invalid student_id: may contain only letters, digits, '-', '_' and '.'."),
    ]


def test_columns_may_come_in_any_order_and_semicolons_separate_them() -> None:
    roster = roster_parsed(b"name;student_id\nAda;s-1\n;\n")

    assert [(row.student_id, row.name, row.grade, row.teacher_emails) for row in roster.rows] == [
        ("s-1", "Ada", "", ())]


def test_a_missing_student_id_and_extra_cells_are_row_problems() -> None:
    roster = roster_parsed(b"student_id,name\n,Ada\ns-2,Bo,surplus\n")

    assert [(row.row, row.problem) for row in roster.rows] == [
        (2, "student_id is missing"), (3, "has 3 cells but the header has 2 columns")]


def test_a_oneroster_users_file_keeps_students_and_skips_other_roles() -> None:
    data = "\n".join([
        ONEROSTER_HEADER,
        "guid-1,active,,true,org1,student,ada,,Ada,Lovelace,,S 1001,,,,,05,",
        "guid-2,active,,true,org1,teacher,mc,,Marie,Curie,,T-1,mc@x.test,,,,,",
        "guid/3,,,true,org1,student,al,,Alan,Turing,,,,,,,06,",  # no identifier: the sourcedId, fitted
        "guid-4,tobedeleted,,true,org1,student,gh,,Grace,Hopper,,S-1004,,,,,05,",
        "guid-5,active,,true,org1,parent,pp,,Pat,Parent,,P-1,,,,,,",
    ]).encode()

    roster = roster_parsed(data)

    assert roster.format is RosterFormat.ONEROSTER
    assert [(row.row, row.student_id, row.name, row.grade, row.skip) for row in roster.rows] == [
        (2, "S-1001", "Ada Lovelace", "05", ""),
        (3, "T-1", "Marie Curie", "", "role teacher is not a student"),
        (4, "guid-3", "Alan Turing", "06", ""),
        (5, "S-1004", "Grace Hopper", "", "status is tobedeleted; archive the student by hand if they have left"),
        (6, "P-1", "Pat Parent", "", "role parent is not a student"),
    ]


@pytest.mark.parametrize(("data", "code"), [
    (b"", "roster_empty"),
    (b"  \n\n", "roster_empty"),
    (b"student_id,name\n", "roster_empty"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "roster_not_text"),
    ("student_id,name\ns-1,Zoë\n".encode("utf-16"), "roster_not_text"),
    ("student_id,name\ns-1,Zoë\n".encode("latin-1"), "roster_not_text"),
    (b"id,full name\n1,Ada\n", "roster_unknown_header"),
    (b"\nstudent_id,name\ns-1,Ada\n", "roster_unknown_header"),  # the header must be row 1
    (b'student_id,name\ns-1,"Ada\n', "roster_not_csv"),
    (b"student_id,name\n" + b"s,A\n" * (MAX_ROWS + 1), "roster_too_many_rows"),
])
def test_a_file_that_is_no_roster_is_refused_with_a_reason(data: bytes, code: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        roster_parsed(data)

    assert refused.value.code == code
    assert refused.value.message


def test_a_file_over_the_size_cap_is_refused() -> None:
    with pytest.raises(PayloadTooLarge):
        roster_parsed(b"student_id,name\n" + b"x" * MAX_FILE_BYTES)


# --- helpers for the pages -----------------------------------------------------------------------


def preview(client: Client, text: str | bytes, name: str = "roster.csv") -> Any:
    content = text if isinstance(text, bytes) else text.encode()
    upload = SimpleUploadedFile(name, content, content_type="text/csv")
    return client.post(ROSTER, {"step": "preview", "upload": upload})


def token_of(response: HttpResponse) -> str:
    found = re.search(r'name="token" value="([^"]+)"', response.content.decode())
    assert found, "the preview offers no Apply import"
    return found.group(1)


def apply(client: Client, token: str) -> Any:
    return client.post(ROSTER, {"step": "apply", "token": token})


def error_rows(response: HttpResponse) -> list[tuple[int, str]]:
    """(row number, problem) of the preview's errors table."""
    table = re.search(r'<table id="roster-errors".*?</table>', response.content.decode(), re.S)
    if table is None:
        return []
    return [(int(number), problem.strip()) for number, problem in re.findall(
        r'<tr data-row="\d+"><td class="num">(\d+)</td><td class="mono">.*?</td>\s*<td>(.*?)</td></tr>', table.group(0),
        re.S)]


def outcomes(response: HttpResponse) -> dict[int, str]:
    return {int(row): outcome for row, outcome in
            re.findall(r'<tr data-row="(\d+)" data-outcome="(\w+)">', response.content.decode())}


def student_slugs(org: Organization) -> set[str]:
    return set(Stack.objects.filter(organization=org).values_list("slug", flat=True))


def actions(org: Organization) -> list[str]:
    return list(AuditEvent.objects.filter(organization=org).order_by("pk").values_list("action", flat=True))


def unlimited(org: Organization) -> None:
    Organization.objects.filter(pk=org.pk).update(tier="enterprise")


def thirty_rows(teacher: User, bad: dict[int, str] | None = None) -> str:
    """A 30-student roster; `bad` replaces the line of a spreadsheet row number."""
    lines = ["student_id,name,grade,teacher_email"]
    for n in range(1, 31):
        lines.append(f"st-{n:03d},Student {n},{5 + n % 3},{teacher.email if n % 2 else ''}")
    for row, line in (bad or {}).items():
        lines[row - 1] = line
    return "\n".join(lines) + "\n"


# --- importing ---------------------------------------------------------------------------------


def test_two_bad_rows_in_thirty_are_listed_by_row_and_nothing_is_imported(school: School) -> None:
    unlimited(school.org)
    admin = client_for(school.admin)
    before, events_before = student_slugs(school.org), actions(school.org)
    # Spreadsheet row n+1 holds student n (row 1 is the header).
    text = thirty_rows(school.teacher, bad={8: "st-006,Student six again,5,", 19: "st-018,Eve,5,nobody@nowhere.test"})

    response = preview(admin, text)

    assert response.status_code == 400
    assert error_rows(response) == [
        (8, "duplicate student_id st-006: already on row 7"),
        (19, "teacher_email nobody@nowhere.test is not a teacher of this school"),
    ]
    assert re.search(r'id="count-error">2<', response.content.decode())
    assert "Apply import" not in response.content.decode()
    assert '<th scope="col" class="num">Row</th>' in response.content.decode()
    # Even an apply forced with the preview's token stores nothing.
    token = re.search(r'name="token" value="([^"]+)"', response.content.decode())
    assert token is None
    assert student_slugs(school.org) == before and actions(school.org) == events_before


def test_an_apply_of_a_file_that_went_bad_since_the_preview_stores_nothing(school: School) -> None:
    unlimited(school.org)
    admin = client_for(school.admin)
    response = preview(admin, thirty_rows(school.teacher))
    assert response.status_code == 200
    # Between preview and apply the teacher leaves the school: rows naming them are now errors.
    Membership.objects.filter(user=school.teacher).delete()
    before, events_before = student_slugs(school.org), actions(school.org)

    applied = apply(admin, token_of(response))

    assert applied.status_code == 400
    assert [row for row, _ in error_rows(applied)] == list(range(2, 32, 2))
    assert student_slugs(school.org) == before and actions(school.org) == events_before


def test_a_clean_file_creates_the_students_and_assigns_their_teachers(school: School) -> None:
    unlimited(school.org)
    admin = client_for(school.admin)

    response = preview(admin, thirty_rows(school.teacher))

    assert response.status_code == 200
    assert set(outcomes(response).values()) == {"create"}
    assert re.search(r'id="count-create">30<', response.content.decode())
    assert not Stack.objects.filter(slug__startswith="st-").exists()  # a preview writes nothing

    applied = apply(admin, token_of(response))

    assert applied.status_code == 302 and applied["Location"] == ROSTER
    created = Stack.objects.filter(organization=school.org, slug__startswith="st-")
    assert created.count() == 30
    st_005 = created.get(slug="st-005")
    assert (st_005.display_name, st_005.grade, st_005.kind) == ("Student 5", "7", "student")
    assigned = set(TeacherAssignment.objects.filter(user=school.teacher, stack__in=created)
                   .values_list("stack__slug", flat=True))
    assert assigned == {f"st-{n:03d}" for n in range(1, 31, 2)}
    summary = AuditEvent.objects.get(organization=school.org, action="roster.imported")
    assert summary.actor == school.admin
    assert summary.metadata == {"format": "plain", "rows": 30, "created": 30, "updated": 0, "unchanged": 0,
                                "skipped": 0, "teachers_assigned": 15}
    assert AuditEvent.objects.filter(organization=school.org, action="stack.created", actor=school.admin).count() == 30
    page = admin.get(ROSTER)
    assert "Roster imported: 30 created, 0 updated, 0 unchanged, 0 skipped." in page.content.decode()
    # The preview was used up: applying it again is refused, nothing doubles.
    assert apply(admin, token_of(response)).status_code == 400


def test_importing_the_same_file_again_changes_nothing(school: School) -> None:
    unlimited(school.org)
    admin = client_for(school.admin)
    text = thirty_rows(school.teacher)
    assert apply(admin, token_of(preview(admin, text))).status_code == 302
    stacks_before = list(Stack.objects.filter(organization=school.org).order_by("pk").values())
    events_before = AuditEvent.objects.filter(organization=school.org).count()

    again = preview(admin, text)

    assert again.status_code == 200
    assert set(outcomes(again).values()) == {"unchanged"}
    assert "applying changes nothing" in again.content.decode()
    assert apply(admin, token_of(again)).status_code == 302
    # Nothing about any stack changed (not even updated_at); the only new event is the summary.
    assert list(Stack.objects.filter(organization=school.org).order_by("pk").values()) == stacks_before
    new_events = AuditEvent.objects.filter(organization=school.org).order_by("pk")[events_before:]
    assert [(event.action, event.metadata["unchanged"], event.metadata["created"]) for event in new_events] == [
        ("roster.imported", 30, 0)]


def test_a_changed_name_grade_or_new_teacher_is_an_update(school: School) -> None:
    second_teacher = make_user(school.org, role=Membership.Role.TEACHER)
    admin = client_for(school.admin)
    text = ("student_id,name,grade,teacher_email\n"
            f"alice,Alice Liddell,4,{school.teacher.email};{second_teacher.email.upper()}\n"  # emails match in any case
            "bob,,,\n")  # blanks keep what is there

    response = preview(admin, text)

    assert outcomes(response) == {2: "update", 3: "unchanged"}
    page = response.content.decode()
    assert "name “” → “Alice Liddell”" in page and f"assign teacher {second_teacher.email}" in page
    assert apply(admin, token_of(response)).status_code == 302
    alice = Stack.objects.get(pk=school.stack.pk)
    assert (alice.display_name, alice.grade) == ("Alice Liddell", "4")
    assert set(TeacherAssignment.objects.filter(stack=alice).values_list("user_id", flat=True)) == {
        school.teacher.pk, second_teacher.pk}
    assert actions(school.org)[-3:] == ["stack.updated", "stack.teacher_assigned", "roster.imported"]


def test_a_oneroster_file_with_mixed_roles_creates_only_the_students(school: School) -> None:
    admin = client_for(school.admin)
    text = (DATA / "oneroster_users.csv").read_text()

    response = preview(admin, text, name="users.csv")

    assert response.status_code == 200
    assert outcomes(response) == {2: "create", 3: "skip", 4: "create", 5: "skip", 6: "create"}
    assert "role teacher is not a student" in response.content.decode()
    assert apply(admin, token_of(response)).status_code == 302
    assert student_slugs(school.org) == {"alice", "bob", "S-1001", "S-1002", "S-1003"}
    ada = Stack.objects.get(organization=school.org, slug="S-1001")
    assert (ada.display_name, ada.grade) == ("Ada Lovelace", "05")
    assert AuditEvent.objects.get(action="roster.imported").metadata["skipped"] == 2


def test_an_import_beyond_the_plans_stack_limit_is_refused_before_anything_is_created(school: School) -> None:
    Organization.objects.filter(pk=school.org.pk).update(tier="core")  # 3 active stacks; alice and bob use 2
    admin = client_for(school.admin)

    response = preview(admin, "student_id,name\nc-1,One\nc-2,Two\n")

    assert response.status_code == 402
    page = response.content.decode()
    assert ("This import would add 2 students but the plan has room for 1 more: stack limit reached "
            "(core: 3 syncing stacks) — upgrade or archive a stack.") in page
    assert "Apply import" not in page
    assert student_slugs(school.org) == {"alice", "bob"}


def test_another_schools_teacher_is_not_a_teacher_here(school: School, other_school: School) -> None:
    response = preview(client_for(school.admin), f"student_id,name,grade,teacher_email\nnew-1,N,,"
                                                 f"{other_school.teacher.email}\n")

    assert error_rows(response) == [(2, f"teacher_email {other_school.teacher.email} is not a teacher of this school")]
    # Nor is an admin of this school a teacher, and an agent stack's id is not free for a student.
    make_stack(school.org, "robot", kind="agent")
    response = preview(client_for(school.admin), f"student_id,name,grade,teacher_email\nnew-1,N,,{school.admin.email}\n"
                                                 "robot,R,,\n")
    assert [row for row, _ in error_rows(response)] == [2, 3]


@pytest.mark.parametrize("content", [
    b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x01",
    b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj\n<< /Type /Catalog >>\n",
    b"this is just a sentence, not a roster\n",
    b"",
])
def test_an_upload_that_is_no_roster_is_a_400_with_a_message(school: School, content: bytes) -> None:
    response = preview(client_for(school.admin), content, name="photo.png")

    assert response.status_code == 400
    assert 'id="import-file-errors"' in response.content.decode()
    assert student_slugs(school.org) == {"alice", "bob"}


def test_a_preview_belongs_to_the_admin_who_made_it(school: School) -> None:
    unlimited(school.org)
    token = token_of(preview(client_for(school.admin), "student_id,name\nx-1,X\n"))
    other_admin = make_user(school.org, role=Membership.Role.ADMIN)

    assert apply(client_for(other_admin), token).status_code == 400
    refused = apply(client_for(school.admin), "not-a-token")
    assert refused.status_code == 400
    assert "That preview has expired or was already applied." in refused.content.decode()
    assert "x-1" not in student_slugs(school.org)


def test_the_example_files_import_cleanly(school: School) -> None:
    admin = client_for(school.admin)
    for example in ("plain", "oneroster"):
        download = admin.get(f"/dashboard/roster/example-{example}.csv")
        assert download.status_code == 200 and download["Content-Type"].startswith("text/csv")
        assert "attachment" in download["Content-Disposition"]
        response = preview(admin, download.content)
        assert response.status_code == 200, error_rows(response)
        assert school.teacher.email in download.content.decode()  # names one of the school's own teachers


# --- one student -------------------------------------------------------------------------------


def test_an_admin_creates_one_student_with_a_teacher(school: School) -> None:
    response = client_for(school.admin).post("/dashboard/students/new", {
        "student_id": "student-4521", "display_name": "Maya", "grade": "5", "teacher": school.teacher.public_id})

    assert response.status_code == 302 and response["Location"] == "/dashboard/students/student-4521/manage"
    stack = Stack.objects.get(organization=school.org, slug="student-4521")
    assert (stack.display_name, stack.grade, stack.created_by) == ("Maya", "5", school.admin)
    assert TeacherAssignment.objects.filter(stack=stack, user=school.teacher).exists()
    assert actions(school.org)[-2:] == ["stack.created", "stack.teacher_assigned"]


@pytest.mark.parametrize(("fields", "status", "message"), [
    ({"student_id": "no spaces please"}, 400, "The student ID may contain only letters, digits"),
    ({"student_id": ""}, 400, "This field is required."),
    ({"student_id": "alice"}, 400, "A student with this ID already exists."),
    ({"student_id": "new-1", "teacher": "usr_notinschool"}, 400, "Select a valid choice."),
])
def test_a_student_that_cannot_be_created_is_explained_on_the_form(school: School, fields: dict[str, str],
                                                                   status: int, message: str) -> None:
    events = actions(school.org)

    response = client_for(school.admin).post("/dashboard/students/new", fields)

    assert response.status_code == status
    assert message in response.content.decode()
    assert student_slugs(school.org) == {"alice", "bob"} and actions(school.org) == events


def test_creating_a_student_beyond_the_plan_is_a_402_on_the_form(db: None) -> None:
    org = make_org(tier="free")
    admin = make_user(org)
    make_stack(org, "only")

    response = client_for(admin).post("/dashboard/students/new", {"student_id": "second"})

    assert response.status_code == 402
    assert "stack limit reached (free: 1 syncing stack)" in response.content.decode()
    assert student_slugs(org) == {"only"}


# --- archiving and teachers ----------------------------------------------------------------------


def test_archive_unarchive_assign_unassign_round_trip(school: School) -> None:
    admin = client_for(school.admin)
    manage = "/dashboard/students/bob/manage"
    page = admin.get(manage)
    assert page.status_code == 200
    assert 'data-confirm="Archive bob?' in page.content.decode()
    assert "Assign teacher" in page.content.decode()

    assert admin.post("/dashboard/students/bob/archive")["Location"] == manage
    assert Stack.objects.get(pk=school.other_stack.pk).is_archived
    assert "Unarchive" in admin.get(manage).content.decode()
    assert admin.post("/dashboard/students/bob/unarchive")["Location"] == manage
    assert not Stack.objects.get(pk=school.other_stack.pk).is_archived

    assigned = admin.post("/dashboard/students/bob/teachers", {"action": "assign", "teacher": school.teacher.public_id})
    assert assigned.status_code == 302
    assert TeacherAssignment.objects.filter(stack=school.other_stack, user=school.teacher).exists()
    assert f"Unassign {school.teacher.email}" in admin.get(manage).content.decode()
    # A key the teacher holds for bob ends with the assignment.
    key, _ = make_key(school.org, stack=school.other_stack, user=school.teacher)
    unassigned = admin.post("/dashboard/students/bob/teachers",
                            {"action": "unassign", "teacher": school.teacher.public_id})
    assert unassigned.status_code == 302
    assert not TeacherAssignment.objects.filter(stack=school.other_stack, user=school.teacher).exists()
    key.refresh_from_db()
    assert key.revoked_at is not None
    trail = [action for action in actions(school.org) if action.startswith("stack.") and action != "stack.created"]
    assert trail == ["stack.teacher_assigned", "stack.archived", "stack.unarchived", "stack.teacher_assigned",
                     "stack.teacher_unassigned"]
    event = AuditEvent.objects.filter(action="stack.archived", target_id="bob").get()
    assert (event.actor, event.ip) == (school.admin, "127.0.0.1")


def test_unarchiving_beyond_the_plan_is_a_402_with_the_reason(db: None) -> None:
    org = make_org(tier="free")
    admin = make_user(org)
    make_stack(org, "gone", status=Stack.Status.ARCHIVED)
    make_stack(org, "current")

    response = client_for(admin).post("/dashboard/students/gone/unarchive")

    assert response.status_code == 402
    assert "stack limit reached (free: 1 syncing stack)" in response.content.decode()
    assert Stack.objects.get(organization=org, slug="gone").is_archived


def test_teacher_forms_refuse_strangers_and_unknown_actions(school: School, other_school: School) -> None:
    admin = client_for(school.admin)
    url = "/dashboard/students/bob/teachers"

    assert admin.post(url, {"action": "assign", "teacher": other_school.teacher.public_id}).status_code == 404
    assert admin.post(url, {"action": "assign", "teacher": school.admin.public_id}).status_code == 404
    assert admin.post(url, {"action": "unassign", "teacher": school.teacher.public_id}).status_code == 404
    assert admin.post(url, {"action": "promote", "teacher": school.teacher.public_id}).status_code == 400
    assert admin.post(url, {"action": "assign", "teacher": ""}).status_code == 400
    assert admin.get(url).status_code == 405
    assert admin.get("/dashboard/students/bob/archive").status_code == 405
    assert not TeacherAssignment.objects.filter(stack=school.other_stack).exists()


# --- who may ---------------------------------------------------------------------------------------


ROSTER_PAGES = [
    ("get", ROSTER), ("get", "/dashboard/students/new"), ("get", "/dashboard/students/alice/manage"),
    ("get", "/dashboard/roster/example-plain.csv"), ("post", "/dashboard/students/alice/archive"),
    ("post", "/dashboard/students/alice/unarchive"), ("post", "/dashboard/students/alice/teachers"),
    ("post", "/dashboard/students/new"), ("post", ROSTER),
]


@pytest.mark.parametrize(("method", "url"), ROSTER_PAGES)
@pytest.mark.parametrize("role", [Membership.Role.TEACHER, Membership.Role.BILLING])
def test_roster_pages_are_not_for_teachers_or_billing_users(school: School, method: str, url: str, role: str) -> None:
    # The cast's teacher is assigned to alice; even so, no roster page.
    user = school.teacher if role == Membership.Role.TEACHER else make_user(school.org, role=role)

    response = getattr(client_for(user), method)(url)

    assert response.status_code == 404
    assert not Stack.objects.get(pk=school.stack.pk).is_archived


@pytest.mark.parametrize("url", ["/dashboard/students/carol/manage", "/dashboard/students/carol/archive",
                                 "/dashboard/students/nobody/manage"])
def test_another_schools_student_is_a_404(school: School, other_school: School, url: str) -> None:
    admin = client_for(school.admin)

    response = admin.post(url) if url.endswith("archive") else admin.get(url)

    assert response.status_code == 404
    assert not Stack.objects.get(pk=other_school.stack.pk).is_archived


def test_signed_out_visitors_are_sent_to_sign_in(db: None) -> None:
    response = Client().get(ROSTER)

    assert response.status_code == 302 and "login" in response["Location"]


def test_the_roster_page_lists_students_with_their_teachers(school: School) -> None:
    make_stack(school.org, "gone", status=Stack.Status.ARCHIVED)

    page = client_for(school.admin).get(ROSTER, {"q": "ALI"}).content.decode()

    assert 'data-stack="alice"' in page and 'data-stack="bob"' not in page
    assert school.teacher.email in page
    assert 'for="id_upload">Roster CSV file<' in page and "Preview import" in page and "Create student" in page
    everyone = client_for(school.admin).get(ROSTER).content.decode()
    assert re.search(r'data-stack="gone">.*?archived', everyone, re.S)
    # The name is the link to the student's page; the id stays visible beside it.
    Stack.objects.filter(slug="alice").update(display_name="Alice Liddell")
    named = client_for(school.admin).get(ROSTER).content.decode()
    assert ('<a href="/dashboard/students/alice/">Alice Liddell</a> <code class="muted small nowrap">alice</code>'
            in named)


def test_a_plan_downgraded_between_preview_and_apply_stores_nothing(school: School) -> None:
    admin = client_for(school.admin)
    response = preview(admin, "student_id,name\nn-1,One\n")
    assert response.status_code == 200
    Organization.objects.filter(pk=school.org.pk).update(tier="free")

    applied = apply(admin, token_of(response))

    assert applied.status_code == 402
    assert "stack limit reached (free: 1 syncing stack)" in applied.content.decode()
    assert student_slugs(school.org) == {"alice", "bob"}
    assert "roster.imported" not in actions(school.org)


def test_an_upload_over_the_size_cap_is_refused_unread(school: School) -> None:
    response = preview(client_for(school.admin), b"student_id,name\n" + b"a" * MAX_FILE_BYTES)

    assert response.status_code == 413
    assert "The file is larger than 2 MB" in response.content.decode()
