"""A family's dashboard (docs/guardians.md): a guardian invited for two children signs in, lands on
"Your children" (those two, not a third), reads each child's memories with who wrote them, the
checkpoint and the downloads — under the school's `guardian_view` — and reaches no staff page. The
admin's side: the student page's Guardians panel and its invite form."""

from __future__ import annotations

import re
import zipfile
from io import BytesIO

import pytest
from django.core import mail
from django.test import Client

from accounts.authors import Author, Path
from accounts.models import AuditEvent, Membership, Organization, User
from memories.models import MemoryAccess
from memories.services import CheckpointInput, checkpoint_save, memory_create
from stacks.models import GuardianLink, Stack
from tests.actors import School
from tests.dashboard.pages import client_for, csrf_token
from tests.factories import make_stack, make_user

pytestmark = pytest.mark.django_db

PASSPHRASE = "a long and new passphrase"
LINK = re.compile(r"https?://[^/\s\"<]+/invitations/([A-Za-z0-9_-]+)/")


def guardian_of(school: School, *stacks: Stack) -> User:
    guardian = make_user(school.org, role=Membership.Role.GUARDIAN)
    for stack in stacks:
        GuardianLink.objects.create(user=guardian, stack=stack)
    return guardian


def note(stack: Stack, content: str, grants: list[str] | None = None) -> None:
    payload: dict = {"content": content}
    if grants is not None:
        payload["access_grants"] = grants
    memory_create(stack=stack, kind="note", payload=payload, source="api",
                  author=Author(path=Path.API, agent="math-tutor", key_name="tutor key"))


def test_invite_accept_sign_in_and_see_exactly_the_two_children(school: School) -> None:
    third = make_stack(school.org, "carol", display_name="Carol Third")
    Stack.objects.filter(pk=school.stack.pk).update(display_name="Alice Child")
    admin = client_for(school.admin)
    page = admin.post(f"/dashboard/students/{school.stack.slug}/guardians",
                      {"email": "mum@example.test", "name": "Mo Mum"})
    assert page.status_code == 201
    found = LINK.search(page.content.decode())
    assert found is not None, "the panel shows the one-time link"
    token = found.group(1)
    assert "no-store" in page["Cache-Control"] and len(mail.outbox) == 1
    again = admin.post(f"/dashboard/students/{school.other_stack.slug}/guardians", {"email": "mum@example.test"})
    assert again.status_code == 200 and not LINK.search(again.content.decode())

    invitee = Client(enforce_csrf_checks=True)
    form_token = csrf_token(invitee, f"/invitations/{token}/")
    joined = invitee.post(f"/invitations/{token}/", {"password1": PASSPHRASE, "password2": PASSPHRASE,
                                                     "csrfmiddlewaretoken": form_token})
    assert joined.status_code == 302

    browser = Client()  # a real sign-in with the password they chose
    signed_in = browser.post("/login/", {"username": "mum@example.test", "password": PASSPHRASE}, follow=True)
    assert signed_in.redirect_chain[-1][0] == "/dashboard/family/"
    text = signed_in.content.decode()
    assert "Your children" in text and "Alice Child" in text and school.other_stack.slug in text
    assert "Carol Third" not in text and third.slug not in text
    assert "Roster" not in text and "Keys" not in text  # the navigation offers no staff page
    assert browser.get(f"/dashboard/family/{school.stack.slug}/").status_code == 200
    assert browser.get(f"/dashboard/family/{third.slug}/").status_code == 404


def test_the_child_page_shows_memories_with_their_author_and_the_checkpoint(school: School) -> None:
    guardian = guardian_of(school, school.stack)
    note(school.stack, "Ada finds long division hard when remainders appear")
    checkpoint_save(stack=school.stack, checkpoint=CheckpointInput(task="Fractions unit, lesson 3"))
    client = client_for(guardian)

    page = client.get(f"/dashboard/family/{school.stack.slug}/")

    text = page.content.decode()
    assert page.status_code == 200
    assert "long division" in text and "math-tutor" in text and "tutor key" in text
    assert "Fractions unit, lesson 3" in text
    assert f"/dashboard/family/{school.stack.slug}/MEMORY.md" in text
    assert f"/dashboard/family/{school.stack.slug}/archive.zip" in text
    assert "/dashboard/students/" not in text  # no link into the staff pages
    searched = client.get(f"/dashboard/family/{school.stack.slug}/", {"q": "division"}).content.decode()
    assert "long division" in searched and "1 result" in searched
    entry = MemoryAccess.objects.filter(stack=school.stack).latest("pk")
    assert entry.user_id == guardian.pk


def test_the_children_list_counts_what_each_stack_stores(school: School) -> None:
    guardian = guardian_of(school, school.stack)
    note(school.stack, "Ada finds long division hard when remainders appear")
    note(school.stack, "Ada reads a chapter a night")
    text = client_for(guardian).get("/dashboard/family/").content.decode()
    assert "2 memories stored" in text


