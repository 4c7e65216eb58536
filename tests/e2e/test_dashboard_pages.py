"""The dashboard pages the role flows (test_dashboard_browser.py) do not pass through, in real
Chromium: empty states, forms with their errors, a student's Manage page, the password reset
pages and an error page. Each is checked by tests/e2e/browser.py's `check_page` (status,
screenshot, axe-core with 0 serious/critical violations, no console error or CSP refusal).
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

import httpx
import pytest
from django.core import mail

from accounts.models import Membership, Organization, User
from memories.lifecycle.ttl import DEFAULT_RETENTION_DAYS
from memories.models import Memory, MemoryKind
from memories.services import memory_create
from stacks.models import Stack
from tests.e2e.browser import WatchedPage, check_page, sign_in
from tests.factories import assign_teacher, make_key, make_org, make_stack, make_user

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PASSWORD = "correct horse battery staple"  # tests/factories.make_user's default


def staff(org: Organization, role: str, email: str) -> User:
    return make_user(org, role=role, email=email, username="")


def test_a_new_school_and_its_first_students_read_well(open_page: Callable[[], WatchedPage],
                                                       dashboard_url: str) -> None:
    org = make_org("Brookside Academy")
    admin = staff(org, Membership.Role.ADMIN, "office@brookside.example")
    teacher = staff(org, Membership.Role.TEACHER, "art@brookside.example")
    watched = open_page()
    page = watched.page
    sign_in(watched, dashboard_url, admin.email, PASSWORD)

    # No students yet: the overview says what to do next.
    check_page(watched, "overview-empty")
    assert page.get_by_role("link", name="Import a roster").count() >= 1

    # Adding a student: a bad id is refused on the form (400) and nothing is stored.
    watched.goto(f"{dashboard_url}/dashboard/students/new")
    check_page(watched, "student-create")
    page.get_by_label("Student ID").fill("not a valid id!")
    page.get_by_role("button", name="Create student").click()
    page.wait_for_load_state("load")
    check_page(watched, "student-create-refused", status=400)
    assert not Stack.objects.filter(organization=org).exists()
    page.get_by_label("Student ID").fill("s-0001")
    page.get_by_role("button", name="Create student").click()
    page.wait_for_load_state("load")
    stack = Stack.objects.get(organization=org, slug="s-0001")

    # A student with no memories yet: the page explains how to connect an agent.
    watched.goto(f"{dashboard_url}/dashboard/students/{stack.slug}/")
    check_page(watched, "student-empty")
    assert "key" in page.locator("main").inner_text().lower()

    # The Manage page: assign a teacher, archive, unarchive.
    watched.goto(f"{dashboard_url}/dashboard/students/{stack.slug}/manage")
    check_page(watched, "student-manage")
    page.get_by_label("Teacher to assign").select_option(label=teacher.email)
    page.get_by_role("button", name="Assign teacher").click()
    page.wait_for_load_state("load")
    check_page(watched, "student-manage-assigned")
    assert stack.teacher_assignments.filter(user=teacher).exists()
    page.get_by_role("button", name="Archive").click()
    page.wait_for_load_state("load")
    check_page(watched, "student-manage-archived")
    stack.refresh_from_db()
    assert stack.status == Stack.Status.ARCHIVED

    # A memory's page with its history, and a page that does not exist.
    stack.status = Stack.Status.ACTIVE
    stack.save(update_fields=["status"])
    memory = memory_create(stack=stack, kind=MemoryKind.NOTE, source="api",
                           payload={"content": "Brings sketches to every lesson.", "tags": ["art"]})
    watched.goto(f"{dashboard_url}/dashboard/students/{stack.slug}/memories/{memory.pk}/")
    check_page(watched, "memory")
    # Once the student's tutor has read it, the page says who saw it, through which path.
    _, secret = make_key(stack.organization, stack=stack, name="Year 5 tutor")
    served = httpx.get(f"{dashboard_url}/api/v1/stacks/{stack.slug}/memories/{memory.pk}",
                       headers={"Authorization": f"Bearer {secret}", "X-Agent-Id": "Tutor-bot"})
    assert served.status_code == 200
    watched.goto(f"{dashboard_url}/dashboard/students/{stack.slug}/memories/{memory.pk}/")
    check_page(watched, "memory-seen-by")
    seen_by = page.locator("section[aria-labelledby=seen-by-heading] tbody").inner_text()
    assert "Tutor-bot" in seen_by and "get" in seen_by
    watched.goto(f"{dashboard_url}/dashboard/students/nobody-here/")
    check_page(watched, "not-found", status=404)


def test_password_reset_pages_read_well_and_send_the_link(open_page: Callable[[], WatchedPage],
                                                          dashboard_url: str) -> None:
    org = make_org("Meadow School")
    admin = staff(org, Membership.Role.ADMIN, "head@meadow.example")
    assign_teacher(staff(org, Membership.Role.TEACHER, "t@meadow.example"), make_stack(org, "m-1"))
    watched = open_page()
    page = watched.page

    watched.goto(f"{dashboard_url}/login/")
    page.get_by_role("link", name="Forgot your password?").click()
    page.wait_for_load_state("load")
    check_page(watched, "password-reset")
    page.get_by_label("Email").fill(admin.email)
    page.get_by_role("button", name="Email me a link").click()
    page.wait_for_load_state("load")
    check_page(watched, "password-reset-sent")
    [message] = mail.outbox
    link = next(word for word in message.body.split() if "/password-reset/" in word)
    watched.goto(link if link.startswith("http") else f"{dashboard_url}{link}")
    check_page(watched, "password-reset-new-password")
    assert urlsplit(page.url).path.startswith("/password-reset/")
    sign_in(watched, dashboard_url, admin.email, PASSWORD)


def test_privacy_settings_and_erasing_a_student_read_well(open_page: Callable[[], WatchedPage],
                                                          dashboard_url: str) -> None:
    org = make_org("Willow School")
    admin = staff(org, Membership.Role.ADMIN, "office@willow.example")
    stack = make_stack(org, "w-0001")
    Stack.objects.filter(pk=stack.pk).update(display_name="Wren Willow")
    memory_create(stack=Stack.objects.select_related("organization").get(pk=stack.pk), kind=MemoryKind.NOTE,
                  source="api", payload={"content": "Wren's mum reads e-mail at mum@willow.example"})
    watched = open_page()
    page = watched.page
    sign_in(watched, dashboard_url, admin.email, PASSWORD)

    # The settings with the written policy; a bad value is refused on the form (400), nothing stored.
    watched.goto(f"{dashboard_url}/dashboard/privacy/")
    check_page(watched, "privacy")
    page.get_by_label("Raw entries", exact=True).fill("0")
    page.get_by_role("button", name="Save privacy settings").click()
    page.wait_for_load_state("load")
    check_page(watched, "privacy-refused", status=400)
    assert Organization.objects.get(pk=org.pk).retention_days == DEFAULT_RETENTION_DAYS
    page.get_by_label("Raw entries", exact=True).fill("180")
    page.get_by_label("Phone numbers").uncheck()
    page.get_by_role("button", name="Save privacy settings").click()
    page.wait_for_load_state("load")
    check_page(watched, "privacy-saved")
    saved = Organization.objects.get(pk=org.pk)
    assert saved.retention_days == {**DEFAULT_RETENTION_DAYS, "raw": 180}
    assert saved.redaction_categories == ["EMAIL", "IP_ADDRESS"]

    # The student's page: the redaction badge, then the erase confirmation and the certificate.
    watched.goto(f"{dashboard_url}/dashboard/students/{stack.slug}/")
    check_page(watched, "student-redacted")
    assert "redacted: email" in page.locator("main").inner_text()
    page.get_by_role("link", name="Erase student…").click()
    page.wait_for_load_state("load")
    check_page(watched, "erase-student")
    page.get_by_label("Type the student's name or ID to confirm").fill("Wren Willow")
    page.get_by_label("Requested by (optional)").fill("Wren's mother, letter of 20 November 2026")
    page.get_by_role("button", name="Erase Wren Willow for good").click()
    page.wait_for_load_state("load")
    check_page(watched, "erasure-certificate")
    assert "Valid" in page.locator("main").inner_text()
    assert not Memory.objects.filter(stack_id=stack.pk).exists()


def test_storage_on_an_unlimited_plan_is_a_figure_and_a_limited_plan_keeps_its_bar(
        open_page: Callable[[], WatchedPage], dashboard_url: str) -> None:
    unlimited = make_org("Harbour College", tier="unlimited")
    admin = staff(unlimited, Membership.Role.ADMIN, "office@harbour.example")
    make_stack(unlimited, "h-0001", display_name="Hana Ito", bytes_used=30 * 1024)
    watched = open_page()
    page = watched.page
    sign_in(watched, dashboard_url, admin.email, PASSWORD)
    shot = check_page(watched, "overview-unlimited")
    card = page.locator("#storage")
    card.screenshot(path=str(shot.with_name(shot.stem + "-storage-card.png")))
    # No bar that fills its own axis and reads "full": the figure, and the plan has no limit.
    assert card.locator("canvas").count() == 0
    assert card.locator("#storage-used").inner_text() == "30.0\xa0KB"
    assert "no storage limit" in card.inner_text()

    limited = make_org("Quay School", tier="pro")
    other_admin = staff(limited, Membership.Role.ADMIN, "office@quay.example")
    make_stack(limited, "q-0001", bytes_used=256 * 1024 * 1024)
    watched = open_page()
    sign_in(watched, dashboard_url, other_admin.email, PASSWORD)
    shot = check_page(watched, "overview-pro")
    card = watched.page.locator("#storage")
    card.screenshot(path=str(shot.with_name(shot.stem + "-storage-card.png")))
    assert card.locator("canvas").count() == 1 and "(25.0%)" in card.inner_text()


def test_every_page_has_an_icon_and_favicon_ico_answers(open_page: Callable[[], WatchedPage],
                                                        dashboard_url: str) -> None:
    watched = open_page()
    page = watched.page
    watched.goto(f"{dashboard_url}/login/")
    check_page(watched, "sign-in")
    icons = page.locator('link[rel="icon"]')
    hrefs = [icons.nth(i).get_attribute("href") or "" for i in range(icons.count())]
    assert [urlsplit(href).path.rsplit("/", 1)[-1].split(".")[-1] for href in hrefs] == ["ico", "svg"]
    for href, kind in zip(hrefs, ("image/", "image/svg+xml"), strict=True):
        icon = page.request.get(f"{dashboard_url}{href}")
        assert icon.status == 200 and icon.headers["content-type"].startswith(kind), (href, icon.status)
    # Browsers ask for /favicon.ico on their own, whatever the page links: it leads to the same icon.
    asked = page.request.get(f"{dashboard_url}/favicon.ico", max_redirects=0)
    assert asked.status == 302 and asked.headers["location"] == hrefs[0]
    followed = page.request.get(f"{dashboard_url}/favicon.ico")
    assert followed.status == 200 and followed.body() == page.request.get(f"{dashboard_url}{hrefs[0]}").body()
