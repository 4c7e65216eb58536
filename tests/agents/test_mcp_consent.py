"""MCP write tools under consent and pause (docs/consent.md): a tool error naming the code, nothing
stored, reads going on; the real server under uvicorn, as tests/agents/test_mcp.py runs it."""

from __future__ import annotations

import pytest

from memories.models import BootConfigEntry, Checkpoint, Memory
from stacks.models import Stack
from tests.agents.test_mcp import call, error, ok, server  # noqa: F401  (server: the module's uvicorn fixture)
from tests.factories import make_key, make_org, make_stack

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

WRITES = {"memory_remember": {"content": "Ada understood fractions with pizza slices"},
          "checkpoint_save": {"task": "Fractions unit"}, "boot_set": {"key": "tone", "value": "warm"}}


def test_write_tools_name_the_refusal_and_store_nothing_until_consent_is_given(server: str) -> None:  # noqa: F811
    org = make_org()
    stack = make_stack(org, "ada")
    _, secret = make_key(org, stack=stack)
    org.consent_required = True
    org.save()
    for name, arguments in WRITES.items():
        refused = error(call(server, secret, name, **arguments))
        assert (refused["status"], refused["error"]["code"]) == (403, "consent_required"), name
    assert not Memory.objects.filter(stack=stack).exists()
    assert not Checkpoint.objects.filter(stack=stack).exists() and not BootConfigEntry.objects.exists()
    assert ok(call(server, secret, "memory_search", query="fractions"))["results"] == []  # reads go on

    org.consent_required = False
    org.save()  # a save: the server's cached credential of the school is refreshed (accounts.key_cache)
    Stack.objects.filter(pk=stack.pk).update(paused_at=org.created_at)
    refused = error(call(server, secret, "memory_remember", content="Paused now"))
    assert refused["error"]["code"] == "memory_paused"
    assert not Memory.objects.filter(stack=stack).exists()

    Stack.objects.filter(pk=stack.pk).update(paused_at=None)
    assert ok(call(server, secret, "memory_remember", content="Resumed"))["decision"] == "create"
