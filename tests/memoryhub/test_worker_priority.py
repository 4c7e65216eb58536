"""The worker yields the cores to requests while embedding keeps up and takes an equal share while it
is behind (memoryhub/worker_priority.py; docs/operations.md §8)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.conf import settings as django_settings
from django.utils import timezone

from memories.models import Memory
from memories.search.embedding_jobs import memories_embed
from memories.search.embeddings import get_embedder
from memories.services import memory_create
from memoryhub import worker_priority
from memoryhub.embedded import ManagedProcess, session_group_nice, session_threads
from memoryhub.embedding_hold import embedding_held, hold_writer
from memoryhub.lanes import PRESSURE_SECONDS
from memoryhub.redis_marks import client, mark_reader, set_mark
from memoryhub.worker_priority import BULK_QUEUED_KEY, PRESSURE_KEY, WorkerPriority, equal_share_nice
from tests.factories import database_conninfo, make_org, make_stack

# The priority reads the backlog on a connection of its own, as the runner does: what it sees is committed.
pytestmark = pytest.mark.django_db(transaction=True)

NICE = 10


def mark_pressure() -> None:
    """What a web process writes while its requests are slowed (memoryhub.lanes)."""
    set_mark(client(django_settings.REDIS_URL), PRESSURE_KEY, PRESSURE_SECONDS)


# A process standing for the worker: it starts a pool process and a thread of its own, as Celery's does.
STAND_IN = """
import subprocess, sys, threading, time
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
threading.Thread(target=time.sleep, args=(120,)).start()
time.sleep(120)
"""


@pytest.fixture
def worker() -> Iterator[ManagedProcess]:
    """The stand-in, started at NICE as the runner starts the worker, once its pool process and thread run."""
    child = ManagedProcess(name="worker", argv=[sys.executable, "-c", STAND_IN], cpu_nice=NICE)
    child.start()
    assert child.pid is not None
    deadline = time.monotonic() + 30
    while len(session_threads(child.pid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    yield child
    child.stop(timeout=1)


def runs_at(pid: int, nice: int) -> bool:
    """Whether the process and its session group run at `nice`, and its threads at the policy that goes
    with it, as far as this process may set them:
    never above our own priority, and a process's own priority raised back only with CAP_SYS_NICE
    (root here); a group's always (None: the kernel has no autogroup)."""
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    own = max(nice, ours) if os.geteuid() == 0 else max(NICE, ours)
    # Its threads yield at SCHED_IDLE; only a privileged runner can put them back at the normal policy.
    policy = os.SCHED_OTHER if nice < NICE and os.geteuid() == 0 else os.SCHED_IDLE
    return (os.getpriority(os.PRIO_PROCESS, pid) == own and session_group_nice(pid) in (max(nice, ours), None)
            and policies(pid) == {policy})


def policies(pid: int) -> set[int]:
    """The scheduling policies of every thread in the session `pid` leads (its pool process's too)."""
    threads = session_threads(pid)
    assert len(threads) >= 3  # the stand-in's two, its pool process's one
    return {os.sched_getscheduler(thread) for thread in threads}


@pytest.fixture
def watched(worker: ManagedProcess) -> Iterator[tuple[WorkerPriority, list[str]]]:
    """The runner's priority thread's `check()` over `worker`, and what it logged."""
    said: list[str] = []
    priority = WorkerPriority(database_conninfo(), lambda: worker.pid, nice=NICE, catch_up_seconds=60, log=said.append)
    yield priority, said
    priority.close()


def awaiting_memory() -> Memory:
    return memory_create(stack=make_stack(make_org()), kind="note", payload={"content": "Long division"}, source="api")


def behind_by(memory: Memory, seconds: int) -> None:
    """The memory last changed `seconds` ago, and still awaits its vector."""
    Memory.objects.filter(pk=memory.pk).update(server_updated_at=timezone.now() - timedelta(seconds=seconds))


def test_the_worker_takes_an_equal_share_while_embedding_is_behind_and_yields_once_caught_up(
        worker: ManagedProcess, watched: tuple[WorkerPriority, list[str]]) -> None:
    priority, said = watched
    assert worker.pid is not None
    memory = awaiting_memory()
    priority.check()  # a change of a moment ago awaits its vector: keeping up
    assert not priority.catching_up and runs_at(worker.pid, NICE)

    behind_by(memory, 90)
    priority.check()
    assert priority.catching_up and runs_at(worker.pid, 0)
    assert said == ["embedding is over 60s behind: the worker takes an equal share of the cores until it "
                    "catches up"]

    # Back under the threshold but not under half of it: still catching up (no flapping at the edge).
    behind_by(memory, 45)
    priority.check()
    assert priority.catching_up and len(said) == 1

    memories_embed(ids=[memory.pk], embedder=get_embedder())
    priority.check()
    assert not priority.catching_up and runs_at(worker.pid, NICE)
    assert said[-1] == "embedding caught up: the worker yields the cores to requests again (nice 10)"


def test_weighed_process_by_process_the_pool_catches_up_as_one_process_would(worker: ManagedProcess) -> None:
    """In its own CPU cgroup, or without autogroup, each of the worker's pool processes is weighed
    alone: catching up, together they weigh what one process at niceness 0 does."""
    assert [equal_share_nice(n) for n in (1, 2, 4, 8)] == [0, 3, 6, 9]
    assert worker.pid is not None
    priority = WorkerPriority(database_conninfo(), lambda: worker.pid, nice=NICE, catch_up_seconds=60,
                              log=lambda line: None, equal_nice=equal_share_nice(2))
    try:
        behind_by(awaiting_memory(), 90)
        priority.check()
        assert priority.catching_up and runs_at(worker.pid, 3)
    finally:
        priority.close()


