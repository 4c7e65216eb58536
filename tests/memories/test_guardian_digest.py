"""The guardians' weekly digest (docs/guardians.md "Weekly digest"): an opted-in guardian gets, per
child, the counts by kind of memories added and forgotten in the week — never a memory's text; a
guardian who did not opt in gets nothing. The opt-in is the box on "Your children"."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core import mail
from django.test import Client
from django.utils import timezone

from accounts.models import AuditEvent, Membership
from memories.governance.guardian_digest import digests_send
from memories.models import Memory
from memories.services import memory_create, memory_forget
from memoryhub.schedule import BEAT_SCHEDULE
from stacks.models import GuardianLink
from tests.factories import make_org, make_stack, make_user

pytestmark = pytest.mark.django_db

TEXTS = ("Ada struggles with fractions", "Ada loves the solar system", "Ada wants to learn chess")


def test_an_opted_in_guardian_gets_counts_and_no_text_and_others_get_nothing() -> None:
    org = make_org("Riverside Primary")
    ada = make_stack(org, "ada", display_name="Ada Byron")
    notes = [memory_create(stack=ada, kind="note", payload={"content": text}, source="test") for text in TEXTS[:2]]
    memory_create(stack=ada, kind="goal", payload={"title": TEXTS[2]}, source="test")
    old = memory_create(stack=ada, kind="note", payload={"content": "written long ago"}, source="test")
    Memory.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=30))
    memory_forget(memory=notes[0], reason="faded")
    subscribed = make_user(org, role=Membership.Role.GUARDIAN, email="opted-in@example.test")
    silent = make_user(org, role=Membership.Role.GUARDIAN, email="silent@example.test")
    for guardian in (subscribed, silent):
        GuardianLink.objects.create(user=guardian, stack=ada)

    client = Client()
    client.force_login(subscribed)
    assert 'name="weekly_digest"' in client.get("/dashboard/family/").content.decode()
    assert client.post("/dashboard/families/digest", {"weekly_digest": "on"}).status_code == 302
    assert Membership.objects.get(user=subscribed).weekly_digest
    assert 'id="id_weekly_digest" checked' in client.get("/dashboard/family/").content.decode()
    assert AuditEvent.objects.filter(action="guardian.digest_changed").count() == 1

    assert digests_send() == 1
    assert [message.to for message in mail.outbox] == [["opted-in@example.test"]]
    body = mail.outbox[0].body
    assert "Ada Byron" in body
    assert "added: 1 goal, 2 notes" in body and "forgotten: 1 note" in body
    for text in (*TEXTS, "written long ago", "faded"):
        assert text not in body and text not in mail.outbox[0].subject

    # Opting out stops it; the beat schedule runs the task weekly.
    client.post("/dashboard/families/digest", {})
    mail.outbox.clear()
    assert digests_send() == 0 and mail.outbox == []
    assert BEAT_SCHEDULE["memories-guardian-digest"]["task"] == "memories.guardian_digest"
