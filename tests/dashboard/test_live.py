"""The live sockets of the dashboard (docs/architecture.md §10, "Live pages").

Against the real ASGI application (memoryhub.asgi: the websocket guard, the Origin check, the
session middleware) and the real Redis channel layer, with committed data (transaction=True): who
may open `ws/stacks/<slug>/` and `ws/school/`, that an open socket is closed when its session
logs out or its access is removed, that a change arrives rendered with the page's row partial, that
another stack's or school's change never arrives, and that `?since=` resumes with exactly the
changes after it.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings as django_settings
from django.contrib.sessions.models import Session
from django.test import AsyncClient, Client

from accounts.models import Membership, User
from dashboard import live
from memories.changes import publish as change_events
from memories.changes import watchers
from memories.models import ChangeEvent, Memory
from memories.search.embedding_jobs import memories_embed
from memories.services import CheckpointInput, checkpoint_save, memory_create, memory_forget
from memoryhub.asgi import application
from stacks.models import Stack
from stacks.services import membership_remove, teacher_unassign
from tests.actors import School
from tests.factories import make_stack, make_user, other_connection

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.anyio]

ORIGIN = (b"origin", b"http://localhost")
WAIT = 10  # seconds: generous on a machine shared by several test sessions


# --- helpers -----------------------------------------------------------------------------------------

def _session_of(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _headers(client: Client, origin: tuple[bytes, bytes] = ORIGIN) -> list[tuple[bytes, bytes]]:
    cookie = f"{django_settings.SESSION_COOKIE_NAME}={client.cookies[django_settings.SESSION_COOKIE_NAME].value}"
    return [origin, (b"cookie", cookie.encode())]


async def signed_in(user: User) -> tuple[Client, list[tuple[bytes, bytes]]]:
    client = await sync_to_async(_session_of)(user)
    return client, _headers(client)


async def open_socket(path: str, headers: list[tuple[bytes, bytes]]) -> tuple[WebsocketCommunicator, bool]:
    communicator = WebsocketCommunicator(application, path, headers=headers)
    connected, _ = await communicator.connect(timeout=WAIT)
    return communicator, connected


async def closed_with(communicator: WebsocketCommunicator) -> int:
    """The close code the server sends next (skipping nothing: any other message fails the test)."""
    message = await communicator.receive_output(timeout=WAIT)
    assert message["type"] == "websocket.close", message
    return int(message["code"])


def note(stack: Stack, content: str) -> Memory:
    return memory_create(stack=stack, kind="note", payload={"content": content}, source="api")


async def write(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return await sync_to_async(func)(*args, **kwargs)


# --- who may connect -----------------------------------------------------------------------------------

async def test_admin_and_assigned_teacher_connect(school: School) -> None:
    for user in (school.admin, school.teacher):
        _, headers = await signed_in(user)
        communicator, connected = await open_socket(f"/ws/stacks/{school.stack.slug}/", headers)
        assert connected, user
        await communicator.disconnect()
        communicator, connected = await open_socket("/ws/school/", headers)
        assert connected, user
        await communicator.disconnect()


async def test_no_session_is_refused(school: School) -> None:
    forged = (b"cookie", f"{django_settings.SESSION_COOKIE_NAME}=forged".encode())
    for headers in ([ORIGIN], [ORIGIN, forged]):
        for path in (f"/ws/stacks/{school.stack.slug}/", "/ws/school/"):
            _, connected = await open_socket(path, headers)
            assert not connected, (path, headers)


async def test_another_schools_stack_is_refused(school: School, other_school: School) -> None:
    _, headers = await signed_in(other_school.admin)
    _, connected = await open_socket(f"/ws/stacks/{school.stack.slug}/", headers)
    assert not connected
    _, connected = await open_socket("/ws/stacks/no-such-stack/", headers)
    assert not connected


async def test_unassigned_teacher_and_billing_user_are_refused(school: School) -> None:
    _, headers = await signed_in(school.teacher)
    _, connected = await open_socket(f"/ws/stacks/{school.other_stack.slug}/", headers)
    assert not connected
    billing = await write(make_user, school.org, role=Membership.Role.BILLING)
    _, headers = await signed_in(billing)
    for path in (f"/ws/stacks/{school.stack.slug}/", "/ws/school/"):
        _, connected = await open_socket(path, headers)
        assert not connected, path


async def test_foreign_origin_is_refused(school: School) -> None:
    client, _ = await signed_in(school.admin)
    for origin in (b"http://evil.example", b"null"):
        headers = _headers(client, origin=(b"origin", origin))
        for path in (f"/ws/stacks/{school.stack.slug}/", "/ws/school/"):
            _, connected = await open_socket(path, headers)
            assert not connected, (origin, path)


async def test_invalid_page_filters_are_refused(school: School) -> None:
    _, headers = await signed_in(school.admin)
    _, connected = await open_socket(f"/ws/stacks/{school.stack.slug}/?kind=nonsense", headers)
    assert not connected


# --- closed when the session or the access ends ----------------------------------------------------------

async def test_membership_removed_closes_the_socket(school: School) -> None:
    _, headers = await signed_in(school.teacher)
    stack_socket, _ = await open_socket(f"/ws/stacks/{school.stack.slug}/", headers)
    school_socket, _ = await open_socket("/ws/school/", headers)
    await write(membership_remove, organization=school.org, user_public_id=school.teacher.public_id)
    assert await closed_with(stack_socket) == live.CLOSE_NO_ACCESS
    assert await closed_with(school_socket) == live.CLOSE_NO_ACCESS


async def test_teacher_unassigned_closes_the_stack_socket_only(school: School) -> None:
    _, headers = await signed_in(school.teacher)
    stack_socket, _ = await open_socket(f"/ws/stacks/{school.stack.slug}/", headers)
    school_socket, _ = await open_socket("/ws/school/", headers)
    await write(teacher_unassign, stack=school.stack, teacher=school.teacher)
    assert await closed_with(stack_socket) == live.CLOSE_NO_ACCESS
    assert await school_socket.receive_nothing(timeout=1)  # still a teacher of the school
    await school_socket.disconnect()


async def test_logout_closes_that_sessions_sockets_only(school: School) -> None:
    client, headers = await signed_in(school.admin)
    _, other_device = await signed_in(school.admin)
    mine, _ = await open_socket(f"/ws/stacks/{school.stack.slug}/", headers)
    theirs, _ = await open_socket(f"/ws/stacks/{school.stack.slug}/", other_device)
    response = await sync_to_async(client.post)("/logout/")
    assert response.status_code == 302
    assert await closed_with(mine) == live.CLOSE_SIGNED_OUT
    assert await theirs.receive_nothing(timeout=1)
    await theirs.disconnect()


async def test_a_session_ended_without_a_signal_is_closed_by_the_periodic_recheck(
        school: School, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live, "RECHECK_SECONDS", 0.3)
    _, headers = await signed_in(school.admin)
    communicator, _ = await open_socket(f"/ws/stacks/{school.stack.slug}/", headers)
    await write(lambda: Session.objects.all().delete())  # straight from the store: no logout signal
    assert await closed_with(communicator) == live.CLOSE_SIGNED_OUT


# --- what arrives -------------------------------------------------------------------------------------------

async def next_change(communicator: WebsocketCommunicator, memory_id: str | None = None) -> dict[str, Any]:
    """The next `change` message (naming `memory_id`, when given)."""
    while True:
        message = await communicator.receive_json_from(timeout=WAIT)
        if message["type"] != "change":
            continue
        if memory_id is None or memory_id in {r["id"] for r in message["rows"]} | set(message["removed"]):
            return message


async def test_a_change_arrives_as_the_pages_own_rendered_row(school: School) -> None:
    _, headers = await signed_in(school.teacher)
    communicator, _ = await open_socket(f"/ws/stacks/{school.stack.slug}/", headers)
    memory = await write(note, school.stack, "Fractions <b>clicked</b> today")
    message = await next_change(communicator, str(memory.pk))
    [row] = message["rows"]
    assert row["matches"] is True
    assert f'id="memory-{memory.pk}"' in row["html"]
    assert "Fractions &lt;b&gt;clicked&lt;/b&gt; today" in row["html"]  # escaped by the template
    assert message["counts"]["note"] == 1 and message["total"] == 1
    assert message["figures"]["memories"] == "1"

    await write(memory_forget, memory=memory, reason="wrong student")
    forgotten = await next_change(communicator, str(memory.pk))
    assert forgotten["rows"][0]["matches"] is False  # the page hides forgotten memories
    assert forgotten["total"] == 0
    await communicator.disconnect()


async def _embedded_event(memory: Memory) -> ChangeEvent:
    """The "embedded" change event of `memory`, once committed."""
    await write(memories_embed, ids=[memory.pk])  # unless the suite's worker holds it or did it already
    for _ in range(WAIT * 10):  # whoever stored the vector, its event is committed by now or soon
        stored = await write(lambda: ChangeEvent.objects.filter(
            stack_id=memory.stack_id, action="embedded", memory_ids__contains=[str(memory.pk)]).first())
        if stored is not None:
            return stored
        await asyncio.sleep(0.1)
    raise AssertionError("the memory was never embedded")


async def test_an_embedding_is_sent_as_its_seq_only(school: School, monkeypatch: pytest.MonkeyPatch) -> None:
    """A vector stored changes nothing the page shows: the page learns the event's seq (to resume past
    it) and nothing is rendered for it; the memory's own event rendered its row."""
    monkeypatch.setattr(live, "UNSEEN_DELAY_SECONDS", 0.2)
    _, headers = await signed_in(school.admin)
    communicator, _ = await open_socket(f"/ws/stacks/{school.stack.slug}/", headers)
    memory = await write(note, school.stack, "Long division, step 2")
    created = await next_change(communicator, str(memory.pk))
    stored = await _embedded_event(memory)
    while (message := await next_change(communicator))["events"] != [stored.pk]:
        pass
    assert message["seq"] == stored.seq > created["seq"]
    assert message["rows"] == [] and message["removed"] == []
    assert "counts" not in message and "figures" not in message
    await communicator.disconnect()


