"""The real kernle 0.15.0 CLI against a service whose bulk lane is full (memoryhub.lanes,
docs/kernle-protocol.md §7.2): its push is answered 503 with Retry-After before anything is
applied; the CLI shows the failure and keeps every change queued, and its next push after the wait
stores each of them exactly once."""

from __future__ import annotations

import subprocess
import time
from typing import Any

import pytest

from memories.models import Memory
from memoryhub import lanes
from memoryhub.lanes import BulkLane

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

NOTES_SNIPPET = r'''
import uuid
from kernle import Kernle
from kernle.storage.base import Note

store = Kernle(stack_id="busy")._storage
for i in range(40):
    store.save_note(Note(id=str(uuid.uuid4()), stack_id="busy", content=f"Fractions practice note {i}"))
print("pending:", store.get_pending_sync_count())
'''


def _out(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit={result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


def test_a_push_refused_503_keeps_its_changes_and_the_next_push_stores_them_once(
        kernle: Any, kernle_server: str, monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    settings.LANES_BULK_BYTES = 4096  # forty notes are bulk work here
    bulk = BulkLane(minimum=1, maximum=1, tolerance=2.0, queue_size=0, max_wait=0)
    monkeypatch.setattr(lanes, "_lane", bulk)
    device = kernle.new_data_dir()

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return kernle.run(*args, data_dir=device, stack="busy", timeout=300)

    registered = run("auth", "register", "--email", "busy@example.test", "--backend-url", kernle_server, "--json")
    assert registered.returncode == 0, _out(registered)
    made = subprocess.run([str(kernle.python), "-c", NOTES_SNIPPET], env=kernle.env(device, stack="busy"),
                          cwd=device, capture_output=True, text=True, timeout=600)
    assert "pending: 40" in made.stdout, made.stdout + made.stderr

    release = bulk.acquire(0)  # another school's import holds the lane's one place
    refused = run("sync", "push")
    assert "Push failed: 503" in refused.stdout, _out(refused)
    assert Memory.objects.count() == 0
    assert kernle.json(run("sync", "status", "--json"))["pending_operations"] == 40

    release()
    time.sleep(1)  # the Retry-After the service gave is at least a second
    pushed = run("sync", "push")
    assert pushed.returncode == 0 and "Pushed 40 changes" in pushed.stdout, _out(pushed)
    assert Memory.objects.count() == 40
    assert len(set(Memory.objects.values_list("record_id", flat=True))) == 40
    assert kernle.json(run("sync", "status", "--json"))["pending_operations"] == 0
    assert bulk.running == 0
