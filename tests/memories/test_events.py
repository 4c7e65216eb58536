"""The change-event path (memories.writes.outbox, memories.changes; docs/architecture.md §11):
every committed write leaves exactly one outbox row per transaction and stack, published after
commit to the channel layer and the registered consumers; a rolled-back write leaves nothing; with
Redis unreachable the write still succeeds and the relay publishes the event once Redis answers.
Real Postgres and Redis: the tests commit (transactional_db) and listen on the real channel layer.

When the suite's Celery worker runs (started by other test modules), it embeds what these tests
write and its "embedded" events arrive too: the helpers below leave those out."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from channels.layers import DEFAULT_CHANNEL_LAYER, channel_layers
from django.db import transaction
from django.forms.models import model_to_dict
from django.test import override_settings
from django.utils import timezone

from memories.changes import feed, publish, watchers
from memories.lifecycle.decay_pass import decay_pass
from memories.lifecycle.ttl import ttl_purge
from memories.models import ChangeEvent, Memory
from memories.search.embedding_model import deployment_model_claim
from memories.search.embedding_store import EMBEDDING_SOURCE, store_vectors
from memories.search.embeddings import get_embedder
from memories.services import CheckpointInput, boot_config_set, checkpoint_save, memory_create
from memories.writes import effects, hooks
from memoryhub.embedded import free_port
from stacks.models import Stack
from tests.actors import School

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 11, 21, 9, 0, tzinfo=UTC)


class Listener:
    """A test channel subscribed to a stack's group through the channel layer's own API, on one
    event loop and one layer instance of its own: a channels_redis layer binds its receive locks to
    the loop that first waits on them, so the process's shared instance, used by other tests' loops
    (a live page's socket in tests/dashboard), could refuse this loop."""

    def __init__(self, group: str, *, counted: bool = True) -> None:
        self.loop = asyncio.new_event_loop()
        self.layer = channel_layers.make_backend(DEFAULT_CHANNEL_LAYER)
        self.group = group
        self.counted = counted  # counted as a watcher, as the live pages' sockets are
        if counted:
            watchers.watch([group])
        self.channel = self.loop.run_until_complete(self.layer.new_channel())
        self.loop.run_until_complete(self.layer.group_add(group, self.channel))

    def receive(self, timeout: float = 3.0) -> dict[str, Any] | None:
        """The next message, other than the embedding worker's; None if none comes in time."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                message = self.loop.run_until_complete(asyncio.wait_for(self.layer.receive(self.channel), left))
            except TimeoutError:
                return None
            if message["event"]["source"] != EMBEDDING_SOURCE:
                return message
        return None

    def close(self) -> None:
        self.loop.run_until_complete(self.layer.group_discard(self.group, self.channel))
        if self.counted:
            watchers.unwatch([self.group])
        self.loop.close()  # channels_redis closes this loop's connections with it


@pytest.fixture(autouse=True)
def _breaker_closed() -> Iterator[None]:
    """Each test starts with the channel layer considered up (a test below makes it fail)."""
    publish._layer_loop.down_until = 0.0
    yield
    publish.wait_published()
    publish._layer_loop.down_until = 0.0


@pytest.fixture(autouse=True)
def _no_embedding_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    """These writes queue no embedding task: the suite's Celery worker (when another module started
    it) would otherwise embed them while the test runs, and write into its teardown's flush."""
    monkeypatch.setattr(hooks, "_send_embedding", lambda ids, message_ids, **_: None)


@pytest.fixture
def listen() -> Iterator[Any]:
    opened: list[Listener] = []

    def subscribe(group: str, *, counted: bool = True) -> Listener:
        listener = Listener(group, counted=counted)
        opened.append(listener)
        return listener

    yield subscribe
    for listener in opened:
        listener.close()


def episode(record_id: str, stack_slug: str, n: int = 0) -> dict[str, Any]:
    stamp = (T0 + timedelta(seconds=n)).isoformat()
    data = {"id": record_id, "stack_id": stack_slug, "objective": f"Lesson {n}", "outcome": "success",
            "created_at": stamp, "local_updated_at": stamp, "version": 1, "deleted": False}
    return {"operation": "update", "table": "episodes", "record_id": record_id, "local_updated_at": stamp,
            "version": 1, "data": data}


def kernle_push(school: School, operations: list[dict[str, Any]]) -> Any:
    return school.agent.post("/sync/push", {"stack_id": school.stack.slug, "operations": operations}, format="json")


def stack_events(stack: Stack) -> list[ChangeEvent]:
    """The stack's events but the embedding worker's, oldest first."""
    return list(ChangeEvent.objects.filter(stack=stack).exclude(source=EMBEDDING_SOURCE).order_by("id"))


