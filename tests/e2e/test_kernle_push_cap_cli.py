"""The push cap against the real kernle 0.15.0 CLI (docs/kernle-protocol.md §3.1, §3.2, §7.3).

1,000 operations per push is what `sync full` sends at most (`sync push` sends 100 by default): the
cap refuses none of it. A `sync push --limit 1001` is refused whole with a 413 the CLI shows
(`too_many_operations`), once — it does not retry — and the changes stay queued for the next sync.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.signals import request_started

from memories.models import Memory

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

NOTES_SNIPPET = r'''
import uuid
from kernle import Kernle
from kernle.storage.base import Note

store = Kernle(stack_id="cap")._storage
for i in range(1001):
    store.save_note(Note(id=str(uuid.uuid4()), stack_id="cap", content=f"Fractions practice note {i}"))
print("pending:", store.get_pending_sync_count())
'''


@pytest.fixture
def pushes() -> Iterator[list[str]]:
    """The paths of the sync pushes the live server receives (it runs in this process)."""
    seen: list[str] = []

    def record(**signal: Any) -> None:  # request_started sends sender= and environ= (WSGI)
        environ = signal.get("environ") or {}
        if environ.get("PATH_INFO") == "/sync/push":
            seen.append(environ["PATH_INFO"])

    request_started.connect(record, dispatch_uid="test-push-cap-pushes")
    yield seen
    request_started.disconnect(dispatch_uid="test-push-cap-pushes")


def _out(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit={result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


def test_the_cap_refuses_nothing_the_client_sends_by_itself(kernle: Any, kernle_server: str,
                                                            pushes: list[str]) -> None:
    device = kernle.new_data_dir()

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return kernle.run(*args, data_dir=device, stack="cap", timeout=300)

    registered = run("auth", "register", "--email", "push-cap@example.test", "--backend-url", kernle_server, "--json")
    assert registered.returncode == 0, _out(registered)
    made = subprocess.run([str(kernle.python), "-c", NOTES_SNIPPET], env=kernle.env(device, stack="cap"),
                          cwd=device, capture_output=True, text=True, timeout=600)
    assert "pending: 1001" in made.stdout, made.stdout + made.stderr

    # Past the cap: one request, refused whole, shown, not retried; nothing stored, nothing lost.
    refused = run("sync", "push", "--limit", "1001")
    assert refused.returncode == 1, _out(refused)
    assert "Push failed: 413" in refused.stdout and "too_many_operations" in refused.stdout, _out(refused)
    assert len(pushes) == 1
    assert Memory.objects.count() == 0
    assert kernle.json(run("sync", "status", "--json"))["pending_operations"] == 1001

    # What the client sends by itself: 1,000 from `sync full`, then the rest from `sync push`.
    full = run("sync", "full")
    assert full.returncode == 0 and "Pushed 1000 changes" in full.stdout, _out(full)
    assert Memory.objects.count() == 1000
    rest = run("sync", "push")
    assert rest.returncode == 0 and "Pushed 1 changes" in rest.stdout, _out(rest)
    assert Memory.objects.count() == 1001
    assert kernle.json(run("sync", "status", "--json"))["pending_operations"] == 0
