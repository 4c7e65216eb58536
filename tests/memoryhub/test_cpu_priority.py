"""Background work yields the cores: a bulk request's thread and database backend, and the worker's
backend, run at a lower CPU priority than interactive work, except while the worker holds locks that
interactive writes wait for (memoryhub/cpu_priority.py; docs/architecture.md §5.7 "CPU priority").
The suite runs as root, which may put a priority back. A backend's session group (autogroup) follows
its niceness; where the kernel has no autogroup, or the suite lacks CAP_SYS_ADMIN, groups are left
alone (None)."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection

from memories.models import Memory
from memories.search.embedding_model import deployment_model_claim
from memories.search.embedding_store import store_vectors
from memories.search.embeddings import get_embedder
from memories.services import memory_create
from memoryhub.cpu_priority import interactive_priority, may_change_session_groups
from memoryhub.embedded import session_group_nice, set_session_group_nice
from memoryhub.tasks import ping
from stacks.services import personal_account_register
from tests.factories import bearer_client, kernle_note_inserts, make_org, make_stack

GROUPS_FOLLOW = session_group_nice("self") is not None and may_change_session_groups()


def priorities_now() -> tuple[int, int, int | None]:
    """This thread's niceness, its database backend's and the backend's session group's."""
    connection.ensure_connection()
    backend = connection.connection.info.backend_pid
    return (os.getpriority(os.PRIO_PROCESS, threading.get_native_id()), os.getpriority(os.PRIO_PROCESS, backend),
            session_group_nice(backend) if GROUPS_FOLLOW else None)


def lowered(nice: int) -> tuple[int, int, int | None]:
    """A thread and backend at `nice`, the backend's session group too."""
    return nice, nice, nice if GROUPS_FOLLOW else None


@pytest.mark.django_db
def test_a_bulk_push_runs_at_low_cpu_priority_and_an_interactive_one_does_not(settings: Any) -> None:
    settings.LANES_BULK_BYTES = 2000
    settings.LANES_BULK_NICE = 10
    account = personal_account_register(stack_id="nice", email="nice@example.test")
    client = bearer_client(account.secret)
    priorities: list[tuple[int, int, int | None]] = []

    def record(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        priorities.append(priorities_now())
        return execute(sql, params, many, context)

    thread_before = priorities_now()[0]
    with connection.execute_wrapper(record):
        bulk = client.post("/sync/push", {"stack_id": "nice", "operations": kernle_note_inserts(20)}, format="json")
    assert bulk.status_code == 200, bulk.content
    assert lowered(10) in priorities  # the push's statements ran with thread, backend and its group lowered
    # all back before the connection serves anything else
    assert priorities_now() == (thread_before, *lowered(0)[1:])
    priorities.clear()
    with connection.execute_wrapper(record):
        small = client.post("/sync/push", {"stack_id": "nice", "operations": kernle_note_inserts(1)}, format="json")
    assert small.status_code == 200
    assert priorities and all(p == (thread_before, *lowered(0)[1:]) for p in priorities)
    assert Memory.objects.filter(stack__slug="nice").count() == 21


@pytest.mark.django_db
def test_the_worker_s_backend_takes_the_worker_s_niceness_before_each_task() -> None:
    seen: list[tuple[int, int | None]] = []

    def task_at(nice: int) -> None:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, nice)  # what the runner sets on the worker
        assert ping.apply().get() == "pong"  # run as the worker runs it: task_prerun first
        seen.append(priorities_now()[1:])
        os.setpriority(os.PRIO_PROCESS, tid, 0)

    def tasks() -> None:
        # One thread, one connection: the same backend while the worker yields, then while it is an equal.
        task_at(10)
        task_at(0)
        connection.close()

    worker = threading.Thread(target=tasks)
    worker.start()
    worker.join()
    assert seen == [lowered(10)[1:], lowered(0)[1:]]


def scheduling_now() -> tuple[int, int, int, int | None]:
    """This thread's scheduling policy, then `priorities_now()`."""
    return os.sched_getscheduler(threading.get_native_id()), *priorities_now()


@contextlib.contextmanager
def yielding_worker(nice: int = 10) -> Iterator[None]:
    """This thread and its backend as the worker is while it yields: SCHED_IDLE at niceness `nice`
    (memoryhub.worker_priority), its backend and the backend's group at `nice` (backend_follows_worker)."""
    tid = threading.get_native_id()
    connection.ensure_connection()
    backend = connection.connection.info.backend_pid

    def set_all(policy: int, value: int) -> None:
        os.sched_setscheduler(tid, policy, os.sched_param(0))
        os.setpriority(os.PRIO_PROCESS, tid, value)
        os.setpriority(os.PRIO_PROCESS, backend, value)
        if GROUPS_FOLLOW:
            set_session_group_nice(backend, value)

    set_all(os.SCHED_IDLE, nice)
    try:
        yield
    finally:
        set_all(os.SCHED_OTHER, 0)


@pytest.mark.django_db
def test_interactive_priority_raises_a_yielding_thread_and_its_backend_and_puts_both_back() -> None:
    with yielding_worker(10):
        with interactive_priority():
            inside = scheduling_now()
        after = scheduling_now()
    assert inside == (os.SCHED_OTHER, *lowered(0))
    assert after == (os.SCHED_IDLE, *lowered(10))
    with interactive_priority():  # a thread and backend at the interactive priority already: unchanged
        assert scheduling_now() == (os.SCHED_OTHER, *lowered(0))
    assert scheduling_now() == (os.SCHED_OTHER, *lowered(0))


@pytest.mark.django_db
def test_the_worker_holds_stack_locks_at_the_interactive_priority_only() -> None:
    model = get_embedder().model_id
    deployment_model_claim(model)
    memory = memory_create(stack=make_stack(make_org()), kind="note", payload={"content": "fractions"}, source="api")
    at_statements: list[tuple[str, tuple[int, int, int, int | None]]] = []

    def record(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        at_statements.append((sql, scheduling_now()))
        return execute(sql, params, many, context)

    with yielding_worker(10):
        with connection.execute_wrapper(record):
            stored = store_vectors([(str(memory.pk), memory.version)], [[1.0] + [0.0] * 383], model)
        after = scheduling_now()
    assert stored == 1
    # Every statement sent through Django's cursor ran at the interactive priority, from the stack
    # lock to the end of the store's transaction (here a savepoint's release: the test runs in a
    # transaction of its own). So did the vectors' UPDATE between them, on a cursor this wrapper does
    # not see. Once the store had ended, the worker yielded again.
    assert any("FOR NO KEY UPDATE" in sql for sql, _ in at_statements)
    assert at_statements[-1][0].startswith("RELEASE SAVEPOINT")
    assert all(priorities == (os.SCHED_OTHER, *lowered(0)) for _, priorities in at_statements)
    assert after == (os.SCHED_IDLE, *lowered(10))
