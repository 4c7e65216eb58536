"""Isolation for families (docs/guardians.md): a guardian reaches their own child and nothing else.

The routes are not listed by hand: every URL pattern of the project that takes a stack (the API's
`<stack>`, the dashboard's `<slug>`) is called with every method it serves, so a route added later is
covered without touching this file. A guardian of family A's child (A1) calling them for family B's
child in the same school (A2) or another school's student (B1) gets 404 — the answer of a stack
that does not exist, never naming it — and nothing is stored (the isolation matrix's snapshot of the
stack and everything pointing at it). On their own child, every staff dashboard page is a 404 and no
API write goes through. The live socket refuses them too. The matrix (tests/test_isolation_matrix.py)
runs its own endpoint list for a guardian as well.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

from accounts.models import Membership, Organization
from accounts.principal import Principal
from accounts.throttles import throttle_state_clear
from memories.governance.guardian_requests import request_approve, request_create
from memories.services import CheckpointInput, checkpoint_save, memory_create
from memoryhub.asgi import application
from stacks.models import GuardianLink, GuardianRequest, Stack
from tests.factories import make_org, make_stack, make_user
from tests.test_isolation_matrix import stored_state

METHODS = ("get", "post", "put", "patch", "delete")
PLACEHOLDER = {"uuid": lambda: str(uuid.uuid4()), "str": lambda: "x1", "path": lambda: "x1", "int": lambda: "1"}


def _walk(patterns: list, prefix: str = "") -> Iterator[tuple[str, URLPattern]]:
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            yield from _walk(pattern.url_patterns, prefix + str(pattern.pattern))
        else:
            yield prefix + str(pattern.pattern), pattern


def stack_routes() -> list[tuple[str, str]]:
    """(route, the stack parameter's name) of every URL pattern that names a stack."""
    found = []
    for route, _ in _walk(get_resolver().url_patterns):
        if route.startswith("admin/"):
            continue
        if "<str:stack>" in route:
            found.append((route, "stack"))
        elif "<str:slug>" in route:
            found.append((route, "slug"))
    return found


def fill(route: str, name: str, slug: str) -> str:
    """The route as a path: the stack parameter set to `slug`, any other parameter to a value of its type."""
    path = route.replace(f"<str:{name}>", slug)
    while "<" in path:
        start, end = path.index("<"), path.index(">")
        converter = path[start + 1:end].split(":")[0]
        path = path[:start] + PLACEHOLDER.get(converter, PLACEHOLDER["str"])() + path[end + 1:]
    return "/" + path


def world() -> dict:
    school_a, school_b = make_org("School A"), make_org("School B")
    stacks = {"A1": make_stack(school_a, "family-a-child"), "A2": make_stack(school_a, "family-b-child"),
              "B1": make_stack(school_b, "other-school-child")}
    for stack in stacks.values():
        memory_create(stack=stack, kind="note", payload={"content": f"about {stack.slug}"}, source="test")
        checkpoint_save(stack=stack, checkpoint=CheckpointInput(task=f"task of {stack.slug}"))
    guardian = make_user(school_a, role=Membership.Role.GUARDIAN)
    GuardianLink.objects.create(user=guardian, stack=stacks["A1"])
    other_family = make_user(school_a, role=Membership.Role.GUARDIAN)
    GuardianLink.objects.create(user=other_family, stack=stacks["A2"])
    client = Client()  # the access decision is under test here; CSRF is the session layer's (matrix: enforced)
    client.force_login(guardian)
    return {"stacks": stacks, "guardian": guardian, "client": client}


def test_the_route_list_is_not_empty_and_holds_both_api_and_dashboard_routes() -> None:
    routes = [route for route, _ in stack_routes()]
    assert "api/v1/stacks/<str:stack>/memories" in routes and "dashboard/family/<str:slug>/" in routes
    assert "api/v1/stacks/<str:stack>/guardians" in routes and "dashboard/students/<str:slug>/" in routes


def _call(client: Client, method: str, path: str, body: object = None):
    throttle_state_clear()  # many calls from one address; limits are tested elsewhere
    if method == "get":
        return client.get(path)
    return getattr(client, method)(path, body if body is not None else {}, content_type="application/json")


@pytest.mark.django_db
def test_a_guardian_gets_404_for_another_familys_child_on_every_route_and_stores_nothing() -> None:
    """Another family's child answers exactly as a stack that does not exist (404, or the same 400 or
    405 a body or method error gives before any stack is looked up), never naming it."""
    cast = world()
    client = cast["client"]
    for target in ("A2", "B1"):
        stack: Stack = cast["stacks"][target]
        before = stored_state(stack)
        for route, name in stack_routes():
            for method in METHODS:
                path = fill(route, name, stack.slug)
                response = _call(client, method, path)
                nowhere = _call(client, method, fill(route, name, "no-such-child"))
                context = f"{method.upper()} {path} ({target})"
                assert response.status_code == nowhere.status_code, f"{context}: {response.status_code}"
                assert response.status_code in (400, 404, 405), f"{context}: {response.status_code}"
                if not getattr(response, "streaming", False):
                    assert stack.slug.encode() not in response.content, f"{context}: names the stack"
        assert stored_state(stack) == before, f"{target}: something was stored"


def _writes(slug: str, memory_id: str) -> list[tuple[str, str, dict]]:
    base = f"/api/v1/stacks/{slug}"
    return [
        ("post", f"{base}/memories", {"kind": "note", "content": "a parent's note"}),
        ("post", f"{base}/memories/batch", {"items": [{"kind": "note", "content": "a parent's note"}]}),
        ("patch", f"{base}/memories/{memory_id}", {"content": "overwritten"}),
        ("post", f"{base}/memories/{memory_id}/forget", {"reason": "a parent asked"}),
        ("post", f"{base}/memories/{memory_id}/protect", {}),
        ("post", f"{base}/checkpoint", {"task": "a parent's task"}),
        ("put", f"{base}/boot-config/tone", {"value": "cold"}),
        ("post", f"{base}/ingest", {"content": "a parent's note", "kind": "note"}),
        ("post", f"{base}/promote", {"auto": True}),
        ("patch", f"{base}/", {"display_name": "renamed"}),
        ("post", f"{base}/archive", {}),
        ("post", f"{base}/guardians", {"email": "another@example.test"}),
        ("post", "/api/v1/keys/", {"stack_id": slug, "name": "a parent's key"}),
    ]


@pytest.mark.django_db
def test_on_their_own_child_a_guardian_reads_family_pages_only_and_writes_nothing() -> None:
    cast = world()
    client, own = cast["client"], cast["stacks"]["A1"]
    for route, name in stack_routes():
        if not route.startswith("dashboard/"):
            continue
        path = fill(route, name, own.slug)
        for method in METHODS:
            response = _call(client, method, path)
            context = f"{method.upper()} {path}"
            if route.startswith("dashboard/family/") and method == "get" and route.count("<") == 1:
                assert response.status_code == 200, f"{context}: {response.status_code}"
            elif route.startswith("dashboard/family/") and method == "get":  # a memory or request id of nobody's
                assert response.status_code == 404, f"{context}: {response.status_code}"
            elif route.startswith("dashboard/students/"):  # the staff pages of a student, theirs included
                assert response.status_code in (404, 405), f"{context}: {response.status_code}"
            else:  # a family's own actions (consent, pause: docs/consent.md), here with an empty form
                assert response.status_code < 500, f"{context}: {response.status_code}"
    memory_id = str(own.memories.values_list("id", flat=True).first())
    before = stored_state(own)  # (after the reads: the family's downloads are audited, as they should be)
    for method, path, body in _writes(own.slug, memory_id):
        response = _call(client, method, path, body)
        assert response.status_code == 403, f"{method.upper()} {path}: {response.status_code}"
        assert response.json()["error"]["code"] in ("guardian_read_only", "admin_required"), path
    assert stored_state(own) == before, "a guardian's call stored something"
    # Reads of the API through their session follow the same decision: their child, nobody else's.
    assert client.get(f"/api/v1/stacks/{own.slug}/memories").status_code == 200
    listed = client.get("/api/v1/stacks/").content.decode()
    assert own.slug in listed and "family-b-child" not in listed and "other-school-child" not in listed


@pytest.mark.django_db(transaction=True)
@pytest.mark.anyio
async def test_the_live_socket_takes_a_guardian_for_their_own_child_only() -> None:
    """Their child's page is live (a correction approved shows at once, as the family's row, docs/guardians.md
    "Requests"); another family's child and another school's student are refused, and so is the school socket."""
    cast = await sync_to_async(world)()
    cookie = cast["client"].cookies[settings.SESSION_COOKIE_NAME].value
    headers = [(b"origin", b"http://localhost"), (b"cookie", f"{settings.SESSION_COOKIE_NAME}={cookie}".encode())]
    for path in (f"/ws/stacks/{cast['stacks']['A2'].slug}/", f"/ws/stacks/{cast['stacks']['B1'].slug}/", "/ws/school/"):
        communicator = WebsocketCommunicator(application, path, headers=headers)
        connected, _ = await communicator.connect(timeout=10)
        assert not connected, path
        await communicator.disconnect()
    own = cast["stacks"]["A1"]
    communicator = WebsocketCommunicator(application, f"/ws/stacks/{own.slug}/", headers=headers)
    connected, _ = await communicator.connect(timeout=10)
    assert connected
    await sync_to_async(_approve_a_correction)(cast)
    message = await communicator.receive_json_from(timeout=10)
    assert message["type"] == "change" and len(message["rows"]) == 1
    html = message["rows"][0]["html"]
    assert "corrected by the family" in html and "Ask about this memory" in html  # the family's row
    assert f"/dashboard/students/{own.slug}/" not in html  # never the staff row's links
    await communicator.disconnect()


def _approve_a_correction(cast: dict) -> None:
    own = cast["stacks"]["A1"]
    memory = own.memories.get()
    admin = make_user(own.organization, role=Membership.Role.ADMIN)
    guardian_principal = Principal(user=cast["guardian"], organization=own.organization, role=Membership.Role.GUARDIAN)
    row = request_create(principal=guardian_principal, stack=own, kind="correction", memory_id=str(memory.pk),
                         text="corrected by the family")
    own.organization = Organization.objects.get(pk=own.organization_id)
    row.stack = own
    request_approve(principal=Principal(user=admin, organization=own.organization, role=Membership.Role.ADMIN), row=row)

@pytest.mark.django_db
def test_requests_reach_only_their_own_family_and_school() -> None:
    """A guardian's request names a memory of their own child (another family's memory id is a 404,
    even on their own child's route); the request and its certificate are a 404 for another family,
    and for the staff of another school (docs/guardians.md "Requests")."""
    cast = world()
    own, other = cast["stacks"]["A1"], cast["stacks"]["A2"]
    client = cast["client"]
    foreign = str(other.memories.values_list("id", flat=True).get())
    response = client.post(f"/dashboard/family/{own.slug}/memories/{foreign}/request", {"kind": "deletion"})
    assert response.status_code == 404 and not GuardianRequest.objects.exists()
    mine = str(own.memories.values_list("id", flat=True).get())
    assert client.post(f"/dashboard/family/{own.slug}/memories/{mine}/request", {"kind": "deletion"}).status_code == 302
    row = GuardianRequest.objects.get()
    GuardianRequest.objects.filter(pk=row.pk).update(certificate_ref=uuid.uuid4())
    other_family = Client()
    other_family.force_login(GuardianLink.objects.get(stack=other).user)
    for path in (f"/dashboard/family/{own.slug}/requests/{row.pk}/certificate",
                 f"/dashboard/family/{other.slug}/requests/{row.pk}/certificate"):
        assert other_family.get(path).status_code == 404, path
    school_b_admin = Client()
    school_b_admin.force_login(make_user(cast["stacks"]["B1"].organization, role=Membership.Role.ADMIN))
    assert school_b_admin.get(f"/dashboard/requests/{row.pk}/").status_code == 404
    assert school_b_admin.post(f"/dashboard/requests/{row.pk}/", {"action": "approve"}).status_code == 404
    assert f'data-request="{row.pk}"' not in school_b_admin.get("/dashboard/requests/").content.decode()
    row.refresh_from_db()
    assert row.status == GuardianRequest.Status.OPEN


@pytest.mark.django_db
def test_the_family_routes_that_name_no_stack_reach_only_their_own_role_and_school() -> None:
    """The weekly digest's toggle is the signed-in guardian's own (staff get 404; it changes no other
    family's setting); the Requests queue is a 404 for a guardian and a teacher (another school's
    admin sees their own, without it) and a request's page a 404 for all three — the request stays
    open (docs/guardians.md "Requests")."""
    cast = world()
    own, other = cast["stacks"]["A1"], cast["stacks"]["A2"]
    school_a = own.organization
    other_family = GuardianLink.objects.get(stack=other).user
    row = GuardianRequest.objects.create(organization=school_a, stack=own, kind="deletion", scope="stack",
                                         requested_by=cast["guardian"], due_at=own.created_at)
    teacher = make_user(school_a, role=Membership.Role.TEACHER)
    school_b_admin = make_user(cast["stacks"]["B1"].organization, role=Membership.Role.ADMIN)
    outsiders = {"teacher": teacher, "school B admin": school_b_admin, "guardian": cast["guardian"]}
    for who, user in outsiders.items():
        client = Client()
        client.force_login(user)
        for method, path, body in (("get", "/dashboard/requests/", None),
                                   ("get", "/dashboard/requests/?status=all", None),
                                   ("get", f"/dashboard/requests/{row.pk}/", None),
                                   ("post", f"/dashboard/requests/{row.pk}/", {"action": "approve"}),
                                   ("post", f"/dashboard/requests/{row.pk}/", {"action": "decline", "reason": "no"})):
            throttle_state_clear()
            response = getattr(client, method)(path, body) if body else client.get(path)
            queue = path.startswith("/dashboard/requests/?") or path == "/dashboard/requests/"
            expected = 200 if queue and user is school_b_admin else 404  # their own school's (empty) queue
            assert response.status_code == expected, f"{who}: {method.upper()} {path}: {response.status_code}"
            assert f'data-request="{row.pk}"'.encode() not in response.content, f"{who}: {path}"
        if user is not cast["guardian"]:
            assert client.post("/dashboard/families/digest", {"weekly_digest": "on"}).status_code == 404, who
    row.refresh_from_db()
    assert row.status == GuardianRequest.Status.OPEN
    assert not Membership.objects.filter(weekly_digest=True).exists(), "staff changed a digest setting"
    assert cast["client"].post("/dashboard/families/digest", {"weekly_digest": "on"}).status_code == 302
    subscribed = Membership.objects.filter(weekly_digest=True)
    assert list(subscribed.values_list("user_id", flat=True)) == [cast["guardian"].pk]
    assert not Membership.objects.get(user=other_family).weekly_digest
