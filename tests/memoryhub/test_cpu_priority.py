"""Background work yields the cores: a bulk request's thread and database backend, and the worker's
backend, run at a lower CPU priority than interactive work (memoryhub/cpu_priority.py;
docs/architecture.md §5.7 "CPU priority"). The suite runs as root, which may put a priority back."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from memories.models import Memory
from memoryhub.tasks import ping
from stacks.services import personal_account_register
from tests.factories import bearer_client, kernle_note_inserts


def priorities_now() -> tuple[int, int]:
    """This thread's niceness and its database backend's."""
    connection.ensure_connection()
    return (os.getpriority(os.PRIO_PROCESS, threading.get_native_id()),
            os.getpriority(os.PRIO_PROCESS, connection.connection.info.backend_pid))


@pytest.mark.django_db
def test_a_bulk_push_runs_at_low_cpu_priority_and_an_interactive_one_does_not(settings: Any) -> None:
    settings.LANES_BULK_BYTES = 2000
    settings.LANES_BULK_NICE = 10
    account = personal_account_register(stack_id="nice", email="nice@example.test")
    client = bearer_client(account.secret)
    priorities: list[tuple[int, int]] = []

    def record(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        backend = connection.connection.info.backend_pid
        priorities.append((os.getpriority(os.PRIO_PROCESS, threading.get_native_id()),
                           os.getpriority(os.PRIO_PROCESS, backend)))
        return execute(sql, params, many, context)

    thread_before = priorities_now()[0]
    with connection.execute_wrapper(record):
        bulk = client.post("/sync/push", {"stack_id": "nice", "operations": kernle_note_inserts(20)}, format="json")
    assert bulk.status_code == 200, bulk.content
    assert (10, 10) in priorities  # the push's statements ran with thread and backend lowered
    assert priorities_now() == (thread_before, 0)  # both back before the connection serves anything else
    priorities.clear()
    with connection.execute_wrapper(record):
        small = client.post("/sync/push", {"stack_id": "nice", "operations": kernle_note_inserts(1)}, format="json")
    assert small.status_code == 200
    assert priorities and all(p == (thread_before, 0) for p in priorities)
    assert Memory.objects.filter(stack__slug="nice").count() == 21


@pytest.mark.django_db
def test_the_worker_s_backend_takes_the_worker_s_niceness_before_each_task() -> None:
    seen: list[tuple[int, int]] = []

    def task_at(nice: int) -> None:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, nice)  # what the runner sets on the worker
        assert ping.apply().get() == "pong"  # run as the worker runs it: task_prerun first
        seen.append(priorities_now())
        os.setpriority(os.PRIO_PROCESS, tid, 0)

    def tasks() -> None:
        # One thread, one connection: the same backend while the worker yields, then while it is an equal.
        task_at(10)
        task_at(0)
        connection.close()

    worker = threading.Thread(target=tasks)
    worker.start()
    worker.join()
    assert seen == [(10, 10), (0, 0)]
