"""Privacy grants enforced (docs/privacy.md "Privacy grants").

A grants matrix: six memories whose `access_grants` differ, crossed with the requesters (the stack's own agent
key, the school key, a signed-in admin, the assigned teacher, another school) and every read path
(search, load, list, get, the archive export, the dashboard's JSON export, MEMORY.md, kernle and
native pull, a live dashboard event, a webhook payload): each requester sees exactly the memories
its grants admit, and the school policy "owner" takes the empty list away from everyone but the
stack's own credentials. The check is in SQL: the captured queries of search, load, list and pull
carry the overlap predicate (`&&`) for a non-self requester, and none for the stack's own key.

Then the paths that read memories to decide something: smart ingest and promotion treat a memory
hidden from the requester as absent (never touched, never named), and a live event or webhook about
hidden memories only is not sent to that receiver at all.
"""

from __future__ import annotations

import io
import json
import re
import zipfile
from dataclasses import dataclass
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from accounts.models import Organization
from accounts.principal import Principal
from accounts.selectors import principal_for_session
from dashboard import live
from dashboard import student as reads
from memories.models import Memory, MemoryRevision
from memories.privacy.grants import audience_for, audience_for_webhook, grants_q, grants_sql
from memories.services import memory_create, memory_forget
from tests.accounts.clients import csrf_session_client
from tests.actors import School
from tests.factories import make_key
from webhooks import dispatch
from webhooks.models import WebhookDelivery
from webhooks.services import endpoint_create

LABELS = ("empty", "role_teacher", "human_teacher", "org", "everyone", "someone_else")


def grants_of(school: School) -> dict[str, list[str]]:
    return {
        "empty": [],
        "role_teacher": ["role:teacher"],
        "human_teacher": [f"human:{school.teacher.public_id}"],
        "org": [f"org:{school.org.public_id}"],
        "everyone": ["*"],
        "someone_else": ["human:someone-else"],
    }


# Who sees what, under the default policy ("school": an empty list admits the school's staff and keys).
ADMITTED = {
    "own_key": set(LABELS),
    "school_key": {"empty", "org", "everyone"},
    "admin": {"empty", "org", "everyone"},
    "teacher": {"empty", "role_teacher", "human_teacher", "org", "everyone"},
}
REQUESTERS = tuple(ADMITTED)


@dataclass
class Cast:
    school: School
    memories: dict[str, Memory]  # label -> memory (beliefs: they are in load, MEMORY.md and pull alike)

    def label_of(self, memory_id: Any) -> str:
        ids = {str(memory.pk): label for label, memory in self.memories.items()}
        return ids[str(memory_id)]

    def labels(self, ids: Any) -> set[str]:
        known = {str(memory.pk) for memory in self.memories.values()}
        return {self.label_of(i) for i in ids if str(i) in known}

    def named_in(self, text: str) -> set[str]:
        """The labels whose memory's text (each ends "(<label>)") appears in `text` (a MEMORY.md)."""
        return {label for label in self.memories if f"({label.replace('_', ' ')})" in text}


def _cast(school: School, policy: str = "school", grants_by_label: dict[str, list[str]] | None = None) -> Cast:
    """One belief per label of `grants_by_label` (default: `grants_of(school)`) under the school policy `policy`."""
    Organization.objects.filter(pk=school.org.pk).update(empty_grants_policy=policy)
    school.org.refresh_from_db()
    school.stack.organization.refresh_from_db()
    memories = {
        label: memory_create(stack=school.stack, kind="belief", source="api", payload={
            "statement": f"Pizza slices explain fractions ({label.replace('_', ' ')})", "confidence": 0.9,
            "access_grants": grants, "subject_ids": ["human:student-ada"], "consent_grants": ["human:parent-ada"]})
        for label, grants in (grants_of(school) if grants_by_label is None else grants_by_label).items()
    }
    return Cast(school=school, memories=memories)