async def test_an_embedding_goes_out_with_the_next_change_the_page_sees(
        school: School, monkeypatch: pytest.MonkeyPatch) -> None:
    """Held back rather than rendered on its own: the next change's message covers it (its event
    and seq), so the page's resume point still passes it, and no message was sent for it alone."""
    monkeypatch.setattr(live, "UNSEEN_DELAY_SECONDS", 60.0)
    _, headers = await signed_in(school.admin)
    communicator, _ = await open_socket(f"/ws/stacks/{school.stack.slug}/", headers)
    memory = await write(note, school.stack, "Long division, step 2")
    await next_change(communicator, str(memory.pk))
    stored = await _embedded_event(memory)
    await asyncio.sleep(0.5)  # its publication reaches the socket
    after = await write(note, school.stack, "Long division, step 3")
    sent = [await next_change(communicator)]
    while str(after.pk) not in {row["id"] for row in sent[-1]["rows"]}:
        sent.append(await next_change(communicator))
    *sent, message = sent
    assert stored.pk in message["events"] and message["seq"] > stored.seq
    assert not [m for m in sent if stored.pk in m["events"]]
    await communicator.disconnect()


async def test_a_filtered_page_learns_whether_a_change_matches_its_filters(school: School) -> None:
    _, headers = await signed_in(school.admin)
    communicator, _ = await open_socket(f"/ws/stacks/{school.stack.slug}/?kind=belief&forgotten=include", headers)
    memory = await write(note, school.stack, "a note, not a belief")
    message = await next_change(communicator, str(memory.pk))
    assert message["rows"][0]["matches"] is False
    assert message["counts"]["note"] == 1  # the tabs count every kind under the other filters
    belief = await write(memory_create, stack=school.stack, kind="belief",
                         payload={"statement": "Pictures help Ada most"}, source="api")
    message = await next_change(communicator, str(belief.pk))
    assert message["rows"][0]["matches"] is True
    assert message["counts"]["note"] == 1 and message["counts"]["belief"] == 1 and message["total"] == 2
    await communicator.disconnect()