class Rollback(Exception):
    pass


def test_a_rolled_back_write_records_and_publishes_nothing(school: School, listen: Any) -> None:
    listener = listen(f"stack.{school.stack.pk}")
    with pytest.raises(Rollback), transaction.atomic():
        memory_create(stack=school.stack, kind="note", payload={"content": "never kept"}, source="api")
        assert len(stack_events(school.stack)) == 1  # written inside the transaction…
        raise Rollback
    assert stack_events(school.stack) == []  # …and gone with it
    assert listener.receive(timeout=0.5) is None


def test_a_push_of_500_operations_is_one_event_and_one_message_naming_all_500(school: School,
                                                                               listen: Any) -> None:
    stack_listener = listen(f"stack.{school.stack.pk}")
    school_listener = listen(f"school.{school.org.pk}")
    response = kernle_push(school, [episode(f"e-{n}", school.stack.slug, n) for n in range(500)])
    assert response.status_code == 200, response.content
    assert response.json()["synced"] == 500
    assert publish.wait_published()  # (published by this process's publisher thread)

    [event] = stack_events(school.stack)
    stored = dict(Memory.objects.filter(stack=school.stack).values_list("id", "change_seq"))
    assert (event.topic, event.action, event.source) == ("memory", "create", "sync")
    assert sorted(event.memory_ids) == sorted(str(i) for i in stored)
    assert event.seq == max(stored.values())
    assert event.published_at is not None

    message = stack_listener.receive()
    assert message is not None and message["type"] == "stack.change"
    assert message["event"] == feed.event_dict(event, school.stack.slug)
    assert len(message["event"]["memory_ids"]) == 500
    assert stack_listener.receive(timeout=0.5) is None  # one message, not 500
    assert school_listener.receive() == message
    assert school_listener.receive(timeout=0.5) is None


def test_a_change_is_sent_only_to_the_groups_someone_watches(school: School, listen: Any) -> None:
    """The stack's group has a channel in it but no watcher counted: the publisher skips it (a send
    to a group no page watches costs the channel layer's round trips); the watched school group
    still gets the event, and the event is published all the same."""
    uncounted = listen(f"stack.{school.stack.pk}", counted=False)
    school_listener = listen(f"school.{school.org.pk}")
    memory = memory_create(stack=school.stack, kind="note", payload={"content": "watched by the school"},
                           source="api")
    assert publish.wait_published()
    message = school_listener.receive()
    assert message is not None and message["event"]["memory_ids"] == [str(memory.pk)]
    assert uncounted.receive(timeout=0.5) is None
    [event] = stack_events(school.stack)
    assert event.published_at is not None


def test_watchers_are_counted_per_group_until_the_last_one_leaves(school: School) -> None:
    stack_group, school_group = watchers.stack_group(school.stack.pk), watchers.school_group(school.org.pk)
    assert watchers.watched([stack_group, school_group]) == set()
    watchers.watch([stack_group])
    watchers.watch([stack_group, school_group])
    assert watchers.watched([stack_group, school_group]) == {stack_group, school_group}
    watchers.unwatch([stack_group, school_group])
    assert watchers.watched([stack_group, school_group]) == {stack_group}
    watchers.unwatch([stack_group])
    assert watchers.watched([stack_group, school_group]) == set()
    watchers.unwatch([stack_group])  # one leave too many (a count lost to a Redis restart) …
    watchers.watch([stack_group])  # … does not hide the next watcher
    assert watchers.watched([stack_group]) == {stack_group}
    watchers.unwatch([stack_group])


def test_native_api_writes_have_events_with_increasing_seq_matching_the_rows(school: School, listen: Any) -> None:
    listener = listen(f"stack.{school.stack.pk}")
    url = school.stack_url("memories")
    created = school.agent.post(url, {"kind": "note", "content": "Likes pizza fractions"}, format="json").json()
    updated = school.agent.patch(f"{url}/{created['id']}", {"content": "Loves pizza fractions"}, format="json")
    forgotten = school.agent.post(f"{url}/{created['id']}/forget", {"reason": "outdated"}, format="json")
    assert updated.status_code == 200 and forgotten.status_code == 200
    assert publish.wait_published()

    found = stack_events(school.stack)
    assert [(e.action, e.source) for e in found] == [("create", "api"), ("update", "api"), ("forget", "api")]
    assert all(e.memory_ids == [created["id"]] for e in found)
    seqs = [e.seq for e in found]
    assert seqs == sorted(seqs) and len(set(seqs)) == 3
    assert seqs[-1] == Memory.objects.get(pk=created["id"]).change_seq
    received = [listener.receive() for _ in range(3)]
    assert [m["event"]["seq"] for m in received if m] == seqs