def client_of(school: School, requester: str) -> APIClient:
    if requester == "own_key":
        return school.agent
    if requester == "school_key":
        return school.admin_api
    return csrf_session_client(school.admin if requester == "admin" else school.teacher)


def principal_of_requester(school: School, requester: str) -> Principal:
    assert requester in ("admin", "teacher")
    principal = principal_for_session(school.admin if requester == "admin" else school.teacher)
    assert principal is not None
    return principal


def streamed(response: Any) -> bytes:
    return b"".join(response.streaming_content)


def expected(requester: str, policy: str) -> set[str]:
    seen = set(ADMITTED[requester])
    if policy == "owner" and requester != "own_key":
        seen.discard("empty")
    return seen


# --- every API read path ------------------------------------------------------------------------------

def api_reads(cast: Cast, client: APIClient) -> dict[str, set[str]]:
    """What one client sees through each API read path, as memory labels."""
    slug = cast.school.stack.slug
    base = f"/api/v1/stacks/{slug}/"
    seen: dict[str, set[str]] = {}

    response = client.post(base + "search", {"query": "pizza fractions", "limit": 50, "min_similarity": 0},
                           format="json")
    assert response.status_code == 200, response.content
    seen["search"] = cast.labels(hit["id"] for hit in response.json()["results"])

    response = client.get(base + "load?budget=50000")
    assert response.status_code == 200, response.content
    body = response.json()
    seen["load"] = cast.labels([item["id"] for item in body["memories"]] + [echo["id"] for echo in body["echoes"]])

    response = client.get(base + "memories?limit=100")
    assert response.status_code == 200, response.content
    seen["list"] = cast.labels(row["id"] for row in response.json()["results"])

    seen["get"] = set()
    for label, memory in cast.memories.items():
        status = client.get(base + f"memories/{memory.pk}").status_code
        assert status in (200, 404), (label, status)
        if status == 200:
            seen["get"].add(label)

    response = client.get(base + "export/memory.md")
    assert response.status_code == 200
    seen["memory.md"] = cast.named_in(response.content.decode())

    response = client.get(base + "export/archive")
    assert response.status_code == 200
    archive = zipfile.ZipFile(io.BytesIO(streamed(response)))
    lines = [json.loads(line) for line in archive.read("memories/belief.jsonl").splitlines()]
    seen["archive"] = cast.labels(line["id"] for line in lines)
    revisions = [json.loads(line) for line in archive.read("revisions.jsonl").splitlines()]
    assert cast.labels(r["memory_id"] for r in revisions) <= seen["archive"]
    memory_md = archive.read("MEMORY.md").decode()
    assert cast.named_in(memory_md) == seen["archive"]

    response = client.post("/sync/pull", {"stack_id": slug, "since": None}, format="json")
    assert response.status_code == 200, response.content
    record_ids = {op["record_id"] for op in response.json()["operations"]}
    seen["kernle pull"] = {label for label, memory in cast.memories.items() if memory.record_id in record_ids}

    response = client.get(base + "sync/pull?limit=500")
    assert response.status_code == 200, response.content
    seen["native pull"] = cast.labels(change["id"] for change in response.json()["changes"])
    return seen


@pytest.mark.parametrize("policy", ["school", "owner"])
@pytest.mark.parametrize("requester", REQUESTERS)
def test_every_api_read_path_shows_exactly_the_admitted_memories(school: School, requester: str,
                                                                 policy: str) -> None:
    cast = _cast(school, policy)
    seen = api_reads(cast, client_of(school, requester))
    want = expected(requester, policy)
    assert seen == dict.fromkeys(seen, want), (requester, policy)