async def test_a_checkpoint_arrives_rendered(school: School) -> None:
    _, headers = await signed_in(school.admin)
    communicator, _ = await open_socket(f"/ws/stacks/{school.stack.slug}/", headers)
    saved = CheckpointInput(task="Long division", progress="step 2")
    await write(checkpoint_save, stack=school.stack, checkpoint=saved)
    while "checkpoint" not in (message := await next_change(communicator)):
        pass
    assert 'id="live-checkpoint"' in message["checkpoint"] and "Long division" in message["checkpoint"]
    await communicator.disconnect()


async def test_another_stacks_or_schools_change_never_arrives(school: School, other_school: School) -> None:
    _, headers = await signed_in(school.teacher)
    stack_socket, _ = await open_socket(f"/ws/stacks/{school.stack.slug}/", headers)
    school_socket, _ = await open_socket("/ws/school/", headers)
    await write(note, school.other_stack, "bob's memory")  # same school, not the teacher's
    await write(note, other_school.stack, "carol's memory")
    assert await stack_socket.receive_nothing(timeout=1.5)
    assert await school_socket.receive_nothing(timeout=1.5)
    await stack_socket.disconnect()
    await school_socket.disconnect()


async def test_an_open_page_counts_as_a_watcher_of_its_group_until_it_closes(school: School) -> None:
    """The publisher sends a change only to groups someone watches (memories.changes.watchers): each
    open page counts itself, and stops counting when it closes."""
    groups = [watchers.stack_group(school.stack.pk), watchers.school_group(school.org.pk)]
    _, headers = await signed_in(school.teacher)
    stack_socket, _ = await open_socket(f"/ws/stacks/{school.stack.slug}/", headers)
    assert await write(watchers.watched, groups) == {groups[0]}
    school_socket, _ = await open_socket("/ws/school/", headers)
    second_page, _ = await open_socket(f"/ws/stacks/{school.stack.slug}/", headers)
    assert await write(watchers.watched, groups) == set(groups)
    await stack_socket.disconnect()
    await school_socket.disconnect()
    assert await write(watchers.watched, groups) == {groups[0]}  # the second page still watches
    memory = await write(note, school.stack, "seen by the page still open")
    assert await next_change(second_page, str(memory.pk))
    await second_page.disconnect()
    assert await write(watchers.watched, groups) == set()


