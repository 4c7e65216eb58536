"""The school dashboard in real Chromium (docs/dashboard.md "Pages"), one flow per role.

Every page visited is checked by tests/e2e/browser.py's `check_page`: its HTTP status, a
screenshot under the run's artifacts, axe-core with 0 serious/critical violations, and no console
error, Content-Security-Policy refusal or request to another host.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import FilePayload

from accounts.models import ApiKey, AuditEvent, Membership, Organization, User
from memories.models import Memory
from memories.search.embedding_backlog import embedding_sweep_run
from memories.search.embedding_model import deployment_model_switch
from memories.search.embeddings import get_embedder
from stacks.models import Stack, TeacherAssignment
from tests.e2e.agent import agent_signed_in, cli_output
from tests.e2e.browser import WatchedPage, check_page, sign_in
from tests.e2e.conftest import KernleCLI
from tests.factories import assign_teacher, make_key, make_org, make_stack, make_user

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PASSWORD = "correct horse battery staple"  # tests/factories.make_user's default
ADMIN, TEACHER, BILLING = (Membership.Role.ADMIN, Membership.Role.TEACHER, Membership.Role.BILLING)


def staff(org: Organization, role: str, email: str) -> User:
    """A member who signs in with their email, as staff do (user_create makes it the username)."""
    return make_user(org, role=role, email=email, username="")


def test_sign_in_lands_on_the_overview_of_the_school(open_page: Callable[[], WatchedPage], dashboard_url: str) -> None:
    org = make_org("Riverside Primary")
    admin = staff(org, ADMIN, "head@riverside.example")
    stacks = [make_stack(org, "amara-okafor"), make_stack(org, "ben-liu")]
    watched = open_page()
    page = watched.page

    # Not signed in: the dashboard sends the visitor to the sign-in page.
    watched.goto(f"{dashboard_url}/dashboard/")
    check_page(watched, "sign-in-first")
    assert urlsplit(page.url).path == "/login/"

    # A wrong password is refused on the page, in words, and nobody is signed in.
    page.get_by_label("Email").fill(admin.email)
    page.get_by_label("Password").fill("not the password")
    page.get_by_role("button", name="Sign in").click()
    check_page(watched, "sign-in-refused")
    assert page.get_by_role("alert").inner_text() == "Wrong email or password."
    assert urlsplit(page.url).path == "/login/"

    sign_in(watched, dashboard_url, admin.email, PASSWORD)
    check_page(watched, "overview")
    assert page.get_by_role("heading", level=1).inner_text() == org.name
    for stack in stacks:
        assert page.locator(f'[data-stack="{stack.slug}"]').count() == 1


def nav_links(watched: WatchedPage) -> list[str]:
    """The main navigation's link texts, as the signed-in person sees them."""
    return [text.strip() for text in watched.page.get_by_role("navigation", name="Main").get_by_role("link")
            .all_inner_texts()]


def name_link(watched: WatchedPage, stack: Stack) -> Any:
    """The link to `stack`'s page in its row of the table shown: named by the student's name, with
    the stack id shown beside it."""
    row = watched.page.locator(f'tr[data-stack="{stack.slug}"]')
    link = row.get_by_role("link", name=stack.display_name, exact=True)
    assert link.get_attribute("href") == f"/dashboard/students/{stack.slug}/"
    assert stack.slug in row.inner_text()
    return link


