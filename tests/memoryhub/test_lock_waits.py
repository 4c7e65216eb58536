"""A web request never waits without end for a lock another change holds: past the web processes'
lock timeout it is answered 503 `busy` with Retry-After, and nothing of it is stored
(docs/operations.md §6 "Lock waits").

The stack row is held the way the embedding worker holds it while it stores a batch's vectors
(`lock_stack_changes`), from a connection of the test's own: a worker stopped inside that
transaction leaves writes to those stacks waiting without the timeout.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from django.db import connection

import memoryhub.settings as settings_module
from memories.models import Memory
from memoryhub.database import database_conninfo
from stacks.models import Stack
from tests.connections import connection_settings
from tests.factories import bearer_client, make_key, make_org, make_stack

pytestmark = pytest.mark.django_db(transaction=True)

LOCK_TIMEOUT_MS = 300


@pytest.fixture
def web_lock_timeout(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process's connections opened as the runner's web processes open theirs."""
    monkeypatch.setattr(settings_module, "DB_LOCK_TIMEOUT_MS", LOCK_TIMEOUT_MS)
    web_options = settings_module._database(settings_module.DATABASE_URL)["OPTIONS"]["options"]
    with connection_settings(OPTIONS={**connection.settings_dict["OPTIONS"], "options": web_options}):
        yield


def _push(slug: str, content: str) -> dict[str, Any]:
    stamp = datetime.now(UTC).isoformat()
    rid = str(uuid.uuid4())
    return {"stack_id": slug, "operations": [{
        "operation": "update", "table": "notes", "record_id": rid, "local_updated_at": stamp, "version": 1,
        "data": {"id": rid, "stack_id": slug, "content": content, "note_type": "note", "created_at": stamp,
                 "local_updated_at": stamp, "version": 1, "deleted": False}}]}


WRITES = {
    "kernle push": lambda client, slug: client.post("/sync/push", _push(slug, "fractions lesson"), format="json"),
    "native write": lambda client, slug: client.post(f"/api/v1/stacks/{slug}/memories",
                                                     {"kind": "note", "content": "fractions lesson"}, format="json"),
}


@pytest.mark.usefixtures("web_lock_timeout")
@pytest.mark.parametrize("write", sorted(WRITES))
def test_a_write_behind_a_held_stack_lock_is_answered_busy_and_stores_nothing(write: str) -> None:
    org = make_org()
    stack = make_stack(org, "held")
    client = bearer_client(make_key(org, stack=stack)[1])
    with psycopg.connect(database_conninfo()) as holder:
        # Were the timeout missing, the write would wait for the holder: PostgreSQL then ends the
        # holder's session after this, the write goes through, and the test fails instead of hanging.
        holder.execute("SET idle_in_transaction_session_timeout = '5s'")
        holder.execute(f"SELECT id FROM {Stack._meta.db_table} WHERE id = %s FOR NO KEY UPDATE",  # noqa: S608
                       [stack.pk])
        refused = WRITES[write](client, stack.slug)
        assert refused.status_code == 503, refused.content
        assert int(refused["Retry-After"]) >= 1
        assert refused.json()["error"]["code"] == "busy"
        holder.rollback()
    assert not Memory.objects.filter(stack=stack).exists()
    assert Stack.objects.get(pk=stack.pk).memory_count == 0
    # Once the holder lets go, the same write goes through.
    accepted = WRITES[write](client, stack.slug)
    assert accepted.status_code in (200, 201), accepted.content
    assert Memory.objects.filter(stack=stack).count() == Stack.objects.get(pk=stack.pk).memory_count == 1


def test_without_the_timeout_the_setting_adds_no_option(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(settings_module, "DB_LOCK_TIMEOUT_MS", 0)
    assert "lock_timeout" not in settings_module._database(settings_module.DATABASE_URL)["OPTIONS"].get("options", "")