async def test_overview_counts_arrive_for_visible_stacks(school: School) -> None:
    _, headers = await signed_in(school.admin)
    communicator, _ = await open_socket("/ws/school/", headers)
    await write(note, school.other_stack, "written by bob's agent")
    message = await communicator.receive_json_from(timeout=WAIT)
    assert message["type"] == "overview"
    assert message["summary"] == {"memories": "1", "written_today": "1"}
    [row] = message["stacks"]
    assert row["slug"] == school.other_stack.slug and row["memories"] == "1" and row["last_write"]["iso"]
    await communicator.disconnect()


async def test_the_client_sends_nothing(school: School) -> None:
    _, headers = await signed_in(school.admin)
    communicator, _ = await open_socket(f"/ws/stacks/{school.stack.slug}/", headers)
    await communicator.send_to(text_data="hello")
    assert (await communicator.receive_json_from(timeout=WAIT))["error"]["code"] == "unknown_action"
    await communicator.disconnect()


async def test_a_stack_of_the_same_slug_in_another_school_is_not_confused(school: School) -> None:
    """Groups are by stack id, not slug: another school's "alice" never reaches this page."""
    from tests.factories import make_org

    org = await write(make_org, "Third School")
    twin = await write(make_stack, org, school.stack.slug)
    _, headers = await signed_in(school.admin)
    communicator, _ = await open_socket(f"/ws/stacks/{school.stack.slug}/", headers)
    await write(note, twin, "the twin's memory")
    assert await communicator.receive_nothing(timeout=1.5)
    await communicator.disconnect()