@pytest.mark.parametrize("view", ["agent", "granted"])
def test_what_a_guardian_reads_follows_the_schools_guardian_view(school: School, view: str) -> None:
    Organization.objects.filter(pk=school.org.pk).update(guardian_view=view)
    guardian = guardian_of(school, school.stack)
    note(school.stack, "shared with families", ["role:guardian"])
    note(school.stack, "for everyone who may see the stack", ["*"])
    note(school.stack, "for teachers only", ["role:teacher"])
    note(school.stack, "no grants at all")
    note(school.stack, "for school staff", [f"org:{school.org.public_id}"])
    client = client_for(guardian)

    page = client.get(f"/dashboard/family/{school.stack.slug}/").content.decode()
    markdown = client.get(f"/dashboard/family/{school.stack.slug}/MEMORY.md").content.decode()
    archive = client.get(f"/dashboard/family/{school.stack.slug}/archive.zip")
    with zipfile.ZipFile(BytesIO(b"".join(archive.streaming_content))) as bundle:  # type: ignore[attr-defined]
        archived = "".join(bundle.read(name).decode() for name in bundle.namelist() if name.endswith(".jsonl"))
        names = bundle.namelist()

    everything = ["shared with families", "for everyone who may see", "for teachers only", "no grants at all",
                  "for school staff"]
    expected = everything if view == "agent" else everything[:2]
    assert markdown.startswith("# MEMORY.md")  # (notes are not part of MEMORY.md: see the export's tests)
    for body in (page, archived):
        for text in everything:
            assert (text in body) == (text in expected), (view, text)
    exports = AuditEvent.objects.filter(organization=school.org, action="stack.exported", actor=guardian)
    assert sorted(exports.values_list("metadata__format", flat=True)) == ["memory.md", "zip"]
    assert "memories.jsonl" in names or any(name.startswith("memories") for name in names)
    assert "access_log.jsonl" not in names  # who read the child's memories is the school's record


STAFF_PAGES = ["/dashboard/roster/", "/dashboard/people/", "/dashboard/keys/", "/dashboard/audit/",
               "/dashboard/webhooks/", "/dashboard/privacy/", "/dashboard/billing/", "/dashboard/students/new",
               "/account/password/"]


def test_a_guardian_reaches_no_staff_page_not_even_for_their_own_child(school: School) -> None:
    client = client_for(guardian_of(school, school.stack))
    assert client.get("/dashboard/")["Location"] == "/dashboard/family/"
    for url in STAFF_PAGES[:-1]:
        assert client.get(url).status_code == 404, url
    assert client.get("/account/password/").status_code == 200  # their own password is theirs
    slug = school.stack.slug
    for url in (f"/dashboard/students/{slug}/", f"/dashboard/students/{slug}/export.json",
                f"/dashboard/students/{slug}/MEMORY.md", f"/dashboard/students/{slug}/archive.zip",
                f"/dashboard/students/{slug}/manage", f"/dashboard/students/{slug}/erase",
                f"/dashboard/students/{slug}/guardians"):
        assert client.get(url).status_code == 404, url


def test_the_family_pages_are_not_for_staff(school: School) -> None:
    for user in (school.admin, school.teacher):
        client = client_for(user)
        for url in ("/dashboard/family/", f"/dashboard/family/{school.stack.slug}/",
                    f"/dashboard/family/{school.stack.slug}/MEMORY.md"):
            assert client.get(url).status_code == 404, (user, url)


def test_the_student_page_has_a_guardians_panel_for_admins_only(school: School) -> None:
    guardian = guardian_of(school, school.stack)
    User.objects.filter(pk=guardian.pk).update(first_name="Gil", last_name="Guardian")
    admin = client_for(school.admin)
    page = admin.get(f"/dashboard/students/{school.stack.slug}/").content.decode()
    assert f'hx-get="/dashboard/students/{school.stack.slug}/guardians"' in page
    panel = admin.get(f"/dashboard/students/{school.stack.slug}/guardians", HTTP_HX_REQUEST="true")
    assert panel.status_code == 200 and "Gil Guardian" in panel.content.decode()
    assert "<html" not in panel.content.decode()  # the fragment alone for htmx
    refused = admin.post(f"/dashboard/students/{school.stack.slug}/guardians", {"email": school.teacher.email})
    assert refused.status_code == 409 and "already a member" in refused.content.decode()

    teacher = client_for(school.teacher)
    assert 'id="guardians"' not in teacher.get(f"/dashboard/students/{school.stack.slug}/").content.decode()
    assert teacher.get(f"/dashboard/students/{school.stack.slug}/guardians").status_code == 404
    assert teacher.post(f"/dashboard/students/{school.stack.slug}/guardians",
                        {"email": "x@example.test"}).status_code == 404


def test_the_people_page_leaves_guardians_to_the_student_page(school: School) -> None:
    admin = client_for(school.admin)
    page = admin.get("/dashboard/people/").content.decode()
    invite_form = page[page.index('id="id_role"'):].split("</select>")[0]
    assert 'value="teacher"' in invite_form and 'value="guardian"' not in invite_form
    refused = admin.post("/dashboard/people/", {"email": "p@example.test", "role": "guardian"})
    assert refused.status_code == 400 and not Membership.objects.filter(user__email="p@example.test").exists()