def test_checkpoint_and_boot_config_writes_have_events(school: School, listen: Any) -> None:
    listener = listen(f"stack.{school.stack.pk}")
    saved = school.agent.post(school.stack_url("checkpoint"), {"task": "Fractions unit"}, format="json")
    put = school.agent.put(school.stack_url("boot-config/tutor.name"), {"value": "Ada"}, format="json")
    deleted = school.agent.delete(school.stack_url("boot-config/tutor.name"))
    assert saved.status_code == 201 and put.status_code == 200 and deleted.status_code == 204
    assert publish.wait_published()

    found = stack_events(school.stack)
    assert [(e.topic, e.action) for e in found] == [("checkpoint", "save"), ("boot_config", "set"),
                                                    ("boot_config", "unset")]
    assert all(e.memory_ids == [] and e.published_at is not None for e in found)
    assert [e.seq for e in found] == sorted(e.seq for e in found)
    received = [listener.receive() for _ in range(3)]
    assert [m["event"]["topic"] for m in received if m] == ["checkpoint", "boot_config", "boot_config"]


def test_a_decay_pass_sends_one_event_per_stack(school: School, other_school: School) -> None:
    now = timezone.now()
    created = now - timedelta(days=400)
    stacks = [school.stack, school.other_stack, other_school.stack]
    faded: dict[int, set[str]] = {}
    for stack in stacks:
        rows = [Memory(stack=stack, kind="episode", record_id=f"old-{n}", text="an old lesson", created_at=created,
                       server_updated_at=created) for n in range(30)]
        Memory.objects.bulk_create(rows)
        faded[stack.pk] = {str(m.pk) for m in rows}

    run = decay_pass(now=now, workers=1)
    assert publish.wait_published()

    assert run.counts["forgotten"] == 90
    for stack in stacks:
        [event] = stack_events(stack)  # one event per stack (the pass ran as one batch)
        assert (event.action, event.source) == ("forget", "decay")
        assert set(event.memory_ids) == faded[stack.pk]
        assert event.seq == max(Memory.objects.filter(stack=stack).values_list("change_seq", flat=True))
        assert event.published_at is not None


def test_with_redis_unreachable_a_push_succeeds_and_the_relay_publishes_later_exactly_once(
        school: School, listen: Any) -> None:
    dead = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                        "CONFIG": {"hosts": [f"redis://127.0.0.1:{free_port()}/0"], "prefix": "mh:channels"}}}
    listener = listen(f"stack.{school.stack.pk}")  # a page watches: its changes must reach it
    with override_settings(CHANNEL_LAYERS=dead):
        started = time.monotonic()
        response = kernle_push(school, [episode("while-down", school.stack.slug)])
        elapsed = time.monotonic() - started
        assert response.status_code == 200 and response.json()["synced"] == 1
        again = kernle_push(school, [episode("still-down", school.stack.slug, 1)])
        assert again.status_code == 200
        assert publish.wait_published()  # tried (and failed) while the layer was unreachable
    assert elapsed < publish.PUBLISH_TIMEOUT_SECONDS + 1.5
    first, second = stack_events(school.stack)
    assert first.published_at is None and second.published_at is None  # left to the relay

    relayed = publish.events_relay()
    assert relayed["published"] >= 2 and relayed["left"] == 0  # (and the worker's events it held back)
    messages = [listener.receive(), listener.receive()]
    assert [m["event"]["id"] for m in messages if m] == [first.pk, second.pk]  # in order
    assert all(e.published_at is not None for e in stack_events(school.stack))
    assert publish.events_relay() == {"published": 0, "left": 0}
    assert listener.receive(timeout=0.5) is None  # exactly once


def test_a_consumer_is_called_only_for_the_events_its_condition_on_the_stack_wants(school: School) -> None:
    wanted: list[int] = []

    def alice_only(event: ChangeEvent) -> None:
        wanted.append(event.stack_id)

    effects.register_event_consumer(alice_only, wanted_if=f"s.slug = '{school.stack.slug}'")
    try:
        memory_create(stack=school.other_stack, kind="note", payload={"content": "bob's"}, source="api")
        memory_create(stack=school.stack, kind="note", payload={"content": "alice's"}, source="api")
        assert publish.wait_published()
    finally:
        effects.unregister_event_consumer(alice_only)
    assert wanted == [school.stack.pk]
    # Both events were published all the same (live pages, other consumers).
    assert all(event.published_at is not None
               for event in [*stack_events(school.stack), *stack_events(school.other_stack)])


