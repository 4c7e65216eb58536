"""The access log: who was served which memories of a stack, when and through which path
(docs/privacy.md "Access log")."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.core.signals import request_finished
from django.db import close_old_connections
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.test import RequestFactory, override_settings
from django.urls import reverse
from django.utils import timezone

from accounts.authentication import principal_for_key
from accounts.authors import Author
from agents.mcp_tools import call_tool
from memories.lifecycle.ttl import ttl_purge
from memories.models import Memory, MemoryAccess
from memories.reads.access_log import AccessLogMiddleware, AccessPath, record_access
from memories.services import memory_create
from tests.actors import School
from tests.dashboard.pages import client_for
from tests.factories import bearer_client, make_key, sql_values

CANARY = "CANARY-zq81-fractions-pizza"
LOG = "access-log"


def _note(school: School, content: str, **fields: Any) -> Memory:
    return memory_create(stack=school.stack, kind="note", payload={"content": content, **fields}, source="api")


def _log(client: Any, school: School, **query: str) -> Any:
    return client.get(school.stack_url(LOG), query)


def _close(response: HttpResponseBase) -> None:
    """What the server does once it has sent the response (as Django's test client does: the test's
    transaction keeps its connection)."""
    request_finished.disconnect(close_old_connections)
    try:
        response.close()
    finally:
        request_finished.connect(close_old_connections)


def _rows(school: School, memory: Memory) -> list[MemoryAccess]:
    return list(MemoryAccess.objects.filter(stack=school.stack, memory_ids__contains=[memory.pk]).order_by("id"))


# --- who saw it ----------------------------------------------------------------------------------

def test_search_load_and_a_teachers_dashboard_view_are_on_the_memorys_seen_by(school: School) -> None:
    memory = _note(school, "Fractions click with pizza diagrams")
    key_b, secret_b = make_key(school.org, stack=school.stack, user=school.admin, name="key B")

    searched = school.agent.post(school.stack_url("search"), {"query": "pizza fractions"}, format="json",
                                 HTTP_X_AGENT_ID="tutor-a")
    assert searched.status_code == 200 and [hit["id"] for hit in searched.json()["results"]] == [str(memory.pk)]
    loaded = bearer_client(secret_b).get(school.stack_url("load"))
    assert loaded.status_code == 200 and str(memory.pk) in [item["id"] for item in loaded.json()["memories"]]
    viewed = client_for(school.teacher).get(reverse("dashboard:memory", args=[school.stack.slug, memory.pk]))
    assert viewed.status_code == 200

    answer = _log(school.admin_api, school, memory=str(memory.pk))
    assert answer.status_code == 200
    seen = [(row["path"], row["reader"]) for row in answer.json()["results"]]
    assert seen == [
        ("dashboard", {"path": "dashboard", "user_id": school.teacher.pk, "user": school.teacher.email}),
        ("load", {"path": "api", "key_id": key_b.public_id, "key_name": "key B", "user_id": school.admin.pk,
                  "user": school.admin.email}),
        ("search", {"path": "api", "key_id": school.agent_key.public_id, "key_name": "agent key",
                    "user_id": school.admin.pk, "user": school.admin.email, "agent": "tutor-a"}),
    ]

    # The memory page shows the same reads to an admin, and none of it to a teacher.
    page = client_for(school.admin).get(reverse("dashboard:memory", args=[school.stack.slug, memory.pk]))
    html = page.content.decode()
    assert "Seen by" in html and school.teacher.email in html and "tutor-a" in html and "key B" in html
    assert "Seen by" not in client_for(school.teacher).get(
        reverse("dashboard:memory", args=[school.stack.slug, memory.pk])).content.decode()


def test_one_row_per_request_with_every_id_served(school: School) -> None:
    memories = [_note(school, f"Note number {n} about geometry") for n in range(5)]
    assert school.agent.get(school.stack_url("memories")).status_code == 200
    rows = list(MemoryAccess.objects.filter(stack=school.stack))
    assert len(rows) == 1 and rows[0].path == "list"
    assert set(rows[0].memory_ids) == {m.pk for m in memories}


def test_every_read_path_records_its_path(school: School) -> None:
    memory = _note(school, "Angles add up to one hundred eighty degrees")
    agent = school.agent
    assert agent.get(school.stack_url(f"memories/{memory.pk}")).status_code == 200
    assert agent.get(school.stack_url("export/memory.md")).status_code == 200  # notes are not in MEMORY.md
    value = memory_create(stack=school.stack, kind="value", payload={"name": "care", "statement": "Be kind"},
                          source="api")
    assert agent.get(school.stack_url("export/memory.md")).status_code == 200
    archive = agent.get(school.stack_url("export/archive"))
    assert archive.status_code == 200
    b"".join(archive.streaming_content)  # type: ignore[attr-defined]  # closed by the client at the stream's end
    assert agent.get(school.stack_url("sync/pull")).status_code == 200
    assert agent.post("/sync/pull", {"stack_id": school.stack.slug}, format="json").status_code == 200
    assert agent.post("/memories/search", {"query": "angles degrees", "stack_id": school.stack.slug},
                      format="json").status_code == 200
    outcome = call_tool(principal_for_key(school.agent_key), "memory_get", {"memory_id": str(memory.pk)},
                        client_name="claude-desktop")
    assert not outcome.is_error

    paths = [(row.path, row.author["path"]) for row in _rows(school, memory)]
    assert paths == [("get", "api"), ("export", "api"), ("pull", "api"), ("pull", "kernle"),
                     ("search", "kernle"), ("mcp", "mcp")]
    assert _rows(school, memory)[-1].agent == "claude-desktop"
    assert [row.path for row in _rows(school, value)] == ["memory_md", "export", "pull", "pull"]


def test_nothing_recorded_when_nothing_was_served_or_the_log_is_off(school: School) -> None:
    _note(school, "Photosynthesis needs light")
    assert school.agent.post(school.stack_url("search"), {"query": "volcano"}, format="json").status_code == 200
    assert school.agent.get(school.stack_url("memories/" + str(uuid.uuid4()))).status_code == 404
    with override_settings(MEMORYHUB_ACCESS_LOG=False):
        assert school.agent.get(school.stack_url("memories")).status_code == 200
    assert not MemoryAccess.objects.exists()


def test_the_row_is_written_once_the_response_is_closed_not_before(school: School) -> None:
    memory_id = uuid.uuid4()

    def view(request: HttpRequest) -> HttpResponse:
        record_access(stack_id=school.stack.pk, author=Author(path="api", agent="probe"), path=AccessPath.GET,
                      memory_ids=[memory_id])
        assert not MemoryAccess.objects.exists()  # not during the view either
        return HttpResponse("body")

    response = AccessLogMiddleware(view)(RequestFactory().get("/"))
    assert isinstance(response, HttpResponse) and response.content == b"body"
    assert not MemoryAccess.objects.exists()
    _close(response)
    assert list(MemoryAccess.objects.values_list("memory_ids", flat=True)) == [[memory_id]]


def test_a_failed_request_records_nothing(school: School) -> None:
    def view(request: HttpRequest) -> HttpResponse:
        record_access(stack_id=school.stack.pk, author=Author(path="api"), path=AccessPath.GET,
                      memory_ids=[uuid.uuid4()])
        return HttpResponse("no", status=500)

    _close(AccessLogMiddleware(view)(RequestFactory().get("/")))
    assert not MemoryAccess.objects.exists()


# --- the privacy canary ---------------------------------------------------------------------------

def test_no_memory_text_in_the_access_log_canary(school: School) -> None:
    memory = _note(school, f"The secret word is {CANARY} for this student")
    memory_create(stack=school.stack, kind="belief", payload={"statement": f"Belief with {CANARY}"}, source="api")
    agent = school.agent
    agent.post(school.stack_url("search"), {"query": CANARY}, format="json", HTTP_X_AGENT_ID="tutor")
    agent.get(school.stack_url("load"))
    agent.get(school.stack_url("memories"))
    agent.get(school.stack_url(f"memories/{memory.pk}"))
    agent.get(school.stack_url("export/memory.md"))
    agent.get(school.stack_url("sync/pull"))
    agent.post("/sync/pull", {"stack_id": school.stack.slug}, format="json")
    client_for(school.teacher).get(reverse("dashboard:memory", args=[school.stack.slug, memory.pk]))
    client_for(school.teacher).get(reverse("dashboard:student", args=[school.stack.slug]))
    call_tool(principal_for_key(school.agent_key), "memory_search", {"query": CANARY})

    assert MemoryAccess.objects.filter(stack=school.stack).count() >= 9
    stored = sql_values("SELECT row_to_json(a)::text FROM memories_memoryaccess a")
    assert stored and not [row for row in stored if CANARY.lower() in row.lower()]
    # ...and the API's rows carry ids, never text.
    assert CANARY not in _log(school.admin_api, school).content.decode()


# --- the endpoint ---------------------------------------------------------------------------------

def test_filters_by_memory_agent_person_path_and_time(school: School) -> None:
    first = _note(school, "Cells divide by mitosis")
    second = _note(school, "Mitosis has four phases")
    school.agent.get(school.stack_url(f"memories/{first.pk}"), HTTP_X_AGENT_ID="tutor-1")
    school.agent.get(school.stack_url(f"memories/{second.pk}"), HTTP_X_AGENT_ID="tutor-2")
    client_for(school.teacher).get(reverse("dashboard:memory", args=[school.stack.slug, second.pk]))
    MemoryAccess.objects.filter(agent="tutor-1").update(at=timezone.now() - timedelta(days=3))

    def paths(**query: str) -> list[str]:
        answer = _log(school.admin_api, school, **query)
        assert answer.status_code == 200, answer.content
        return [row["path"] for row in answer.json()["results"]]

    assert paths(memory=str(second.pk)) == ["dashboard", "get"]
    assert paths(agent="tutor-1") == ["get"]
    assert paths(person=school.teacher.email.upper()) == ["dashboard"]
    assert paths(person=school.teacher.public_id) == ["dashboard"]
    assert paths(person="nobody@example.org") == []
    assert paths(path="get") == ["get", "get"]
    assert paths(since=(timezone.now() - timedelta(days=1)).isoformat()) == ["dashboard", "get"]
    assert paths(until=(timezone.now() - timedelta(days=1)).isoformat()) == ["get"]


def test_cursor_pages_walk_every_row_once(school: School) -> None:
    memory = _note(school, "Rivers flow to the sea")
    for _ in range(5):
        school.agent.get(school.stack_url(f"memories/{memory.pk}"))
    seen: list[int] = []
    url = school.stack_url(LOG) + "?limit=2"
    while url:
        answer = school.admin_api.get(url)
        assert answer.status_code == 200
        seen += [row["id"] for row in answer.json()["results"]]
        url = answer.json()["next"]
    assert seen == sorted(MemoryAccess.objects.values_list("id", flat=True), reverse=True)


@pytest.mark.parametrize("query", [{"memory": "not-a-uuid"}, {"path": "everything"}, {"since": "yesterday"},
                                   {"until": "2026-13-45"}, {"cursor": "bm9wZQ=="}, {"agent": "x" * 101},
                                   {"since": "2026-11-02T00:00:00Z", "until": "2026-11-01T00:00:00Z"}])
def test_a_bad_filter_is_400_naming_it(school: School, query: dict[str, str]) -> None:
    answer = _log(school.admin_api, school, **query)
    assert answer.status_code == 400
    assert set(answer.json()["error"]["fields"]) & (set(query) | {"until"})


def test_only_school_admins_and_the_stacks_own_credentials_read_it(school: School, other_school: School) -> None:
    memory = _note(school, "Volcanoes erupt magma")
    school.agent.get(school.stack_url(f"memories/{memory.pk}"))
    _, bob_secret = make_key(school.org, stack=school.other_stack, user=school.admin, name="bob's agent")
    _, issued_secret = make_key(school.org, stack=school.stack, user=school.teacher, stack_agent=False)

    assert _log(school.admin_api, school).status_code == 200
    assert _log(school.agent, school).status_code == 200
    assert _log(client_for(school.admin), school).status_code == 200
    # Out of reach: the one access decision's 404, never a hint the stack exists.
    assert _log(other_school.admin_api, school).status_code == 404
    assert _log(bearer_client(bob_secret), school).status_code == 404
    # Within reach, but who read a student's memories is not theirs to see.
    assert _log(client_for(school.teacher), school).json()["error"]["code"] == "access_log_forbidden"
    assert _log(bearer_client(issued_secret), school).status_code == 403


def test_the_archive_carries_the_access_log_for_those_who_may_read_it(school: School) -> None:
    memory = _note(school, "Magnets attract iron")
    school.agent.get(school.stack_url(f"memories/{memory.pk}"), HTTP_X_AGENT_ID="tutor")

    def archived_log(client: Any) -> list[dict[str, Any]] | None:
        import io
        import zipfile

        response = client.get(school.stack_url("export/archive"))
        archive = zipfile.ZipFile(io.BytesIO(b"".join(response.streaming_content)))
        if "access_log.jsonl" not in archive.namelist():
            return None
        return [json.loads(line) for line in archive.read("access_log.jsonl").decode().splitlines()]

    rows = archived_log(school.admin_api)
    assert rows is not None and rows[0]["path"] == "get" and rows[0]["memory_ids"] == [str(memory.pk)]
    assert rows[0]["reader"]["agent"] == "tutor"
    _, issued_secret = make_key(school.org, stack=school.stack, user=school.admin, stack_agent=False)
    assert archived_log(bearer_client(issued_secret)) is None


# --- retention --------------------------------------------------------------------------------------

def test_the_ttl_job_purges_rows_past_each_schools_retention(school: School, other_school: School) -> None:
    now = timezone.now()
    author = Author(path="api")
    other_school.org.access_log_retention_days = 30
    other_school.org.save(update_fields=["access_log_retention_days"])
    for stack, days in ((school.stack, 400), (school.stack, 300), (other_school.stack, 40), (other_school.stack, 10)):
        record_access(stack_id=stack.pk, author=author, path=AccessPath.GET, memory_ids=[uuid.uuid4()])
        MemoryAccess.objects.filter(at__gt=now - timedelta(minutes=5)).update(at=now - timedelta(days=days))

    run = ttl_purge(now=now)

    assert run.counts["access_log_purged"] == 2
    kept = sorted((row.stack_id, (now - row.at).days) for row in MemoryAccess.objects.all())
    assert kept == sorted([(school.stack.pk, 300), (other_school.stack.pk, 10)])


# --- over the real ASGI app ---------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)  # the handler's threads use their own connections
def test_over_asgi_the_row_is_written_after_the_last_byte_is_sent() -> None:
    from memoryhub.asgi import application
    from tests.factories import make_org, make_stack

    org = make_org()
    stack = make_stack(org, "ada")
    key, secret = make_key(org, stack=stack)
    memory = memory_create(stack=stack, kind="note", payload={"content": "Tides follow the moon"}, source="api")
    rows_when_sent: list[int] = []
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            rows_when_sent.append(await sync_to_async(MemoryAccess.objects.count)())

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": f"/api/v1/stacks/ada/memories/{memory.pk}", "raw_path": b"", "query_string": b"",
             "root_path": "", "server": ("testserver", 80), "client": ("127.0.0.1", 50000),
             "headers": [(b"host", b"testserver"), (b"authorization", f"Bearer {secret}".encode()),
                         (b"x-agent-id", b"tutor")]}
    asyncio.run(application(scope, receive, send))

    assert sent[0]["status"] == 200
    assert rows_when_sent == [0]  # the client had every byte before the row was written
    row = MemoryAccess.objects.get()
    assert (row.path, row.memory_ids, row.agent, row.key_id) == ("get", [memory.pk], "tutor", key.public_id)


def test_a_live_push_is_a_read_by_each_viewer_it_reaches(school: School) -> None:
    from accounts.selectors import principal_for_session
    from dashboard import live
    from dashboard.student import MemoryFilters

    memory = _note(school, "Photosynthesis makes sugar")
    change = live.Change(event_ids=(1,), seq=1, topics=frozenset({"memory"}), memory_ids=(str(memory.pk),),
                         actions=frozenset({"create"}))
    filters = MemoryFilters.of({})
    for viewer in (school.teacher, school.admin):
        principal = principal_for_session(viewer)
        assert principal is not None
        message = live.student_message(principal, school.stack, filters, change)
        assert message is not None and [row["id"] for row in message["rows"]] == [str(memory.pk)]

    rows = _rows(school, memory)
    assert [(row.path, row.user_id) for row in rows] == [("live", school.teacher.pk), ("live", school.admin.pk)]


def test_erasing_the_stack_erases_its_access_log(school: School) -> None:
    memory = _note(school, "Lives on Elm Street")
    school.agent.get(school.stack_url(f"memories/{memory.pk}"))
    other = memory_create(stack=school.other_stack, kind="note", payload={"content": "Bob's note"}, source="api")
    school.admin_api.get(f"/api/v1/stacks/{school.other_stack.slug}/memories/{other.pk}")

    erased = school.admin_api.post(school.stack_url("erase"), {"requested_by": "parent", "confirm": school.stack.slug},
                                   format="json")

    assert erased.status_code == 200 and erased.json()["counts"]["access_log_rows"] == 1
    assert not MemoryAccess.objects.filter(stack=school.stack).exists()
    assert MemoryAccess.objects.filter(stack=school.other_stack).count() == 1  # another student's stays


def test_a_row_that_cannot_be_written_is_logged_as_a_count_and_breaks_nothing(
        school: School, caplog: pytest.LogCaptureFixture) -> None:
    memory = _note(school, f"Secret {CANARY}")
    # A path longer than its column: the INSERT fails inside the test's transaction.
    record_access(stack_id=school.stack.pk, author=Author(path="api", agent="tutor"), path="p" * 40,
                  memory_ids=[memory.pk])

    assert "access log: 1 row(s) not written (DataError)" in caplog.text
    assert str(memory.pk) not in caplog.text and CANARY not in caplog.text
    # The caller's transaction goes on: only the INSERT's savepoint was rolled back.
    assert school.agent.get(school.stack_url(f"memories/{memory.pk}")).status_code == 200
    assert list(MemoryAccess.objects.values_list("path", flat=True)) == ["get"]