def test_a_teacher_reaches_assigned_students_only_and_no_key_page(
        open_page: Callable[[], WatchedPage], dashboard_url: str) -> None:
    org = make_org("Hillside Secondary")
    teacher = staff(org, TEACHER, "maths@hillside.example")
    assigned = make_stack(org, "chloe-adams", display_name="Chloe Adams")
    unassigned = make_stack(org, "dan-brown", display_name="Dan Brown")
    assign_teacher(teacher, assigned)
    watched = open_page()
    page = watched.page

    sign_in(watched, dashboard_url, teacher.email, PASSWORD)
    check_page(watched, "overview")
    assert page.locator(f'[data-stack="{assigned.slug}"]').count() == 1
    assert page.locator(f'[data-stack="{unassigned.slug}"]').count() == 0
    assert "Keys" not in nav_links(watched) and "Roster" not in nav_links(watched)

    # The student's name is the link (the id stays visible beside it); clicking it opens the page.
    name_link(watched, assigned).click()
    check_page(watched, "assigned-student")
    assert urlsplit(page.url).path == f"/dashboard/students/{assigned.slug}/"
    assert page.get_by_role("heading", level=1).inner_text() == "Chloe Adams"

    # The unassigned student of the same school is "no such page", exactly like a made-up one.
    assert watched.goto(f"{dashboard_url}/dashboard/students/{unassigned.slug}/") == 404
    check_page(watched, "unassigned-student", status=404)
    assert "Dan Brown" not in page.content()
    assert watched.goto(f"{dashboard_url}/dashboard/keys/") == 404
    check_page(watched, "keys", status=404)
    # Nor can the teacher's session revoke a key of the school by posting to its address.
    key, _ = make_key(org, stack=assigned, name="tutor agent")
    csrf = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    posted = page.request.post(f"{dashboard_url}/dashboard/keys/{key.public_id}/revoke",
                               headers={"X-CSRFToken": csrf}, max_redirects=0)
    assert posted.status == 404
    key.refresh_from_db()
    assert key.revoked_at is None


def test_a_billing_user_joins_by_invitation_and_sees_only_billing(
        open_page: Callable[[], WatchedPage], dashboard_url: str) -> None:
    org = make_org("Lakeside Academy")
    admin = staff(org, ADMIN, "head@lakeside.example")
    student = make_stack(org, "eve-fisher", display_name="Eve Fisher")

    # The admin invites the bursar; the link is shown to the admin once.
    admin_page = open_page()
    sign_in(admin_page, dashboard_url, admin.email, PASSWORD)
    admin_page.goto(f"{dashboard_url}/dashboard/people/")
    check_page(admin_page, "people")
    admin_page.page.get_by_label("Email").fill("bursar@lakeside.example")
    admin_page.page.get_by_label("Role").select_option(BILLING)
    admin_page.page.get_by_role("button", name="Send invitation").click()
    check_page(admin_page, "people-invitation-sent", status=201)
    link = admin_page.page.locator("#invitation-link").inner_text().strip()
    assert urlsplit(link).path.startswith("/invitations/"), link

    # The bursar, in their own browser, sets a password and lands on billing.
    watched = open_page()
    page = watched.page
    watched.goto(link.replace("http://127.0.0.1:", "http://localhost:"))
    check_page(watched, "invitation")
    page.get_by_label("New password").fill("ledger-balance-42-quarterly")
    page.get_by_label("Confirm password").fill("ledger-balance-42-quarterly")
    page.get_by_role("button", name="Join school").click()
    check_page(watched, "billing")
    assert urlsplit(page.url).path == "/dashboard/billing/"
    assert nav_links(watched) == ["Billing"]
    assert Membership.objects.get(user__email="bursar@lakeside.example", organization=org).role == BILLING

    # The overview sends a billing user to billing; every other dashboard page is "no such page".
    watched.goto(f"{dashboard_url}/dashboard/")
    assert urlsplit(page.url).path == "/dashboard/billing/"
    for name, path in (("overview-redirect", None), ("roster", "/dashboard/roster/"),
                       ("people", "/dashboard/people/"), ("keys", "/dashboard/keys/"),
                       ("audit", "/dashboard/audit/"), ("student", f"/dashboard/students/{student.slug}/"),
                       ("student-manage", f"/dashboard/students/{student.slug}/manage"),
                       ("student-create", "/dashboard/students/new")):
        if path is None:
            check_page(watched, name)
            continue
        assert watched.goto(f"{dashboard_url}{path}") == 404, path
        check_page(watched, name, status=404)
        assert "Eve Fisher" not in page.content()

    # Their own password is theirs to change.
    assert watched.goto(f"{dashboard_url}/account/password/") == 200
    check_page(watched, "password-change")


# --- the admin's day: roster, a key, the real kernle CLI, search, forget/recover, revoke -------------

