"""Provenance (docs/privacy.md "Provenance"): every memory names who wrote it first and every revision
who made its change — the credential, the agent label (`X-Agent-Id`, the MCP client's name) and the
path — on the API, the student page, the archive and the audit log; another school sees none of it."""

from __future__ import annotations

import asyncio
import io
import json
import zipfile
from datetime import timedelta
from typing import Any

import httpx
import httpx2
import mcp_types as types
import pytest
from django.core import signing
from django.urls import reverse
from django.utils import timezone
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from accounts.models import AuditEvent
from memories.lifecycle.decay_pass import decay_pass
from memories.models import Memory, MemoryRevision
from memories.services import memory_create
from tests.actors import School, school_cast
from tests.agents.test_mcp import server  # noqa: F401 - the uvicorn server fixture, reused
from tests.dashboard.pages import client_for
from tests.factories import bearer_client, make_key

pytestmark = pytest.mark.django_db

LQ, RQ = "\u2018", "\u2019"  # the quotes the page puts around a key's name
T0 = "2026-11-20T09:00:00+00:00"
T1 = "2026-11-20T10:00:00+00:00"


@pytest.fixture
def school() -> School:
    return school_cast()


def _tutor(school: School) -> tuple[str, Any]:
    """The stack's own agent key named 'Year 5 tutor', sending X-Agent-Id: Tutor-bot."""
    key, secret = make_key(school.org, stack=school.stack, user=school.admin, name="Year 5 tutor")
    client = bearer_client(secret)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}", HTTP_X_AGENT_ID="Tutor-bot")
    return key.public_id, client


def _coach(school: School) -> tuple[str, Any]:
    """A school key named 'Reading coach', sending X-Agent-Id: Reader-bot."""
    key, secret = make_key(school.org, user=school.admin, name="Reading coach")
    client = bearer_client(secret)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}", HTTP_X_AGENT_ID="Reader-bot")
    return key.public_id, client


def _episode(record_id: str, slug: str, outcome: str, at: str) -> dict[str, Any]:
    data = {"id": record_id, "stack_id": slug, "objective": "Read a chapter", "outcome": outcome,
            "created_at": T0, "local_updated_at": at, "version": 1, "deleted": False}
    return {"operation": "update", "table": "episodes", "record_id": record_id, "local_updated_at": at,
            "version": 1, "data": data}


