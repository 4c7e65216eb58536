"""A webhook delivery that carries memory text is a read by its endpoint (docs/privacy.md "Access
log"); one of ids only is not."""

from __future__ import annotations

from typing import Any

from memories.models import MemoryAccess
from tests.actors import School
from tests.webhooks.conftest import (
    Clock,
    Receiver,
    deliver_a_kept_and_a_forgotten_memory,
)


def test_a_delivery_with_text_is_on_the_access_log_as_its_endpoint(
        school: School, receiver: Receiver, second_receiver: Receiver, clock: Clock, queued: list[Any]) -> None:
    with_text, kept, _gone = deliver_a_kept_and_a_forgotten_memory(school, receiver, second_receiver)
    assert len(receiver.bodies()) == 1 and len(second_receiver.bodies()) == 1

    [row] = MemoryAccess.objects.filter(stack=school.stack)
    # Only the memory whose text went out; the forgotten one was listed by id alone.
    assert row.path == "webhook" and row.memory_ids == [kept.pk]
    assert row.author == {"path": "webhook", "key_id": with_text.public_id} | (
        {"key_name": with_text.description} if with_text.description else {})
    assert "fractions" not in str(row.author)