TEACHER_EMAIL = "form.tutor@oakfield.example"
# What the student's tutor agent will remember (tests/memories/test_search_real_model.py shows that
# MiniLM ranks each of these first for its paraphrase).
FACTS = [
    "Amara understands fractions much better when the teacher cuts a pizza into equal slices.",
    "Amara plays the violin in the school orchestra on Thursdays.",
    "Amara is allergic to peanuts; keep snacks nut-free on trips.",
]
PARAPHRASE = "What helps this student grasp parts of a whole?"  # shares no word with FACTS[0]


def roster_csv(rows: list[tuple[str, str, str, str]]) -> bytes:
    lines = ["student_id,name,grade,teacher_email"] + [",".join(row) for row in rows]
    return ("\n".join(lines) + "\n").encode()


def good_rows() -> list[tuple[str, str, str, str]]:
    rows = [("s1001", "Amara Okafor", "7", TEACHER_EMAIL)]
    rows += [(f"s{1001 + n}", f"Student {n + 1}", "7", TEACHER_EMAIL if n % 2 else "") for n in range(1, 28)]
    return rows


def upload_roster(watched: WatchedPage, content: bytes) -> None:
    upload: FilePayload = {"name": "roster.csv", "mimeType": "text/csv", "buffer": content}
    watched.page.get_by_label("Roster CSV file").set_input_files(files=upload)
    watched.page.get_by_role("button", name="Preview import").click()


@pytest.fixture
def minilm(settings: Any) -> Any:
    """The real MiniLM model for this test's server and embedding job, so a paraphrase can match."""
    settings.EMBEDDING_PROVIDER = "minilm"
    embedder = get_embedder()
    deployment_model_switch(embedder.model_id)  # this deployment embeds with MiniLM (docs/algorithms.md §10.3)
    return embedder