def _kernle_push(client: Any, slug: str, operations: list[dict[str, Any]]) -> dict[str, Any]:
    response = client.post("/sync/push", {"stack_id": slug, "operations": operations}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["conflicts"] == [], body
    return body


def _detail(client: Any, slug: str, memory_id: Any) -> dict[str, Any]:
    response = client.get(f"/api/v1/stacks/{slug}/memories/{memory_id}")
    assert response.status_code == 200, response.content
    return response.json()


def test_two_agents_on_two_paths_are_each_named_on_their_memories_and_revisions(school: School) -> None:
    tutor_key, tutor = _tutor(school)
    coach_key, coach = _coach(school)
    slug = school.stack.slug
    # The tutor writes a note on the native API; the coach then edits it there.
    created = tutor.post(f"/api/v1/stacks/{slug}/memories", {"kind": "note", "content": "Likes dragons"},
                         format="json")
    assert created.status_code == 201, created.content
    note_id = created.json()["id"]
    assert created.json()["written_by"] == {"path": "api", "key_id": tutor_key, "key_name": "Year 5 tutor",
                                            "user_id": school.admin.pk, "user": school.admin.email,
                                            "agent": "Tutor-bot"}
    assert coach.patch(f"/api/v1/stacks/{slug}/memories/{note_id}", {"content": "Likes dragons and maps"},
                       format="json").status_code == 200
    # The coach pushes an episode through kernle; the tutor's kernle push then updates it.
    _kernle_push(coach, slug, [_episode("ep-1", slug, "Finished it", T0)])
    _kernle_push(tutor, slug, [_episode("ep-1", slug, "Finished it and retold it", T1)])
    # A native push (the API path) of the coach's.
    pushed = coach.post(f"/api/v1/stacks/{slug}/sync/push", {"operations": [
        {"op": "upsert", "kind": "note", "record_id": "n-2", "updated_at": T0, "data": {"content": "Maps"}}]},
        format="json")
    assert pushed.status_code == 200 and pushed.json()["applied"] == 1, pushed.content

    note = _detail(school.admin_api, slug, note_id)
    assert note["written_by"]["agent"] == "Tutor-bot" and note["written_by"]["key_name"] == "Year 5 tutor"
    assert [(r["action"], r["author"]["agent"], r["author"]["key_id"], r["author"]["path"])
            for r in note["revisions"]] == [("update", "Reader-bot", coach_key, "api")]
    episode = Memory.objects.get(stack=school.stack, record_id="ep-1")
    detail = _detail(school.admin_api, slug, episode.pk)
    assert detail["written_by"] == {"path": "kernle", "key_id": coach_key, "key_name": "Reading coach",
                                    "user_id": school.admin.pk, "user": school.admin.email, "agent": "Reader-bot"}
    assert [(r["author"]["agent"], r["author"]["path"], r["author"]["key_name"]) for r in detail["revisions"]] \
        == [("Tutor-bot", "kernle", "Year 5 tutor")]
    native = Memory.objects.get(stack=school.stack, record_id="n-2")
    assert native.written_by["agent"] == "Reader-bot" and native.written_by["path"] == "api"
    # The stored rows say the same (the API reads them, it does not make them up).
    assert MemoryRevision.objects.get(memory_id=episode.pk).author["key_id"] == tutor_key


def test_without_the_header_the_key_alone_is_named(school: School) -> None:
    created = school.agent.post(school.stack_url("memories"), {"kind": "note", "content": "Plain"}, format="json")
    assert created.status_code == 201
    assert created.json()["written_by"] == {"path": "api", "key_id": school.agent_key.public_id,
                                            "key_name": "agent key", "user_id": school.admin.pk,
                                            "user": school.admin.email}


@pytest.mark.parametrize("label", ["x" * 101, "bot\x07", "tab\tbot"])
def test_a_bad_agent_label_is_400_and_nothing_is_stored(school: School, label: str) -> None:
    slug = school.stack.slug
    client = bearer_client(school.agent_secret)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {school.agent_secret}", HTTP_X_AGENT_ID=label)
    responses = [
        client.post(f"/api/v1/stacks/{slug}/memories", {"kind": "note", "content": "Never stored"}, format="json"),
        client.post(f"/api/v1/stacks/{slug}/memories/batch", {"items": [{"kind": "note", "content": "No"}]},
                    format="json"),
        client.post("/sync/push", {"stack_id": slug, "operations": [_episode("ep-x", slug, "No", T0)]},
                    format="json"),
        client.post(f"/api/v1/stacks/{slug}/sync/push", {"operations": [
            {"op": "upsert", "kind": "note", "record_id": "n-x", "updated_at": T0, "data": {"content": "No"}}]},
            format="json"),
    ]
    for response in responses:
        assert response.status_code == 400, response.content
        assert response.json()["error"]["code"] == "invalid"
        assert "X-Agent-Id" in response.json()["error"]["fields"]
    assert not Memory.objects.filter(stack=school.stack).exists()


def test_the_agent_label_is_redacted_like_any_text(school: School) -> None:
    client = bearer_client(school.agent_secret)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {school.agent_secret}", HTTP_X_AGENT_ID="bot of ada@example.org")
    created = client.post(school.stack_url("memories"), {"kind": "note", "content": "Hello"}, format="json")
    assert created.status_code == 201
    agent = Memory.objects.get(pk=created.json()["id"]).written_by["agent"]
    assert "ada@example.org" not in agent and agent.startswith("bot of ")


def test_the_student_page_names_the_writer_and_filters_by_agent(school: School) -> None:
    _, tutor = _tutor(school)
    _, coach = _coach(school)
    slug = school.stack.slug
    assert tutor.post(f"/api/v1/stacks/{slug}/memories", {"kind": "note", "content": "Tutor's dragons note"},
                      format="json").status_code == 201
    _kernle_push(coach, slug, [_episode("ep-1", slug, "Coach's chapter", T0)])
    client = client_for(school.admin)
    url = reverse("dashboard:student", args=[slug])
    page = client.get(url).content.decode()
    assert f"written by Tutor-bot (key {LQ}Year 5 tutor{RQ}) via api" in page
    assert f"written by Reader-bot (key {LQ}Reading coach{RQ}) via kernle" in page
    assert '<option value="Reader-bot">' in page and '<option value="Tutor-bot">' in page
    filtered = client.get(url, {"agent": "Tutor-bot"})
    assert filtered.status_code == 200
    body = filtered.content.decode()
    assert "Tutor&#x27;s dragons note" in body and "Coach&#x27;s chapter" not in body
    searched = client.get(url, {"agent": "Reader-bot", "q": "chapter"}).content.decode()
    assert "Tutor&#x27;s dragons note" not in searched


def test_a_dashboard_change_names_the_person_in_the_revision_and_the_audit_log(school: School) -> None:
    _, tutor = _tutor(school)
    created = tutor.post(school.stack_url("memories"), {"kind": "note", "content": "To forget"}, format="json")
    memory = Memory.objects.get(pk=created.json()["id"])
    client = client_for(school.admin)
    response = client.post(reverse("dashboard:memory-action", args=[school.stack.slug, memory.pk, "forget"]),
                           {"reason": "outdated"})
    assert response.status_code == 302
    revision = MemoryRevision.objects.get(memory=memory)
    assert revision.author == {"path": "dashboard", "user_id": school.admin.pk, "user": school.admin.email}
    event = AuditEvent.objects.get(action="memory.forgotten", target_id=str(memory.pk))
    assert event.metadata["author"] == revision.author
    detail = client.get(reverse("dashboard:memory", args=[school.stack.slug, memory.pk])).content.decode()
    assert f"{school.admin.email} via dashboard" in detail
    assert f"Written by Tutor-bot (key {LQ}Year 5 tutor{RQ}) via api" in detail


def test_a_decay_forget_names_the_job(school: School) -> None:
    fading = memory_create(stack=school.stack, kind="note", payload={"content": "A stale scratch note"},
                           source="api")
    Memory.objects.filter(pk=fading.pk).update(created_at=timezone.now() - timedelta(days=900))
    decay_pass(now=timezone.now() + timedelta(hours=1), workers=1)
    revision = MemoryRevision.objects.get(memory=fading, action="forget")
    assert revision.author == {"path": "job", "agent": "decay"}
    assert _detail(school.admin_api, school.stack.slug, fading.pk)["revisions"][0]["author"] == revision.author
    page = client_for(school.admin).get(reverse("dashboard:memory", args=[school.stack.slug, fading.pk]))
    assert f"the server (job {LQ}decay{RQ})" in page.content.decode()


def test_the_archive_carries_who_wrote_and_who_changed(school: School) -> None:
    tutor_key, tutor = _tutor(school)
    coach_key, coach = _coach(school)
    created = tutor.post(school.stack_url("memories"), {"kind": "note", "content": "Archived"}, format="json")
    memory_id = created.json()["id"]
    assert coach.post(school.stack_url(f"memories/{memory_id}/forget"), {"reason": "old"},
                      format="json").status_code == 200
    response: Any = school.admin_api.get(school.stack_url("export/archive"))
    assert response.status_code == 200
    archive = zipfile.ZipFile(io.BytesIO(b"".join(response.streaming_content)))
    notes = [json.loads(line) for line in archive.read("memories/note.jsonl").decode().splitlines()]
    revisions = [json.loads(line) for line in archive.read("revisions.jsonl").decode().splitlines()]
    assert [n["written_by"]["key_id"] for n in notes if n["id"] == memory_id] == [tutor_key]
    assert [(r["action"], r["author"]["key_id"], r["author"]["agent"]) for r in revisions
            if r["memory_id"] == memory_id] == [("forget", coach_key, "Reader-bot")]


def test_another_school_cannot_read_the_provenance(school: School) -> None:
    _, tutor = _tutor(school)
    created = tutor.post(school.stack_url("memories"), {"kind": "note", "content": "Ours"}, format="json")
    memory_id = created.json()["id"]
    other = school_cast("Other school", stack_slug="carol", other_stack_slug="dan")
    assert other.admin_api.get(school.stack_url(f"memories/{memory_id}")).status_code == 404
    assert other.admin_api.get(other.stack_url(f"memories/{memory_id}")).status_code == 404
    page = client_for(other.admin).get(reverse("dashboard:memory", args=[school.stack.slug, memory_id]))
    assert page.status_code == 404 and b"Tutor-bot" not in page.content
    listing = client_for(other.admin).get(reverse("dashboard:student", args=[school.stack.slug]),
                                          {"agent": "Tutor-bot"})
    assert listing.status_code == 404 and b"Tutor-bot" not in listing.content


# --- MCP: the client's name is the agent label ----------------------------------------------------------

async def _mcp_calls(base: str, secret: str, client_name: str, calls: list[tuple[str, dict[str, Any]]],
                     headers: dict[str, str] | None = None) -> list[types.CallToolResult]:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {secret}", **(headers or {})}) as http, \
            streamable_http_client(f"{base}/mcp", http_client=http) as (read, write), \
            ClientSession(read, write, client_info=types.Implementation(name=client_name, version="1")) as session:
        await session.initialize()
        return [await session.call_tool(name, arguments) for name, arguments in calls]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_two_agents_and_an_mcp_client_on_one_stack_are_each_named(server: str) -> None:  # noqa: F811
    school = school_cast()
    _, tutor = _tutor(school)
    _, coach = _coach(school)
    slug = school.stack.slug
    assert tutor.post(f"/api/v1/stacks/{slug}/memories", {"kind": "note", "content": "Tutor: dragons"},
                      format="json").status_code == 201
    _kernle_push(coach, slug, [_episode("ep-1", slug, "Coach: chapter one", T0)])
    key, secret = make_key(school.org, stack=school.stack, user=school.admin, name="Claude desktop")
    remembered, = asyncio.run(_mcp_calls(server, secret, "Claude-tutor", [
        ("memory_remember", {"content": "Claude: retells stories", "force_create": True})]))
    assert not remembered.is_error, remembered.content
    memory = Memory.objects.get(pk=remembered.structured_content["memory"]["id"])
    assert memory.written_by == {"path": "mcp", "key_id": key.public_id, "key_name": "Claude desktop",
                                 "user_id": school.admin.pk, "user": school.admin.email, "agent": "Claude-tutor"}
    # Each call is its own exchange with a stateless server: the name still comes along.
    forgotten, = asyncio.run(_mcp_calls(server, secret, "Claude-tutor", [
        ("memory_forget", {"memory_id": str(memory.pk), "reason": "retold"})]))
    assert not forgotten.is_error, forgotten.content
    assert MemoryRevision.objects.get(memory=memory).author["agent"] == "Claude-tutor"
    by_agent = {m.written_by["agent"]: m.text for m in Memory.objects.filter(stack=school.stack)}
    assert set(by_agent) == {"Tutor-bot", "Reader-bot", "Claude-tutor"}
    page = client_for(school.admin).get(reverse("dashboard:student", args=[slug]),
                                        {"agent": "Claude-tutor", "forgotten": "include"}).content.decode()
    assert "Claude: retells stories" in page and "Tutor: dragons" not in page and "Coach: chapter" not in page
    assert f"written by Claude-tutor (key {LQ}Claude desktop{RQ}) via mcp" in page


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_bad_or_forged_mcp_client_name_names_nobody(server: str) -> None:  # noqa: F811
    school = school_cast()
    # Over 100 characters: refused like a bad X-Agent-Id, and nothing is stored.
    refused, = asyncio.run(_mcp_calls(server, school.agent_secret, "c" * 101,
                                      [("memory_remember", {"content": "Never stored"})]))
    assert refused.is_error and refused.structured_content["error"]["code"] == "invalid"
    assert "clientInfo.name" in refused.structured_content["error"]["fields"]
    assert not Memory.objects.filter(stack=school.stack).exists()
    # A session id the server did not sign carries no name.
    forged = signing.dumps("Impostor", salt="another salt", compress=True)
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "memory_remember", "arguments": {"content": "Plain call", "force_create": True}}}
    response = httpx.post(f"{server}/mcp", json=call, headers={
        "Accept": "application/json, text/event-stream", "Content-Type": "application/json",
        "Authorization": f"Bearer {school.agent_secret}", "Mcp-Session-Id": forged,
        "MCP-Protocol-Version": "2025-06-18"})
    assert response.status_code == 200, response.text
    stored = Memory.objects.get(stack=school.stack)
    assert stored.written_by["path"] == "mcp" and "agent" not in stored.written_by
