"""The worker yields the cores to requests while embedding keeps up and takes an equal share while it
is behind (memoryhub/worker_priority.py; docs/operations.md §8)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from memories.models import Memory
from memories.search.embedding_jobs import memories_embed
from memories.search.embeddings import get_embedder
from memories.services import memory_create
from memories.writes import hooks
from memoryhub.embedded import ManagedProcess
from memoryhub.worker_priority import WorkerPriority
from tests.factories import make_org, make_stack

# The priority reads the backlog on a connection of its own, as the runner does: what it sees is committed.
pytestmark = pytest.mark.django_db(transaction=True)

NICE = 10


@pytest.fixture
def worker() -> Iterator[ManagedProcess]:
    """A process standing for the worker, started at NICE as the runner starts it."""
    child = ManagedProcess(name="worker", argv=[sys.executable, "-c", "import time; time.sleep(120)"],
                           cpu_nice=NICE)
    child.start()
    yield child
    child.stop(timeout=1)


def niceness(pid: int) -> tuple[int, str]:
    """(the process's own niceness, its session group's: "-" where the kernel has no autogroup)."""
    group = Path(f"/proc/{pid}/autogroup")
    return os.getpriority(os.PRIO_PROCESS, pid), group.read_text().split()[-1] if group.exists() else "-"


def expected(nice: int) -> tuple[int, set[str]]:
    ours = os.getpriority(os.PRIO_PROCESS, 0)  # a child is never set above our own priority
    # A process's own priority is raised back only with CAP_SYS_NICE (root here); its group's always.
    own = max(nice, ours) if os.geteuid() == 0 else max(NICE, ours)
    return own, {str(max(nice, ours)), "-"}


def database_conninfo() -> str:
    db = settings.DATABASES["default"]
    return f"host={db['HOST']} port={db['PORT']} user={db['USER']} dbname={db['NAME']}" + (
        f" password={db['PASSWORD']}" if db.get("PASSWORD") else "")


def test_the_worker_takes_an_equal_share_while_embedding_is_behind_and_yields_once_caught_up(
        worker: ManagedProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    # No embedding task: the suite's Celery worker would otherwise embed the memory under the test.
    monkeypatch.setattr(hooks, "_send_embedding", lambda ids, message_ids, **_: None)
    assert worker.pid is not None
    said: list[str] = []
    priority = WorkerPriority(database_conninfo(), lambda: worker.pid, nice=NICE, catch_up_seconds=60, log=said.append)
    try:
        memory = memory_create(stack=make_stack(make_org()), kind="note", payload={"content": "Long division"},
                               source="api")
        priority.check()  # a change of a moment ago awaits its vector: keeping up
        own, groups = expected(NICE)
        assert not priority.catching_up and niceness(worker.pid)[0] == own and niceness(worker.pid)[1] in groups

        Memory.objects.filter(pk=memory.pk).update(server_updated_at=timezone.now() - timedelta(seconds=90))
        priority.check()
        own, groups = expected(0)
        assert priority.catching_up and niceness(worker.pid)[0] == own and niceness(worker.pid)[1] in groups
        assert said == ["embedding is over 60s behind: the worker takes an equal share of the cores until it "
                        "catches up"]

        # Back under the threshold but not under half of it: still catching up (no flapping at the edge).
        Memory.objects.filter(pk=memory.pk).update(server_updated_at=timezone.now() - timedelta(seconds=45))
        priority.check()
        assert priority.catching_up and len(said) == 1

        memories_embed(ids=[memory.pk], embedder=get_embedder())
        priority.check()
        own, groups = expected(NICE)
        assert not priority.catching_up and niceness(worker.pid)[0] == own and niceness(worker.pid)[1] in groups
        assert said[-1] == "embedding caught up: the worker yields the cores to requests again (nice 10)"
    finally:
        priority.close()


def test_a_database_that_cannot_answer_leaves_the_worker_as_it_is(worker: ManagedProcess) -> None:
    assert worker.pid is not None
    said: list[str] = []
    priority = WorkerPriority("host=127.0.0.1 port=1 user=nobody dbname=none", lambda: worker.pid, nice=NICE,
                              catch_up_seconds=60, log=said.append)
    priority.check()
    own, groups = expected(NICE)
    assert not priority.catching_up and said == []
    assert niceness(worker.pid)[0] == own and niceness(worker.pid)[1] in groups