@pytest.mark.long
def test_an_admin_imports_a_roster_issues_a_key_the_cli_uses_then_revokes_it(
        open_page: Callable[[], WatchedPage], dashboard_url: str, kernle: KernleCLI, minilm: Any) -> None:
    org = make_org("Oakfield School", tier="enterprise")  # room for the whole roster
    admin = staff(org, ADMIN, "head@oakfield.example")
    teacher = staff(org, TEACHER, TEACHER_EMAIL)
    watched = open_page()
    page = watched.page
    sign_in(watched, dashboard_url, admin.email, PASSWORD)
    check_page(watched, "overview")

    # 1. A 30-row roster with 2 bad rows: both reported with their spreadsheet row, nothing applied.
    rows = good_rows()
    bad = [*rows[:7], ("bad id!", "Bad Id", "7", ""), *rows[7:19], ("s2000", "Lost", "7", "nobody@elsewhere.example"),
           *rows[19:]]
    assert len(bad) == 30
    watched.goto(f"{dashboard_url}/dashboard/roster/")
    check_page(watched, "roster")
    upload_roster(watched, roster_csv(bad))
    check_page(watched, "roster-preview-errors", status=400)
    errors = page.locator("#roster-errors tbody tr")
    assert errors.count() == 2
    assert [errors.nth(i).locator("td").first.inner_text() for i in range(2)] == ["9", "22"]  # header = row 1
    assert "nobody@elsewhere.example is not a teacher" in errors.nth(1).inner_text()
    assert page.get_by_role("button", name="Apply import").count() == 0
    assert not Stack.objects.filter(organization=org).exists()

    # The 28 good rows: previewed, applied, every student created with their teacher.
    upload_roster(watched, roster_csv(rows))
    check_page(watched, "roster-preview")
    assert page.locator("#count-create").inner_text() == "28"
    page.get_by_role("button", name="Apply import").click()
    check_page(watched, "roster-applied")
    assert "28 created" in page.locator(".messages").inner_text()
    assert Stack.objects.filter(organization=org, kind=Stack.Kind.STUDENT).count() == 28
    amara = Stack.objects.get(organization=org, slug="s1001")
    assert TeacherAssignment.objects.filter(stack=amara, user=teacher).exists()
    watched.goto(f"{dashboard_url}/dashboard/roster/?q=s1001")
    check_page(watched, "roster-search")
    name_link(watched, amara)

    # 2. A key bound to Amara's stack; the secret is read from the page, shown once.
    watched.goto(f"{dashboard_url}/dashboard/keys/")
    check_page(watched, "keys")
    page.get_by_label("Key name").fill("Amara's tutor")
    page.get_by_label("Scope").select_option("s1001")
    page.get_by_role("button", name="Issue key").click()
    check_page(watched, "key-issued", status=201)
    secret = page.locator("#new-key-secret").inner_text().strip()
    assert secret.startswith("knl_sk_")
    assert "kernle auth login" in page.locator("#new-key-usage").inner_text()
    key = ApiKey.objects.get(organization=org, name="Amara's tutor")
    assert key.stack_id == amara.pk and key.revoked_at is None
    key_row = page.locator(f'[data-key="{key.public_id}"]')
    assert key_row.get_by_role("link", name="Amara Okafor").get_attribute("href") == "/dashboard/students/s1001/"

    # 3. The real kernle CLI logs in with it and pushes what the agent remembered.
    # kernle wants provenance: the notes are derived from a raw capture of the tutoring session.
    agent = agent_signed_in(kernle, secret=secret, backend_url=dashboard_url, stack="s1001",
                            transcript="Tutoring session transcript, week 3")
    cli = agent.run
    for fact in FACTS:
        agent.note(fact)
    pushed = cli("sync", "push", "--json")
    assert pushed.returncode == 0, cli_output(pushed)
    assert kernle.json(pushed)["synced"] == len(FACTS), pushed.stdout  # raw captures stay on the device
    # The embedding job (Celery's beat runs it every minute) gives the pushed notes their vectors.
    embedding_sweep_run()
    assert set(Memory.objects.filter(stack=amara).values_list("embedding_model", flat=True)) == {minilm.model_id}
    assert not Memory.objects.filter(stack=amara, embedded_version__isnull=True).exists()

    # 4. A paraphrase finds the pizza note on Amara's page (reached by her name on the overview), by meaning.
    watched.goto(f"{dashboard_url}/dashboard/?q=s1001")
    check_page(watched, "overview-search")
    name_link(watched, amara).click()
    check_page(watched, "student")
    page.get_by_label("Search memories").fill(PARAPHRASE)
    page.get_by_role("button", name="Search").click()
    check_page(watched, "student-search")
    results = page.get_by_role("list", name="Search results").get_by_role("listitem")
    assert FACTS[0] in results.first.inner_text(), results.all_inner_texts()
    assert "meaning" in results.first.inner_text()  # matched by the semantic leg, not by shared words

    # 5. Forget it with a reason, then recover it.
    results.first.get_by_role("link", name="Details").click()
    check_page(watched, "memory")
    memory = Memory.objects.get(stack=amara, text=FACTS[0])
    page.get_by_label("Reason").fill("parent asked")
    page.get_by_role("button", name="Forget").click()
    check_page(watched, "memory-forgotten")
    assert watched.dialogs[-1].startswith("Forget this memory?")
    memory.refresh_from_db()
    assert memory.forgotten_at is not None and memory.forgotten_reason == "parent asked"
    page.get_by_role("button", name="Recover").click()
    check_page(watched, "memory-recovered")
    memory.refresh_from_db()
    assert memory.forgotten_at is None

    # 6. Revoke the key in the browser: the CLI is refused from then on.
    watched.goto(f"{dashboard_url}/dashboard/keys/")
    page.get_by_role("button", name="Revoke Amara's tutor").click()
    check_page(watched, "key-revoked")
    assert page.locator(f'[data-key="{key.public_id}"]').get_by_text("revoked").count() == 1
    key.refresh_from_db()
    assert key.revoked_at is not None
    agent.note("Amara finished the reading challenge.")  # a local write; only the sync reaches the server
    refused = cli("sync", "push", "--json")
    # The server answers 401; kernle reports it and exits 1.
    assert refused.returncode == 1 and "Authentication failed" in refused.stdout, cli_output(refused)
    assert Memory.objects.filter(stack=amara).count() == len(FACTS)  # nothing arrived after revoking

    # The audit page shows the day's work.
    watched.goto(f"{dashboard_url}/dashboard/audit/")
    check_page(watched, "audit")
    actions = set(AuditEvent.objects.filter(organization=org).values_list("action", flat=True))
    assert {"roster.imported", "key.issued", "key.revoked"} <= actions, actions