def test_a_failing_consumer_leaves_the_event_to_the_relay_and_never_fails_the_write(school: School) -> None:
    calls: list[int] = []

    def flaky(event: ChangeEvent) -> None:
        if event.source == EMBEDDING_SOURCE:
            return
        calls.append(event.pk)
        if len(calls) == 1:
            raise RuntimeError("the consumer's backend is down")

    effects.register_event_consumer(flaky)
    try:
        memory = memory_create(stack=school.stack, kind="note", payload={"content": "hello"}, source="api")
        assert publish.wait_published()
        [event] = stack_events(school.stack)
        assert event.published_at is None and calls == [event.pk]
        relayed = publish.events_relay()
        assert relayed["published"] >= 1 and relayed["left"] == 0
    finally:
        effects.unregister_event_consumer(flaky)
    assert calls == [event.pk, event.pk]
    assert stack_events(school.stack)[0].published_at is not None
    assert event.memory_ids == [str(memory.pk)]


def test_one_transaction_writing_a_stack_twice_is_one_event(school: School) -> None:
    with transaction.atomic():
        first = memory_create(stack=school.stack, kind="note", payload={"content": "one"}, source="ingest")
        second = memory_create(stack=school.stack, kind="note", payload={"content": "two"}, source="ingest")
        memory_create(stack=school.other_stack, kind="note", payload={"content": "bob's"}, source="ingest")
    [event] = stack_events(school.stack)
    assert event.memory_ids == [str(first.pk), str(second.pk)]
    assert event.seq == Memory.objects.get(pk=second.pk).change_seq
    assert len(stack_events(school.other_stack)) == 1


def test_events_after_returns_exactly_the_later_events(school: School) -> None:
    # Checkpoints and boot config: writes nobody embeds, so no worker adds events meanwhile.
    for n in range(4):
        checkpoint_save(stack=school.stack, checkpoint=CheckpointInput(task=f"Unit {n}"))
    boot_config_set(stack=school.other_stack, key="tone", value="warm")
    found = stack_events(school.stack)
    assert [e.seq for e in found] == sorted({e.seq for e in found})
    assert [e.pk for e in feed.events_after(school.stack, found[1].seq)] == [e.pk for e in found[2:]]
    assert [e.pk for e in feed.events_after(school.stack, 0, limit=2)] == [e.pk for e in found[:2]]
    assert feed.events_after(school.stack, found[-1].seq) == []
    assert feed.latest_seq(school.stack) == found[-1].seq
    # Up to a seq (a live socket's read), each event whole, as the ORM reads it (once published:
    # the publisher thread stamps published_at meanwhile).
    assert publish.wait_published()
    expected = list(ChangeEvent.objects.filter(pk__in=[e.pk for e in found[1:3]]).order_by("seq"))
    between = feed.events_after(school.stack.pk, found[0].seq, through=found[2].seq)
    assert [model_to_dict(e) for e in between] == [model_to_dict(e) for e in expected]
    assert [e.created_at for e in between] == [e.created_at for e in expected]


def test_prune_deletes_only_old_published_events(school: School) -> None:
    for n in range(3):
        memory_create(stack=school.stack, kind="note", payload={"content": f"note {n}"}, source="api")
    assert publish.wait_published()
    old, unpublished, recent = stack_events(school.stack)
    week_ago = timezone.now() - timedelta(days=8)
    ChangeEvent.objects.filter(pk__in=[old.pk, unpublished.pk]).update(created_at=week_ago)
    ChangeEvent.objects.filter(pk=unpublished.pk).update(published_at=None)
    assert publish.events_prune() == 1
    assert {e.pk for e in stack_events(school.stack)} == {unpublished.pk, recent.pk}


def test_a_sync_push_naming_no_stack_of_the_caller_records_nothing(school: School, other_school: School) -> None:
    response = school.agent.post("/sync/push", {"stack_id": other_school.stack.slug,
                                                "operations": [episode(str(uuid.uuid4()), "x")]}, format="json")
    assert response.status_code in (403, 404)
    assert not ChangeEvent.objects.exists()


