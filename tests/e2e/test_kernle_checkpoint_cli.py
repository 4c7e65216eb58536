"""The real kernle 0.15.0 CLI's checkpoint is MemoryHub's checkpoint (docs/kernle-protocol.md §3.12),
for a student whose stack the school key creates on its first push (§3.4), and the dashboard's
checkpoint panel shows it in real Chromium.

One device, signed in with a school-wide key of a school that turned `provision_stacks_on_push` on:
`kernle checkpoint save "Fractions unit, lesson 3" --pending … --context …`, then `kernle sync push`.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import httpx
import pytest

from accounts.models import Membership, Organization
from memories.models import Checkpoint, Memory
from stacks.models import Stack
from tests.e2e.agent import cli_output
from tests.e2e.browser import WatchedPage, check_page, sign_in
from tests.e2e.conftest import KernleCLI
from tests.factories import make_key, make_org, make_user

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# Save the device's checkpoint episode again through kernle's storage API: it is queued for the next push.
RESAVE_SNIPPET = r'''
from kernle import Kernle
store = Kernle(stack_id="carol")._storage
episode = next(e for e in store.get_episodes(limit=10) if e.objective.startswith("[CHECKPOINT]"))
store.save_episode(episode)
print("pending:", store.get_pending_sync_count())
'''
# A checkpoint the device saved three days ago (kernle's own clock set back: the client's time is
# what the stale warning measures), left queued for the next push.
OLD_CHECKPOINT_SNIPPET = r'''
from datetime import datetime, timedelta, timezone
from unittest import mock
import kernle.core.checkpoint as checkpoint_module
from kernle import Kernle

three_days_ago = datetime.now(timezone.utc) - timedelta(days=3)

class DeviceClock(datetime):
    @classmethod
    def now(cls, tz=None):
        return three_days_ago

with mock.patch.object(checkpoint_module, "datetime", DeviceClock):
    Kernle(stack_id="carol").checkpoint("Fractions unit, lesson 2", pending=["Revise halves"], sync=False)
'''
PASSWORD = "correct horse battery staple"  # tests/factories.make_user's default
TASK = "Fractions unit, lesson 3"
PENDING = ["Mark the equivalent-fractions quiz", "Start decimals"]
CONTEXT = "Halfway through equivalent fractions"


def test_cli_checkpoint_becomes_the_stacks_checkpoint_and_shows_on_the_dashboard(
        kernle: KernleCLI, dashboard_url: str, open_page: Callable[[], WatchedPage]) -> None:
    org = make_org("Brookside Academy")
    Organization.objects.filter(pk=org.pk).update(provision_stacks_on_push=True)
    admin = make_user(org, role=Membership.Role.ADMIN, email="head@brookside.example", username="")
    _, secret = make_key(org, user=admin, name="tutor fleet")  # school-wide: no stack yet for "carol"
    headers = {"Authorization": f"Bearer {secret}"}
    api = f"{dashboard_url}/api/v1/stacks/carol"

    device = kernle.new_data_dir()

    def run(*args: str) -> str:
        result = kernle.run(*args, data_dir=device, stack="carol")
        assert result.returncode == 0, cli_output(result)
        return result.stdout

    run("auth", "login", "--api-key", secret, "--backend-url", dashboard_url, "--json")
    run("checkpoint", "save", TASK, "--pending", PENDING[0], "--pending", PENDING[1], "--context", CONTEXT)
    pushed = kernle.json(kernle.run("sync", "push", "--json", data_dir=device, stack="carol"))
    assert pushed["synced"] == 1 and pushed["conflicts"] == [], pushed

    # The first push created the student's stack, and the episode is also the stack's checkpoint.
    carol = Stack.objects.get(organization=org, slug="carol")
    assert carol.kind == Stack.Kind.STUDENT
    checkpoint = httpx.get(f"{api}/checkpoint", headers=headers).json()
    assert checkpoint["task"] == TASK
    assert checkpoint["pending"] == PENDING
    assert checkpoint["context"] == {"text": CONTEXT}
    assert checkpoint["saved_at"] is not None and checkpoint["warnings"] == []

    load = httpx.get(f"{api}/load", headers=headers).json()
    assert load["checkpoint"]["task"] == TASK and PENDING[1] in load["checkpoint"]["text"]
    assert all(TASK not in item["text"] for item in load["memories"])  # the episode is not counted twice

    memory_md = httpx.get(f"{api}/export/memory.md", headers=headers).text
    assert f"- **Task**: {TASK}" in memory_md and f"  - {PENDING[0]}" in memory_md

    # The device sends the same checkpoint episode again (saved again locally, so queued again), then
    # a full sync pulls it back: still one checkpoint.
    resave = subprocess.run([str(kernle.python), "-c", RESAVE_SNIPPET], env=kernle.env(device, stack="carol"),
                            cwd=device, capture_output=True, text=True, timeout=120)
    assert resave.returncode == 0 and "pending: 1" in resave.stdout, resave.stdout + resave.stderr
    again = kernle.json(kernle.run("sync", "push", "--json", data_dir=device, stack="carol"))
    assert again["synced"] == 1 and again["conflicts"] == [], again
    run("sync", "full", "--json")
    assert Checkpoint.objects.filter(stack=carol).count() == 1
    assert Memory.objects.filter(stack=carol, kind="episode").count() == 1

    # The dashboard: the panel shows the task and its pending items; the episode list does not.
    watched = open_page()
    page = watched.page
    sign_in(watched, dashboard_url, admin.email, PASSWORD)
    watched.goto(f"{dashboard_url}/dashboard/students/carol/")
    check_page(watched, "student-kernle-checkpoint")
    panel = page.locator("#live-checkpoint")
    assert TASK in panel.inner_text()
    assert [item.strip() for item in panel.locator(".checkpoint-pending li").all_inner_texts()] == PENDING
    assert "No checkpoint saved yet" not in page.content()
    assert page.locator(f"text={TASK}").count() == 1  # once, in the panel: not as an episode row

    # A checkpoint saved days ago on a device that was offline arrives: the stale warning fires.
    old = subprocess.run([str(kernle.python), "-c", OLD_CHECKPOINT_SNIPPET], env=kernle.env(device, stack="carol"),
                         cwd=device, capture_output=True, text=True, timeout=120)
    assert old.returncode == 0, old.stdout + old.stderr
    late = kernle.json(kernle.run("sync", "push", "--json", data_dir=device, stack="carol"))
    assert late["synced"] == 1 and late["conflicts"] == [], late
    stale = httpx.get(f"{api}/checkpoint", headers=headers).json()
    assert stale["task"] == "Fractions unit, lesson 2"
    assert [warning["code"] for warning in stale["warnings"]] == ["stale"], stale["warnings"]
