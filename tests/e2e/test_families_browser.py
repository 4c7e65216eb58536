"""Families in real Chromium (docs/guardians.md): an admin invites a parent from the student page's
Guardians panel (htmx), the parent joins from the link in their own browser, lands on "Your
children", reads their child's memories, and meets "no such page" everywhere else; a parent named
in a roster import joins from the e-mailed link and sees their two children, not a third. Every page
is checked by tests/e2e/browser.py's `check_page` (axe-core, CSP, console, hosts, screenshot)."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

import pytest
from django.core import mail
from playwright.sync_api import FilePayload

from accounts.authors import Author, Path
from accounts.models import Membership
from memories.models import Memory
from memories.services import memory_create
from stacks.models import GuardianLink, GuardianRequest, Stack
from tests.e2e.browser import WatchedPage, check_page, sign_in
from tests.factories import make_org, make_stack, make_user

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PASSWORD = "correct horse battery staple"  # tests/factories.make_user's default


def test_a_parent_is_invited_joins_and_sees_only_their_child(open_page: Callable[[], WatchedPage],
                                                             dashboard_url: str) -> None:
    org = make_org("Riverside Primary")
    admin = make_user(org, role=Membership.Role.ADMIN, email="head@riverside.example", username="")
    child = make_stack(org, "mia-jones", display_name="Mia Jones")
    other = make_stack(org, "noah-king", display_name="Noah King")
    memory_create(stack=child, kind="note", payload={"content": "Mia likes fractions explained with pizza"},
                  source="api", author=Author(path=Path.API, agent="maths-tutor", key_name="Mia's tutor"))
    tutor = Author(path=Path.API, agent="maths-tutor", key_name="Mia's tutor")
    wrong = memory_create(stack=child, kind="note", payload={"content": "Mia reads at year 2 level"}, source="api",
                          author=tutor)
    unwanted = memory_create(stack=child, kind="note", payload={"content": "Mia was upset about her grandmother"},
                             source="api", author=tutor)

    admin_page = open_page()
    sign_in(admin_page, dashboard_url, admin.email, PASSWORD)
    admin_page.goto(f"{dashboard_url}/dashboard/students/{child.slug}/")
    panel = admin_page.page.locator("#guardians")
    panel.get_by_label("Guardian's email").wait_for()  # the panel arrived through htmx
    check_page(admin_page, "student-guardians-panel")
    panel.get_by_label("Guardian's email").fill("parent@riverside.example")
    panel.get_by_label("Name (optional)").fill("Sam Jones")
    panel.get_by_role("button", name="Invite").click()
    admin_page.page.locator("#guardian-invitation-link").wait_for()
    check_page(admin_page, "student-guardian-invited")
    link = admin_page.page.locator("#guardian-invitation-link").inner_text().strip()
    assert urlsplit(link).path.startswith("/invitations/"), link

    watched = open_page()
    page = watched.page
    watched.goto(link.replace("http://127.0.0.1:", "http://localhost:"))
    check_page(watched, "guardian-invitation")
    page.get_by_label("New password").fill("kitchen-table-homework-7")
    page.get_by_label("Confirm password").fill("kitchen-table-homework-7")
    page.get_by_role("button", name="Join school").click()
    check_page(watched, "family-children")
    assert urlsplit(page.url).path == "/dashboard/family/"
    assert GuardianLink.objects.filter(user__email="parent@riverside.example", stack=child).exists()
    assert "Noah King" not in page.content()

    page.get_by_role("link", name="Mia Jones").click()
    check_page(watched, "family-child")
    assert "pizza" in page.content() and "maths-tutor" in page.content()
    page.get_by_text("What is kept, for how long, who sees it").click()  # the school's written policy
    assert page.get_by_role("heading", name="How long it is kept").is_visible()
    page.get_by_role("searchbox", name="Search memories").fill("pizza")
    page.get_by_role("button", name="Search").click()
    check_page(watched, "family-child-search")
    hits = page.get_by_role("list", name="Search results").get_by_role("listitem")
    assert "pizza" in hits.first.inner_text()  # best first (by meaning too: the other memories may follow)

    for name, path in (("family-other-child", f"/dashboard/family/{other.slug}/"),
                       ("family-staff-student-page", f"/dashboard/students/{child.slug}/"),
                       ("family-roster", "/dashboard/roster/")):
        assert watched.goto(f"{dashboard_url}{path}") == 404, path
        check_page(watched, name, status=404)
        assert "Noah King" not in page.content()

    # Requests (docs/guardians.md "Requests"): the parent asks for a correction and a deletion ...
    child_url = f"{dashboard_url}/dashboard/family/{child.slug}/"
    watched.goto(child_url)
    page.locator(f"#memory-{wrong.pk}").get_by_role("link", name="Ask about this memory").click()
    check_page(watched, "family-ask-about-memory")
    page.get_by_label("What it should say").fill("Mia reads at year 4 level")
    page.get_by_role("button", name="Ask for this correction").click()
    check_page(watched, "family-correction-asked")
    page.locator(f"#memory-{unwanted.pk}").get_by_role("link", name="Ask about this memory").click()
    page.get_by_role("button", name="Ask to delete this memory").click()
    check_page(watched, "family-deletion-asked")
    requests = page.locator("#requests")
    assert requests.get_by_text("open").count() == 2 and "the school answers by" in requests.inner_text()
    correction, deletion = GuardianRequest.objects.order_by("pk")

    # ... the admin decides both from the Requests queue ...
    admin_page.goto(f"{dashboard_url}/dashboard/")
    admin_page.page.get_by_role("link", name="Requests", exact=True).click()
    check_page(admin_page, "requests-queue")
    for row in (correction, deletion):
        admin_page.page.get_by_role("link", name=f"#{row.pk}", exact=True).click()
        check_page(admin_page, f"request-{row.kind}")
        admin_page.page.get_by_role("button", name="Approve").click()
        check_page(admin_page, f"request-{row.kind}-approved")
        admin_page.page.get_by_role("link", name="← Requests").click()

    # ... the revision names the request ...
    admin_page.goto(f"{dashboard_url}/dashboard/students/{child.slug}/memories/{wrong.pk}/")
    check_page(admin_page, "corrected-memory-revisions")
    assert f"guardian request #{correction.pk}" in admin_page.page.locator(".revision-author").first.inner_text()

    # ... the parent reads the certificate from their page, and the erased memory is gone everywhere.
    deletion.refresh_from_db()
    certificate_link = f"/dashboard/family/{child.slug}/requests/{deletion.pk}/certificate"
    assert any(certificate_link in message.body for message in mail.outbox)
    watched.goto(child_url)
    assert "year 4 level" in page.content() and "grandmother" not in page.content()
    page.locator("#requests").get_by_role("link", name="Certificate of erasure").click()
    check_page(watched, "family-certificate")
    assert str(deletion.certificate_ref) in page.content() and "valid" in page.content()
    watched.goto(f"{child_url}?q=grandmother")
    check_page(watched, "family-search-erased")
    assert "upset about her grandmother" not in page.content()
    for path in (f"/dashboard/family/{child.slug}/MEMORY.md", f"/api/v1/stacks/{child.slug}/memories"):
        answer = page.request.get(f"{dashboard_url}{path}")  # the downloads and the API, as the parent
        assert answer.ok and "grandmother" not in answer.text(), path
    assert "year 4 level" in page.request.get(f"{dashboard_url}/api/v1/stacks/{child.slug}/memories").text()
    assert not Memory.objects.filter(pk=unwanted.pk).exists()
    assert watched.goto(f"{dashboard_url}/dashboard/family/{child.slug}/memories/{unwanted.pk}/request") == 404


def test_a_parent_named_in_a_roster_import_joins_and_sees_their_two_children_only(
        open_page: Callable[[], WatchedPage], dashboard_url: str) -> None:
    """docs/guardians.md "Guardians in the roster": the plain CSV's `guardian_email` column names one
    parent for two brothers and another family for a third pupil; one invitation per family."""
    org = make_org("Hillcrest Primary")
    admin = make_user(org, role=Membership.Role.ADMIN, email="office@hillcrest.example", username="")
    roster = "\n".join(["student_id,name,grade,guardian_email",
                        "leo-park,Leo Park,3,kim@hillcrest.example",
                        "max-park,Max Park,5,kim@hillcrest.example",
                        "ivy-stone,Ivy Stone,4,ruth@hillcrest.example"]) + "\n"

    admin_page = open_page()
    sign_in(admin_page, dashboard_url, admin.email, PASSWORD)
    admin_page.goto(f"{dashboard_url}/dashboard/roster/")
    upload: FilePayload = {"name": "roster.csv", "mimeType": "text/csv", "buffer": roster.encode()}
    admin_page.page.get_by_label("Roster CSV file").set_input_files(files=upload)
    admin_page.page.get_by_role("button", name="Preview import").click()
    check_page(admin_page, "roster-guardians-preview")
    rows = admin_page.page.locator("#roster-plan tbody tr")
    assert "invite guardian kim@hillcrest.example" in rows.nth(0).inner_text()
    assert "kim@hillcrest.example" in rows.nth(1).inner_text()  # the brother joins the same invitation
    assert "invite guardian ruth@hillcrest.example" in rows.nth(2).inner_text()
    assert not mail.outbox  # a preview sends nothing
    admin_page.page.get_by_role("button", name="Apply import").click()
    check_page(admin_page, "roster-guardians-applied")
    assert "2 guardian invitations created, 2 e-mailed" in admin_page.page.content()

    (invitation,) = [message for message in mail.outbox if message.to == ["kim@hillcrest.example"]]
    link = next(line.strip() for line in invitation.body.splitlines() if "/invitations/" in line)
    watched = open_page()
    page = watched.page
    watched.goto(link)
    check_page(watched, "roster-guardian-invitation")
    page.get_by_label("New password").fill("lunchbox-on-the-stairs-4")
    page.get_by_label("Confirm password").fill("lunchbox-on-the-stairs-4")
    page.get_by_role("button", name="Join school").click()
    check_page(watched, "roster-guardian-children")
    assert urlsplit(page.url).path == "/dashboard/family/"
    children = page.get_by_role("list", name="Your children").get_by_role("link")
    assert sorted(children.all_inner_texts()) == ["Leo Park", "Max Park"], children.all_inner_texts()
    assert "Ivy Stone" not in page.content()

    ivy = Stack.objects.get(organization=org, slug="ivy-stone")
    assert watched.goto(f"{dashboard_url}/dashboard/family/{ivy.slug}/") == 404
    check_page(watched, "roster-guardian-third-child", status=404)
    assert "Ivy Stone" not in page.content()