def test_a_ttl_purge_sends_one_purge_event_per_stack(school: School) -> None:
    now = timezone.now()
    expired: dict[int, set[str]] = {}
    for stack in (school.stack, school.other_stack):
        rows = [Memory(stack=stack, kind="note", record_id=f"tmp-{n}", text="temporary", created_at=now,
                       server_updated_at=now, expires_at=now - timedelta(minutes=1)) for n in range(3)]
        Memory.objects.bulk_create(rows)
        expired[stack.pk] = {str(m.pk) for m in rows}

    ttl_purge(now=now)
    assert publish.wait_published()

    for stack in (school.stack, school.other_stack):
        [event] = stack_events(stack)
        assert (event.topic, event.action, event.source) == ("memory", "purge", "ttl")
        assert set(event.memory_ids) == expired[stack.pk] and event.published_at is not None


def test_stored_vectors_send_one_embedded_event_per_stack(school: School) -> None:
    model = get_embedder().model_id
    deployment_model_claim(model)
    mine = {stack.pk: memory_create(stack=stack, kind="note", payload={"content": "fractions"}, source="api")
            for stack in (school.stack, school.other_stack)}

    stored = store_vectors([(str(m.pk), m.version) for m in mine.values()], [[1.0] + [0.0] * 383] * 2, model)

    assert stored == 2
    for stack_id, memory in mine.items():
        embedded = ChangeEvent.objects.filter(stack_id=stack_id, source=EMBEDDING_SOURCE, action="embedded")
        assert [str(memory.pk)] in [e.memory_ids for e in embedded]  # (the suite's worker may embed it too)


def test_erasing_a_memory_sends_an_erase_event_naming_its_id_only(school: School) -> None:
    memory = memory_create(stack=school.stack, kind="note", payload={"content": "private"}, source="api")
    response = school.admin_api.post(school.stack_url(f"memories/{memory.pk}/erase"),
                                     {"requested_by": "parent of Alice"}, format="json")
    assert response.status_code == 200, response.content
    assert publish.wait_published()
    erase = stack_events(school.stack)[-1]
    assert (erase.action, erase.source, erase.memory_ids) == ("erase", "erasure", [str(memory.pk)])
    assert erase.published_at is not None


class StackWriter:
    """Another connection in the middle of a write to `stack`: it holds the stack's change lock
    (as a push does for its whole length) until `finish()`."""

    def __init__(self, stack: Stack) -> None:
        import threading

        from django.db import connection

        from memories.writes.rows import lock_stack_changes

        self.locked = threading.Event()
        self.release = threading.Event()

        def write() -> None:
            try:
                with transaction.atomic():
                    lock_stack_changes(stack.pk)
                    self.locked.set()
                    self.release.wait(10)
            finally:
                connection.close()

        self.thread = threading.Thread(target=write)
        self.thread.start()
        assert self.locked.wait(10)

    def finish(self) -> None:
        self.release.set()
        self.thread.join(10)


def test_the_embedding_job_waits_for_a_write_in_progress_on_the_stack(school: School) -> None:
    """Its "embedded" event draws its seq under the stack lock, so it cannot commit before a
    lower seq of the same stack: a live page resuming from a seq never skips a change."""
    import threading

    from django.db import connection

    model = get_embedder().model_id
    deployment_model_claim(model)
    memory = memory_create(stack=school.stack, kind="note", payload={"content": "fractions"}, source="api")
    writer = StackWriter(school.stack)
    done = threading.Event()

    def embed() -> None:
        try:
            store_vectors([(str(memory.pk), memory.version)], [[1.0] + [0.0] * 383], model)
            done.set()
        finally:
            connection.close()

    embedder = threading.Thread(target=embed)
    embedder.start()
    try:
        assert not done.wait(0.5), "the embedding job wrote while a writer held the stack"
    finally:
        writer.finish()
    embedder.join(10)
    assert done.is_set()
    event = ChangeEvent.objects.get(stack=school.stack, source=EMBEDDING_SOURCE, memory_ids=[str(memory.pk)])
    assert event.seq > max(e.seq for e in stack_events(school.stack))


def test_a_ttl_purge_leaves_a_stack_being_written_to_the_next_run(school: School) -> None:
    now = timezone.now()
    for stack in (school.stack, school.other_stack):
        Memory.objects.bulk_create([Memory(stack=stack, kind="note", record_id=f"tmp-{n}", text="temporary",
                                           created_at=now, server_updated_at=now,
                                           expires_at=now - timedelta(minutes=1)) for n in range(3)])
    writer = StackWriter(school.stack)
    try:
        ttl_purge(now=now)
        assert Memory.objects.filter(stack=school.stack).count() == 3  # busy: left for the next run
        assert not Memory.objects.filter(stack=school.other_stack).exists()
    finally:
        writer.finish()

    ttl_purge(now=now)
    assert not Memory.objects.filter(stack=school.stack).exists()
    assert publish.wait_published()
    assert [e.action for e in stack_events(school.stack)] == ["purge"]