async def test_resume_sends_exactly_the_changes_after_since(school: School) -> None:
    first = await write(note, school.stack, "before the page was opened")
    since = await write(live.stack_seq, school.stack)
    later = [await write(note, school.stack, f"while the socket was down {n}") for n in range(3)]
    await write(memory_forget, memory=first, reason="outdated")  # changed after `since` too
    _, headers = await signed_in(school.admin)
    communicator, _ = await open_socket(f"/ws/stacks/{school.stack.slug}/?since={since}&forgotten=include", headers)
    message = await communicator.receive_json_from(timeout=WAIT)
    # Once an earlier test has started the suite's Celery worker, it may store these memories' vectors
    # meanwhile: their "embedded" events are changes after `since` too, sent as seqs only. The writes
    # must be there exactly once, and nothing from before `since`.
    seen = await events_by_action(message["events"])
    assert message["type"] == "change" and len(seen["write"]) == 4
    assert await write(lambda: ChangeEvent.objects.filter(pk__in=message["events"], seq__lte=since).count()) == 0
    assert {row["id"] for row in message["rows"]} == {str(m.pk) for m in [*later, first]}
    newest = await write(lambda: ChangeEvent.objects.filter(pk__in=message["events"]).order_by("-seq").first())
    assert message["seq"] == newest.seq
    while (more := await receive_or_none(communicator)) is not None:  # nothing twice
        assert set(more["events"]).isdisjoint(message["events"])
        assert not (await events_by_action(more["events"]))["write"], "a write sent twice or late"
    await communicator.disconnect()

    # Resuming from the newest seq sends no write at all.
    communicator, _ = await open_socket(f"/ws/stacks/{school.stack.slug}/?since={message['seq']}", headers)
    while (more := await receive_or_none(communicator)) is not None:
        assert not (await events_by_action(more["events"]))["write"], "a write before `since` sent again"
    await communicator.disconnect()


async def events_by_action(event_ids: list[int]) -> dict[str, list[int]]:
    """The events' ids split into "embedded" (a vector stored) and "write" (everything else)."""
    actions = await write(lambda: dict(ChangeEvent.objects.filter(pk__in=event_ids).values_list("pk", "action")))
    return {"embedded": [pk for pk in event_ids if actions.get(pk) == "embedded"],
            "write": [pk for pk in event_ids if actions.get(pk) != "embedded"]}


async def receive_or_none(communicator: WebsocketCommunicator) -> dict[str, Any] | None:
    """The next JSON message within a second, or None when the socket stays quiet."""
    if await communicator.receive_nothing(timeout=1):
        return None
    return await communicator.receive_json_from(timeout=WAIT)


async def test_a_page_too_far_behind_is_told_to_reload(school: School, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live, "CATCH_UP_EVENTS", 2)
    since = await write(live.stack_seq, school.stack)
    for n in range(3):
        await write(note, school.stack, f"memory {n}")
    _, headers = await signed_in(school.admin)
    communicator, _ = await open_socket(f"/ws/stacks/{school.stack.slug}/?since={since}", headers)
    assert await communicator.receive_json_from(timeout=WAIT) == {"type": "reload"}
    await communicator.disconnect()


