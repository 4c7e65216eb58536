"""Consent against the real kernle 0.15.0 CLI (docs/consent.md, docs/kernle-protocol.md §3.11).

A school that requires consent, a student without it: `kernle sync push` stores nothing, each
operation refused as an acknowledged conflict naming `consent_required` (so the device does not
re-send it for ever). Once a school admin records the guardian's paper consent, the next push is
stored.
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from accounts.models import Membership
from accounts.principal import Principal
from memories.governance.consent import consent_give
from memories.models import Memory
from stacks.models import Stack, StackConsent
from tests.factories import make_key, make_org, make_stack, make_user

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SLUG = "consent"
NOTE_SNIPPET = r'''
import os, sys, uuid
from kernle import Kernle
from kernle.storage.base import Note

stack = os.environ["KERNLE_STACK_ID"]
store = Kernle(stack_id=stack)._storage
store.save_note(Note(id=str(uuid.uuid4()), stack_id=stack, content=sys.argv[1]))
print("pending:", store.get_pending_sync_count())
'''


def _out(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit={result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


def test_a_push_without_consent_stores_nothing_and_one_after_consent_is_stored(kernle: Any,
                                                                                kernle_server: str) -> None:
    org = make_org()
    org.consent_required = True
    org.save()
    admin = make_user(org, role=Membership.Role.ADMIN)
    stack = make_stack(org, SLUG)
    _, secret = make_key(org, stack=stack, user=admin)
    device: Path = kernle.new_data_dir()

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return kernle.run(*args, data_dir=device, stack=SLUG, timeout=180)

    def note(text: str) -> None:
        made = subprocess.run([str(kernle.python), "-c", NOTE_SNIPPET, text], env=kernle.env(device, stack=SLUG),
                              cwd=device, capture_output=True, text=True, timeout=120)
        assert made.returncode == 0 and "pending: 1" in made.stdout, made.stdout + made.stderr

    joined = run("auth", "login", "--api-key", secret, "--backend-url", kernle_server, "--json")
    assert joined.returncode == 0, _out(joined)

    note(f"Fractions with pizza slices {uuid.uuid4().hex[:6]}")
    refused = run("sync", "push", "--json")
    assert refused.returncode == 0, _out(refused)
    result = kernle.json(refused)
    assert len(result["conflicts"]) == 1 and "(consent_required)" in str(result["conflicts"][0]["error"]), result
    assert not Memory.objects.filter(stack=stack).exists()
    assert kernle.json(run("sync", "status", "--json"))["pending_operations"] == 0  # acknowledged, not re-sent

    principal = Principal(user=admin, organization=org, role=Membership.Role.ADMIN)
    consent_give(Stack.objects.get(pk=stack.pk), by=principal, method=StackConsent.Method.PAPER,
                 note="signed form")
    note("Decimals next, after fractions")
    pushed = run("sync", "push", "--json")
    assert pushed.returncode == 0, _out(pushed)
    assert kernle.json(pushed)["conflicts"] == [], _out(pushed)
    assert list(Memory.objects.filter(stack=stack).values_list("text", flat=True)) == [
        "Decimals next, after fractions"]