def test_another_school_reaches_none_of_it(school: School, other_school: School) -> None:
    cast = _cast(school)
    memory = cast.memories["everyone"]
    base = f"/api/v1/stacks/{school.stack.slug}/"
    for client in (other_school.admin_api, other_school.agent, csrf_session_client(other_school.admin)):
        assert client.post(base + "search", {"query": "pizza"}, format="json").status_code == 404
        for path in ("load", "memories", f"memories/{memory.pk}", "export/memory.md", "export/archive",
                     "sync/pull"):
            assert client.get(base + path).status_code == 404, path
        pulled = client.post("/sync/pull", {"stack_id": school.stack.slug, "since": None}, format="json")
        assert pulled.status_code == 404 or pulled.json()["operations"] == []
    # A school-wide search by the other school's key never reaches this school's stacks.
    response = other_school.admin_api.post("/api/v1/search", {"query": "pizza fractions"}, format="json")
    assert response.status_code == 200 and response.json()["results"] == []


def test_school_wide_search_applies_the_keys_grants(school: School) -> None:
    cast = _cast(school)
    response = school.admin_api.post("/api/v1/search", {"query": "pizza fractions", "limit": 50,
                                                        "min_similarity": 0}, format="json")
    assert response.status_code == 200
    assert cast.labels(hit["id"] for hit in response.json()["results"]) == ADMITTED["school_key"]


def test_a_grant_naming_the_school_key_admits_that_key_only(school: School) -> None:
    other_key, other_secret = make_key(school.org, user=school.admin, name="second school key")
    memory = memory_create(stack=school.stack, kind="note", source="api", payload={
        "content": "for one key", "access_grants": [f"key:{school.admin_key.public_id}"]})
    url = f"/api/v1/stacks/{school.stack.slug}/memories/{memory.pk}"
    assert school.admin_api.get(url).status_code == 200
    from tests.factories import bearer_client
    assert bearer_client(other_secret).get(url).status_code == 404
    assert other_key.public_id != school.admin_key.public_id


# --- the dashboard ------------------------------------------------------------------------------------