async def test_pages_carry_their_live_socket_when_served_over_asgi(school: School) -> None:
    memory = await write(note, school.stack, "already there")
    before = await write(live.stack_seq, school.stack)
    asgi = AsyncClient()
    await asgi.aforce_login(school.admin)
    page = (await asgi.get(f"/dashboard/students/{school.stack.slug}/")).content.decode()
    after = await write(live.stack_seq, school.stack)
    # The stack's seq when the page was rendered (the suite's worker, once running, may store a vector meanwhile).
    found = re.search(rf'data-live-url="/ws/stacks/{school.stack.slug}/" data-live-seq="(\d+)"', page)
    assert found is not None and before <= int(found.group(1)) <= after
    assert f'id="memory-{memory.pk}"' in page and 'data-live-list' in page
    overview = (await asgi.get("/dashboard/")).content.decode()
    assert 'data-live="school"' in overview
    # Over WSGI (no websockets on that server) the pages stay static and open no socket.
    wsgi = await sync_to_async(_session_of)(school.admin)
    for path in (f"/dashboard/students/{school.stack.slug}/", "/dashboard/"):
        assert "data-live=" not in (await sync_to_async(wsgi.get)(path)).content.decode()


async def test_an_event_published_late_reaches_the_page_before_the_seqs_after_it(
        school: School, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fault test's finding: a writer died between its commit and publishing its event, and a
    newer event of the stack was published first. The page must not be sent the newer seq without
    the older event, or a reconnect resuming from that seq would skip it for good."""
    since = await write(live.stack_seq, school.stack)
    _, headers = await signed_in(school.admin)
    communicator, _ = await open_socket(f"/ws/stacks/{school.stack.slug}/?since={since}", headers)
    # The writers "die" after their commits: their events are stored, not published.
    monkeypatch.setattr(change_events, "publish_committed", lambda event_ids: None)
    older = await write(note, school.stack, "written first, published last")
    newer = await write(note, school.stack, "written second, published first")

    def event_of(memory: Memory) -> ChangeEvent:
        return ChangeEvent.objects.get(stack=school.stack, memory_ids__contains=[str(memory.pk)],
                                       action="create")

    older_event, newer_event = await write(event_of, older), await write(event_of, newer)
    assert older_event.seq < newer_event.seq
    with other_connection() as locker:  # the older event's publisher is "still at it": the relay skips it
        locker.execute("SELECT 1 FROM memories_changeevent WHERE id = %s FOR UPDATE", [older_event.pk])
        await published_by_the_relay(newer_event.pk)
        message = await next_change(communicator, str(newer.pk))
    assert {older_event.pk, newer_event.pk} <= set(message["events"])
    assert {str(older.pk), str(newer.pk)} <= {row["id"] for row in message["rows"]}
    assert message["seq"] >= newer_event.seq

    # The older event is published at last: it was sent already, so nothing comes for it.
    await published_by_the_relay(older_event.pk)
    while (more := await receive_or_none(communicator)) is not None:
        assert older_event.pk not in more["events"], "the late event was sent a second time"
    await communicator.disconnect()


async def published_by_the_relay(event_id: int) -> None:
    """Run the relay until `event_id` is published (the suite's own beat may be relaying meanwhile)."""
    for _ in range(WAIT * 10):
        await write(change_events.events_relay)
        if await write(lambda: ChangeEvent.objects.get(pk=event_id).published_at) is not None:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"event {event_id} was never published")


async def test_a_since_beyond_the_stacks_newest_seq_still_gets_the_next_change(school: School) -> None:
    """A page opened before the database was restored from an older backup names a seq the stack
    has not reached again: its socket must not skip the changes below it."""
    newest = await write(live.stack_seq, school.stack)
    _, headers = await signed_in(school.admin)
    communicator, _ = await open_socket(f"/ws/stacks/{school.stack.slug}/?since={newest + 1000}", headers)
    memory = await write(note, school.stack, "written after the restore")
    message = await next_change(communicator, str(memory.pk))
    assert message["rows"][0]["matches"] is True
    await communicator.disconnect()