def test_a_database_that_cannot_answer_leaves_the_worker_as_it_is(
        worker: ManagedProcess, watched: tuple[WorkerPriority, list[str]]) -> None:
    priority, said = watched
    assert worker.pid is not None
    behind_by(awaiting_memory(), 90)
    priority.check()
    assert priority.catching_up
    # The database goes away while the worker catches up: it goes on catching up, and says nothing.
    priority.close()
    priority.database_url = "host=127.0.0.1 port=1 user=nobody dbname=none"
    priority.check()
    assert priority.catching_up and len(said) == 1 and runs_at(worker.pid, 0)


def test_while_requests_are_held_back_the_worker_yields_even_when_behind(
        worker: ManagedProcess, settings: Any) -> None:
    """A flood: the web processes hold bulk work back to keep requests fast (memoryhub.lanes) and
    the embedding falls behind. The backlog waits; the worker takes its equal share again once the
    web processes stop marking the pressure."""
    assert worker.pid is not None
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(PRESSURE_KEY)
    priority = WorkerPriority(database_conninfo(), lambda: worker.pid, nice=NICE, catch_up_seconds=60,
                              log=lambda line: None, requests_pressed=mark_reader(settings.REDIS_URL, PRESSURE_KEY))
    try:
        behind_by(awaiting_memory(), 90)
        mark_pressure()
        priority.check()
        assert priority.catching_up and runs_at(worker.pid, NICE)
        client.delete(PRESSURE_KEY)  # the marks lapse once the web processes are at their full limit again
        priority.check()
        assert runs_at(worker.pid, 0)
    finally:
        priority.close()
        client.delete(PRESSURE_KEY)


def test_in_a_flood_embedding_waits_up_to_its_bound_then_catches_up(
        worker: ManagedProcess, settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A flood: requests slowed while bulk requests queue for the lanes. Embedding waits altogether
    (the worker takes no embedding task: test_embedding_hold.py), however far behind, up to the
    hold's bound, and for as long as requests stay slowed after the flood's pushes; past the bound
    the worker catches up as an equal, flood or not. Requests slowed with no bulk work queuing hold
    nothing. Once both marks lapse, embedding resumes."""
    assert worker.pid is not None
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(PRESSURE_KEY, BULK_QUEUED_KEY)
    said: list[str] = []
    set_held = hold_writer(settings.REDIS_URL)
    priority = WorkerPriority(database_conninfo(), lambda: worker.pid, nice=NICE, catch_up_seconds=60,
                              log=said.append, requests_pressed=mark_reader(settings.REDIS_URL, PRESSURE_KEY),
                              bulk_queued=mark_reader(settings.REDIS_URL, BULK_QUEUED_KEY),
                              hold_seconds=600, set_held=set_held)
    try:
        memory = awaiting_memory()
        priority.check()
        assert not priority.held and not embedding_held()  # no pressure: nothing waits

        mark_pressure()
        behind_by(memory, 90)
        priority.check()  # slowed, but no bulk work queues: the worker keeps up as usual
        assert not priority.held and not embedding_held() and runs_at(worker.pid, NICE)

        client.set(BULK_QUEUED_KEY, "1", ex=10)
        priority.check()
        assert priority.held and embedding_held() and runs_at(worker.pid, NICE)
        assert said[-1] == ("a flood of bulk work slows requests: embedding waits until it ends "
                            "(for up to 600s behind)")

        client.delete(BULK_QUEUED_KEY)
        monkeypatch.setattr(worker_priority, "HOLD_LINGER_SECONDS", 0.0)
        priority.check()  # the flood's pushes are through, but requests are still slowed: it waits
        assert priority.held and embedding_held()

        behind_by(memory, 700)  # past the bound: the backlog's wait is what a school notices now
        priority.check()
        assert not priority.held and not embedding_held() and runs_at(worker.pid, 0)
        assert said[-1] == "embedding resumes"
        behind_by(memory, 90)
        priority.check()  # and slowed requests alone do not start it again
        assert not priority.held

        client.set(BULK_QUEUED_KEY, "1", ex=10)
        priority.check()
        assert priority.held
        client.delete(PRESSURE_KEY, BULK_QUEUED_KEY)
        monkeypatch.setattr(worker_priority, "HOLD_LINGER_SECONDS", 30.0)
        priority.check()  # the flood was seen a moment ago: embedding still waits (no start-stop)
        assert priority.held and embedding_held()
        monkeypatch.setattr(worker_priority, "HOLD_LINGER_SECONDS", 0.0)
        priority.check()
        assert not priority.held and not embedding_held() and runs_at(worker.pid, 0)
    finally:
        priority.close()
        client.delete(PRESSURE_KEY, BULK_QUEUED_KEY)
        set_held(False)


def test_the_look_finds_an_old_change_in_any_stack(
        worker: ManagedProcess, watched: tuple[WorkerPriority, list[str]]) -> None:
    """Behind is any stack's oldest awaiting change, whichever stack holds it: a stack whose changes
    all came a moment ago (an import) neither hides nor stands for another's old one."""
    priority, _ = watched
    assert worker.pid is not None
    org = make_org()
    importing, lagging, quiet = (make_stack(org, slug) for slug in ("importing", "lagging", "quiet"))
    for i in range(20):
        memory_create(stack=importing, kind="note", payload={"content": f"Sheet {i}"}, source="api")
    memory_create(stack=quiet, kind="note", payload={"content": "Fresh"}, source="api")
    old = memory_create(stack=lagging, kind="note", payload={"content": "Long division"}, source="api")
    memory_create(stack=lagging, kind="note", payload={"content": "Short division"}, source="api")
    priority.check()
    assert not priority.catching_up

    behind_by(old, 90)
    priority.check()
    assert priority.catching_up and runs_at(worker.pid, 0)