@pytest.mark.parametrize("policy", ["school", "owner"])
@pytest.mark.parametrize("requester", ["admin", "teacher"])
def test_dashboard_student_page_search_detail_and_json_export(school: School, requester: str, policy: str) -> None:
    cast = _cast(school, policy)
    want = expected(requester, policy)
    client = csrf_session_client(school.admin if requester == "admin" else school.teacher)
    page = client.get(f"/dashboard/students/{school.stack.slug}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert {label for label, m in cast.memories.items() if f"memory-{m.pk}" in html} == want
    found = client.get(f"/dashboard/students/{school.stack.slug}/", {"q": "pizza fractions"})
    assert {label for label, m in cast.memories.items() if str(m.pk) in found.content.decode()} == want
    for label, memory in cast.memories.items():
        status = client.get(f"/dashboard/students/{school.stack.slug}/memories/{memory.pk}/").status_code
        assert status == (200 if label in want else 404), label
    exported = client.get(f"/dashboard/students/{school.stack.slug}/export.json")
    body = json.loads(streamed(exported))
    assert cast.labels(row["id"] for row in body["memories"]) == want
    markdown = client.get(f"/dashboard/students/{school.stack.slug}/MEMORY.md").content.decode()
    assert {label for label in LABELS if f"({label.replace('_', ' ')})" in markdown} == want


def test_the_memory_detail_shows_subjects_grants_and_consent(school: School) -> None:
    cast = _cast(school)
    client = csrf_session_client(school.teacher)
    memory = cast.memories["human_teacher"]
    html = client.get(f"/dashboard/students/{school.stack.slug}/memories/{memory.pk}/").content.decode()
    assert "Privacy" in html
    for entity in ("human:student-ada", f"human:{school.teacher.public_id}", "human:parent-ada"):
        assert entity in html
    html = client.get(f"/dashboard/students/{school.stack.slug}/memories/{cast.memories['empty'].pk}/").content
    assert b"the school's staff and keys (school policy)" in html


@pytest.mark.parametrize("requester", ["admin", "teacher"])
def test_a_live_event_names_only_admitted_memories(school: School, requester: str) -> None:
    """What the student page's socket is sent for a change naming all six memories (the consumer
    sends exactly live.student_message; the socket itself is tested below)."""
    cast = _cast(school)
    principal = principal_of_requester(school, requester)
    change = live.Change(event_ids=(1,), seq=1, topics=frozenset({"memory"}),
                         memory_ids=tuple(str(m.pk) for m in cast.memories.values()))
    message = live.student_message(principal, school.stack, reads.MemoryFilters(), change)
    assert message is not None
    assert cast.labels(row["id"] for row in message["rows"]) == ADMITTED[requester]
    assert message["removed"] == []
    text = json.dumps(message)
    for label, memory in cast.memories.items():
        if label not in ADMITTED[requester]:
            assert str(memory.pk) not in text and f"({label.replace('_', ' ')})" not in text
    assert message["total"] == len(ADMITTED[requester])


@override_settings(WEBHOOKS_ALLOW_LOOPBACK_HTTP=True)  # the endpoints below are never called
def test_a_webhook_payload_lists_only_memories_its_grants_admit(school: School) -> None:
    plain, _ = endpoint_create(organization=school.org, url="http://127.0.0.1:9/a", event_types=["*"],
                               include_text=True)
    named, _ = endpoint_create(organization=school.org, url="http://127.0.0.1:9/b", event_types=["*"],
                               include_text=True)
    cast = _cast(school)
    Memory.objects.filter(pk=cast.memories["someone_else"].pk).update(access_grants=[f"webhook:{named.public_id}"])
    ids = [str(m.pk) for m in cast.memories.values()]
    for endpoint, want in ((plain, {"empty", "org", "everyone"}),
                           (named, {"empty", "org", "everyone", "someone_else"})):
        delivery = WebhookDelivery(endpoint=endpoint, stack=school.stack, event_id=1, seq=1,
                                   event_type="memory.created", data={"memory_ids": ids})
        body = dispatch.payload(delivery, endpoint)
        assert body is not None
        assert cast.labels(body["data"]["memory_ids"]) == want
        assert cast.labels(m["id"] for m in body["memories"]) == want
        text = json.dumps(body)
        for label, memory in cast.memories.items():
            if label not in want:
                assert str(memory.pk) not in text


# --- the policy and the predicate ---------------------------------------------------------------------

def test_the_audiences(school: School) -> None:
    admin = audience_for(principal_of_requester(school, "admin"))
    teacher = audience_for(principal_of_requester(school, "teacher"))
    org = f"org:{school.org.public_id}"
    assert admin is not None and set(admin.entity_ids) == {f"human:{school.admin.public_id}", "role:admin", org, "*"}
    assert teacher is not None and "role:teacher" in teacher.entity_ids
    hook = audience_for_webhook(endpoint_public_id="whe_x", organization=school.org)
    assert set(hook.entity_ids) == {"webhook:whe_x", "role:webhook", org, "*"}
    assert grants_q(None) is None and grants_sql(None) == ("TRUE", {})


OVERLAP = re.compile(r'access_grants"?\s*&&')


def _captured(client: APIClient, school: School) -> list[str]:
    base = f"/api/v1/stacks/{school.stack.slug}/"
    statements: list[str] = []
    for call in (lambda: client.post(base + "search", {"query": "pizza"}, format="json"),
                 lambda: client.get(base + "load"),
                 lambda: client.get(base + "memories"),
                 lambda: client.post("/sync/pull", {"stack_id": school.stack.slug, "since": None}, format="json"),
                 lambda: client.get(base + "sync/pull")):
        with CaptureQueriesContext(connection) as queries:
            assert call().status_code == 200
        statements.append("\n".join(q["sql"] for q in queries.captured_queries if "memories_memory" in q["sql"]))
    return statements


def test_the_overlap_predicate_is_in_the_sql_of_every_read_for_non_self_only(school: School) -> None:
    _cast(school)
    for name, statements in (("school key", _captured(school.admin_api, school)),
                             ("teacher", _captured(csrf_session_client(school.teacher), school))):
        for path, sql in zip(("search", "load", "list", "kernle pull", "native pull"), statements, strict=True):
            assert OVERLAP.search(sql), (name, path)
    for path, sql in zip(("search", "load", "list", "kernle pull", "native pull"), _captured(school.agent, school),
                         strict=True):
        assert sql and not OVERLAP.search(sql), path


def test_native_pull_cursor_moves_past_hidden_changes(school: School) -> None:
    cast = _cast(school, "owner")
    hidden_last = memory_create(stack=school.stack, kind="note", source="api",
                                payload={"content": "private", "access_grants": ["human:someone-else"]})
    url = f"/api/v1/stacks/{school.stack.slug}/sync/pull"
    first = school.admin_api.get(url + "?limit=1").json()
    assert first["has_more"] is True and cast.labels(c["id"] for c in first["changes"]) <= {"org", "everyone"}
    rest = school.admin_api.get(url, {"cursor": first["next_cursor"]}).json()
    assert rest["has_more"] is False
    seen = [c["id"] for c in first["changes"] + rest["changes"]]
    assert cast.labels(seen) == {"org", "everyone"} and str(hidden_last.pk) not in seen
    # The cursor went past the hidden changes at the end: the next pull walks nothing again.
    again = school.admin_api.get(url, {"cursor": rest["next_cursor"]}).json()
    assert again["changes"] == [] and again["next_cursor"] == rest["next_cursor"]
    own = school.agent.get(url, {"cursor": rest["next_cursor"]}).json()
    assert own["changes"] == []


# --- a real socket ---------------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
@pytest.mark.anyio
async def test_a_teachers_socket_receives_only_admitted_memories(school: School) -> None:
    from asgiref.sync import sync_to_async

    from memories.services import memory_batch_create
    from tests.dashboard.test_live import WAIT, open_socket, signed_in

    _, headers = await signed_in(school.teacher)
    communicator, connected = await open_socket(f"/ws/stacks/{school.stack.slug}/", headers)
    assert connected
    grants = grants_of(school)
    created = await sync_to_async(memory_batch_create)(stack=school.stack, source="api", items=[
        {"kind": "note", "content": f"Pizza fractions ({label})", "access_grants": grants[label]} for label in LABELS])
    by_id = {str(memory.pk): label for memory, label in zip(created, LABELS, strict=True)}
    message = await communicator.receive_json_from(timeout=WAIT)
    assert message["type"] == "change"
    assert {by_id[row["id"]] for row in message["rows"]} == ADMITTED["teacher"]
    text = json.dumps(message)
    for memory_id, label in by_id.items():
        if label not in ADMITTED["teacher"]:
            assert memory_id not in text and f"({label})" not in text
    await communicator.disconnect()


# --- smart ingest: a hidden memory is absent from the gate ----------------------------------------

INGEST_TEXT = "Ada learns fractions best when the teacher uses pizza slices and paper strips in class"
HIDDEN = ["human:someone-else"]


def _ingest(client: APIClient, school: School, content: str, **extra: Any) -> Any:
    return client.post(school.stack_url("ingest"), {"kind": "note", "content": content, **extra}, format="json")


def _stored_hidden_note(school: School, content: str = INGEST_TEXT) -> Memory:
    response = _ingest(school.agent, school, content, access_grants=HIDDEN)
    assert response.status_code == 201 and response.json()["decision"] == "create", response.content
    return Memory.objects.get(pk=response.json()["memory"]["id"])


@pytest.mark.parametrize("requester", ["school_key", "teacher"])
def test_smart_ingest_by_a_non_self_requester_never_touches_or_names_a_hidden_memory(
        school: School, requester: str) -> None:
    hidden = _stored_hidden_note(school)
    # The stack's own key sees it: the same text (same grants) reinforces it.
    own = _ingest(school.agent, school, INGEST_TEXT, access_grants=HIDDEN).json()
    assert own["decision"] == "reinforce" and own["target_id"] == str(hidden.pk)

    client = client_of(school, requester)
    for extra in ({}, {"thresholds": {"near_identical": 0.99, "update": 0.5}}):  # the reinforce and merge bands
        response = _ingest(client, school, INGEST_TEXT + (" on Mondays" if extra else ""), **extra)
        assert response.status_code == 201, response.content
        body = response.json()
        assert body["decision"] == "create" and body["target_id"] is None and body["similarity"] is None
        assert body["considered"] == [] and str(hidden.pk) not in json.dumps(body)
        memory_forget(memory=Memory.objects.get(pk=body["memory"]["id"]), reason="test")  # out of the next gate
    after = Memory.objects.get(pk=hidden.pk)
    assert (after.text, after.version) == (INGEST_TEXT, 1)  # never merged into
    assert not hidden.revisions.filter(action__in=("merge", "linked", "contradicted")).exists()
    # A memory the requester does see is still gated as before: the same text again reinforces it.
    first = _ingest(client, school, INGEST_TEXT).json()
    again = _ingest(client, school, INGEST_TEXT).json()
    assert again["decision"] == "reinforce" and again["target_id"] == first["memory"]["id"]
    assert [c["id"] for c in again["considered"]] == [first["memory"]["id"]]


def test_smart_ingest_cannot_supersede_a_hidden_memory(school: School) -> None:
    hidden = _stored_hidden_note(school)
    response = _ingest(school.admin_api, school, "Ada now prefers number lines", supersedes=str(hidden.pk))
    assert response.status_code == 404 and response.json()["error"]["code"] == "memory_not_found"
    assert Memory.objects.get(pk=hidden.pk).forgotten_at is None
    assert not Memory.objects.filter(stack=school.stack, text="Ada now prefers number lines").exists()
    own = _ingest(school.agent, school, "Ada now prefers number lines", supersedes=str(hidden.pk))
    assert own.status_code == 201 and own.json()["decision"] == "supersede"


def test_smart_ingest_neighbour_query_carries_the_grants_predicate_for_non_self_only(school: School) -> None:
    _stored_hidden_note(school)
    for client, wanted in ((school.admin_api, True), (school.agent, False)):
        with CaptureQueriesContext(connection) as queries:
            assert _ingest(client, school, "Pizza fractions again", force_create=False).status_code in (200, 201)
        neighbour = [q["sql"] for q in queries.captured_queries if "<=>" in q["sql"]]
        assert neighbour and bool(OVERLAP.search(neighbour[0])) is wanted


def test_smart_ingest_never_folds_text_into_a_memory_read_by_another_audience(school: School) -> None:
    """Also for the stack's own key: text with narrower grants is not merged into, or noted on, a wider memory."""
    wide = _ingest(school.agent, school, INGEST_TEXT, access_grants=["*"]).json()["memory"]["id"]
    body = _ingest(school.agent, school, INGEST_TEXT, access_grants=HIDDEN).json()
    assert body["decision"] == "create" and body["target_id"] == wide and "access grants" in body["reason"]
    assert Memory.objects.get(pk=wide).version == 1
    note = MemoryRevision.objects.get(memory_id=wide, action="linked")
    assert "incoming_text" not in note.snapshot and note.snapshot["linked_memory"] == body["memory"]["id"]


# --- promotion: hidden episodes are not read --------------------------------------------------------

def _episode(school: School, record_id: str, lessons: list[str], grants: list[str] | None = None) -> Memory:
    return memory_create(stack=school.stack, kind="episode", source="test", record_id=record_id,
                         payload={"objective": f"session {record_id}", "outcome": "ok", "lessons": lessons,
                                  "access_grants": grants or []})


@pytest.mark.parametrize("requester", ["school_key", "teacher"])
def test_promotion_reads_only_the_episodes_the_requester_sees(school: School, requester: str) -> None:
    for record_id in ("open-1", "open-2", "open-3"):
        _episode(school, record_id, ["Draw the pie", "Check the homework"])
    for record_id in ("secret-1", "secret-2"):
        _episode(school, record_id, ["Ada cries when rushed"], grants=HIDDEN)
    # A belief the requester cannot see already holds one of the visible lessons.
    memory_create(stack=school.stack, kind="belief", source="api", payload={
        "statement": "Check the homework", "confidence": 0.9, "access_grants": HIDDEN})

    response = client_of(school, requester).post(school.stack_url("promote"), {"auto": False}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["episodes_scanned"] == 3
    # The hidden belief is treated as absent: no `skipped_existing` tells that a hidden memory holds that text.
    assert {s["lesson"] for s in body["suggestions"]} == {"Draw the pie", "Check the homework"}
    assert body["skipped_existing"] == 0
    text = json.dumps(body)
    assert "cries" not in text and "secret-" not in text

    own = school.agent.post(school.stack_url("promote"), {"auto": False}, format="json").json()
    assert own["episodes_scanned"] == 5 and own["skipped_existing"] == 1
    assert {s["lesson"] for s in own["suggestions"]} == {"Draw the pie", "Ada cries when rushed"}


def test_promotion_by_a_school_key_creates_beliefs_from_visible_episodes_only(school: School) -> None:
    from memories.lifecycle.promotion import promote_lessons

    for record_id in ("open-1", "open-2", "open-3"):
        _episode(school, record_id, ["Draw the pie"])
    for record_id in ("secret-1", "secret-2"):
        _episode(school, record_id, ["Ada cries when rushed"], grants=HIDDEN)
    response = school.admin_api.post(school.stack_url("promote"), {"auto": True}, format="json")
    assert response.status_code == 200 and response.json()["created"] == 1
    assert list(Memory.objects.filter(stack=school.stack, kind="belief").values_list("text", flat=True)) == [
        "Draw the pie"]
    # The scheduled job runs as the system: every episode counts.
    result = promote_lessons(stack=school.stack, auto=True)
    assert result.episodes_scanned == 5 and [s.lesson for s in result.suggestions] == ["Ada cries when rushed"]


# --- live events and webhooks: a change of hidden memories only is not announced --------------------

_EVENT_IDS = iter(range(10_000, 20_000))


def _change(*memories: Memory, topics: frozenset[str] = frozenset({"memory"})) -> live.Change:
    event_id = next(_EVENT_IDS)  # one render is shared per event id (live._shared): each change its own
    return live.Change(event_ids=(event_id,), seq=event_id, topics=topics,
                       memory_ids=tuple(str(m.pk) for m in memories))


@pytest.mark.parametrize("requester", ["admin", "teacher"])
def test_a_live_change_of_hidden_memories_only_sends_nothing(school: School, requester: str) -> None:
    cast = _cast(school)
    principal = principal_of_requester(school, requester)
    hidden = cast.memories["someone_else"]
    assert live.student_message(principal, school.stack, reads.MemoryFilters(), _change(hidden)) is None
    # Another change that also touched the checkpoint is still sent, without the hidden memory.
    message = live.student_message(principal, school.stack, reads.MemoryFilters(),
                                   _change(hidden, topics=frozenset({"memory", "checkpoint"})))
    assert message is not None and message["rows"] == [] and message["unresolved"] == 0
    assert str(hidden.pk) not in json.dumps(message)
    # One visible memory in the change: it is sent, naming only that one.
    visible = live.student_message(principal, school.stack, reads.MemoryFilters(),
                                   _change(hidden, cast.memories["everyone"]))
    assert visible is not None and cast.labels(row["id"] for row in visible["rows"]) == {"everyone"}


@pytest.mark.parametrize("requester", ["admin", "teacher"])
def test_a_live_change_too_big_to_resolve_counts_only_admitted_memories(
        school: School, requester: str, monkeypatch: pytest.MonkeyPatch) -> None:
    cast = _cast(school)
    monkeypatch.setattr(live, "RESOLVE_IDS_MAX", 2)
    message = live.student_message(principal_of_requester(school, requester), school.stack,
                                   reads.MemoryFilters(), _change(*cast.memories.values()))
    assert message is not None and message["unresolved"] == len(ADMITTED[requester])


@pytest.mark.django_db(transaction=True)
@pytest.mark.anyio
async def test_a_teachers_socket_is_not_told_of_a_hidden_change(school: School,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from asgiref.sync import sync_to_async

    from memories.writes import hooks
    from tests.dashboard.test_live import WAIT, open_socket, signed_in

    # No embedding task: the suite's Celery worker would otherwise send an "embedded" change of the
    # shown memory while the test listens for silence.
    monkeypatch.setattr(hooks, "_send_embedding", lambda ids, message_ids, **_: None)

    _, headers = await signed_in(school.teacher)
    communicator, connected = await open_socket(f"/ws/stacks/{school.stack.slug}/", headers)
    assert connected
    hidden = await sync_to_async(memory_create)(stack=school.stack, kind="note", source="api", payload={
        "content": "Pizza fractions (hidden)", "access_grants": HIDDEN})
    shown = await sync_to_async(memory_create)(stack=school.stack, kind="note", source="api", payload={
        "content": "Pizza fractions (shown)", "access_grants": ["role:teacher"]})
    # The first message the socket gets is the visible change's: the hidden one sent nothing at all.
    message = await communicator.receive_json_from(timeout=WAIT)
    assert [row["id"] for row in message["rows"]] == [str(shown.pk)]
    assert str(hidden.pk) not in json.dumps(message)
    assert await communicator.receive_nothing(timeout=0.3)
    await communicator.disconnect()


@override_settings(WEBHOOKS_ALLOW_LOOPBACK_HTTP=True)  # the endpoints below are never called
def test_a_webhook_is_not_told_of_a_change_of_hidden_memories(
        school: School, django_capture_on_commit_callbacks: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from memories.changes import publish

    queued: list[Any] = []
    monkeypatch.setattr(dispatch, "enqueue", lambda *args, **kwargs: queued.append(args))
    plain, _ = endpoint_create(organization=school.org, url="http://127.0.0.1:9/a", event_types=["*"])
    named, _ = endpoint_create(organization=school.org, url="http://127.0.0.1:9/b", event_types=["*"])
    with django_capture_on_commit_callbacks(execute=True):
        hidden = memory_create(stack=school.stack, kind="note", source="api", payload={
            "content": "for one endpoint", "access_grants": [f"webhook:{named.public_id}"]})
    assert publish.wait_published()
    # The endpoint the grants hide it from records no delivery; the one they name does.
    assert not WebhookDelivery.objects.filter(endpoint=plain).exists()
    assert list(WebhookDelivery.objects.filter(endpoint=named).values_list("data__memory_ids", flat=True)) == [
        [str(hidden.pk)]]
    with django_capture_on_commit_callbacks(execute=True):
        memory_create(stack=school.stack, kind="note", source="api", payload={"content": "for everyone"})
    assert publish.wait_published()
    assert WebhookDelivery.objects.filter(endpoint=plain).count() == 1

    # The grants change before the pending delivery is sent: it is dropped, never sent, and the queue moves on.
    Memory.objects.filter(pk=hidden.pk).update(access_grants=HIDDEN)
    head = WebhookDelivery.objects.filter(endpoint=named).order_by("seq").first()
    assert head is not None and dispatch.payload(head, named) is None
    WebhookDelivery.objects.filter(endpoint=named).exclude(pk=head.pk).delete()  # only the hidden one is pending
    assert dispatch.queue_run(named.pk, school.stack.pk) == 0
    assert not WebhookDelivery.objects.filter(endpoint=named).exists()
    named.refresh_from_db()
    assert named.last_attempt_at is None  # no request was made
