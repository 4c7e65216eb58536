"""The real kernle 0.15.0 CLI syncing against a live MemoryHub (docs/kernle-protocol.md §10.2, §10.4, §10.5).

Device A registers, writes every syncable type (CLI for raw/episode/note/checkpoint, the storage
API for the rest, exactly as §10.4), pushes and pulls; device B logs in with the same key and a
full pull brings every supported record; a third, empty device finds the notes through search.
"""

from __future__ import annotations

import pytest

from memories.models import Memory
from stacks.models import Stack

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

STORAGE_SNIPPET = r'''
import uuid
from kernle import Kernle
from kernle.storage.base import Value, Belief, Goal, Drive, Relationship, Playbook

stack = "acceptance"
store = Kernle(stack_id=stack)._storage
new_id = lambda: str(uuid.uuid4())

store.save_value(Value(id=new_id(), stack_id=stack, name="honesty",
                       statement="Tell the truth about test results", priority=80))
store.save_belief(Belief(id=new_id(), stack_id=stack,
                         statement="Acceptance tests catch protocol drift", confidence=0.9))
store.save_goal(Goal(id=new_id(), stack_id=stack, title="Ship MemoryHub"))
store.save_drive(Drive(id=new_id(), stack_id=stack, drive_type="curiosity",
                       intensity=0.7, focus_areas=["testing"]))
store.save_relationship(Relationship(id=new_id(), stack_id=stack, entity_name="Ada",
                                     entity_type="person", relationship_type="colleague"))
store.save_playbook(Playbook(id=new_id(), stack_id=stack, name="deploy",
                             description="How to deploy safely", trigger_conditions=["release"],
                             steps=[{"action": "migrate"}, {"action": "restart"}],
                             failure_modes=["downtime"]))
print("pending:", store.get_pending_sync_count())
'''

EXPECTED_KINDS = {"episode": 2, "note": 1, "value": 1, "belief": 1, "goal": 1, "drive": 1, "relationship": 1,
                  "playbook": 1}


def _out(result) -> str:
    return f"exit={result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


def test_push_pull_second_device_and_search_with_the_real_cli(kernle, kernle_server) -> None:
    import subprocess

    device_a = kernle.new_data_dir()

    def run_a(*args: str, **kwargs):
        result = kernle.run(*args, data_dir=device_a, stack="acceptance", **kwargs)
        assert result.returncode == 0, _out(result)
        return result

    run_a("auth", "register", "--email", "sync-acceptance@example.test", "--backend-url", kernle_server, "--json")
    api_key = kernle.credentials(device_a)["api_key"]

    # §10.4: every syncable type.
    run_a("raw", "capture", "--stdin", "--quiet", input="First thought for acceptance\n")
    raw_id = kernle.json(run_a("raw", "list", "--json"))[0]["id"]
    run_a("episode", "Deployed the acceptance build", "success", "--lesson", "Run migrations first",
          "--tag", "acceptance", "--derived-from", f"raw:{raw_id}")
    run_a("note", "Acceptance notes are searchable", "--derived-from", f"raw:{raw_id}")
    run_a("checkpoint", "save", "acceptance checkpoint")
    snippet = subprocess.run([str(kernle.python), "-c", STORAGE_SNIPPET], env=kernle.env(device_a, stack="acceptance"),
                             cwd=device_a, capture_output=True, text=True, timeout=120)
    assert snippet.returncode == 0, snippet.stdout + snippet.stderr
    status = kernle.json(run_a("sync", "status", "--json"))
    assert status["backend_connected"] is True
    assert status["pending_operations"] == 9

    # §10.4: push, then nothing is pending.
    pushed = kernle.json(run_a("sync", "push", "--json"))
    assert pushed["synced"] == 9, pushed
    assert pushed["conflicts"] == []
    assert kernle.json(run_a("sync", "status", "--json"))["pending_operations"] == 0
    stack = Stack.objects.get(slug="acceptance")
    stored = Memory.objects.filter(stack=stack)
    assert stored.count() == 9
    kinds: dict[str, int] = {}
    for kind in stored.values_list("kind", flat=True):
        kinds[kind] = kinds.get(kind, 0) + 1
    assert kinds == EXPECTED_KINDS
    value = stored.get(kind="value")
    assert value.data["name"] == "honesty" and value.data["priority"] == 80

    # §10.4: the first pull echoes the 9 records without overwriting anything; then up to date.
    first_pull = kernle.json(run_a("sync", "pull", "--json"))
    assert first_pull["pulled"] == 9, first_pull
    assert first_pull["poisoned_new"] == 0 and first_pull["poisoned_pending"] == 0
    second_pull = run_a("sync", "pull")
    assert "Already up to date" in second_pull.stdout, _out(second_pull)
    full_pull = kernle.json(run_a("sync", "pull", "--full", "--json"))
    assert full_pull["pulled"] == 9 and full_pull["poisoned_pending"] == 0
    run_a("sync", "full")
    conflicts = run_a("sync", "conflicts", "--json").stdout
    assert "backend_rejected" not in conflicts and "pull_apply_failed" not in conflicts

    # §10.4: a second device logs in with the same key; a full pull receives every supported record.
    device_b = kernle.new_data_dir()

    def run_b(*args: str):
        result = kernle.run(*args, data_dir=device_b, stack="acceptance")
        assert result.returncode == 0, _out(result)
        return result

    run_b("auth", "login", "--api-key", api_key, "--backend-url", kernle_server, "--json")
    pulled_b = kernle.json(run_b("sync", "pull", "--full", "--json"))
    assert pulled_b["pulled"] == 9, pulled_b
    assert pulled_b["conflicts"] == 0 and pulled_b["poisoned_pending"] == 0
    run_b("status")
    dump = subprocess.run(
        [str(kernle.python), "-c",
         "from kernle import Kernle; s = Kernle(stack_id='acceptance')._storage;"
         "print(len(s.get_episodes()), len(s.get_notes()), len(s.get_values()), len(s.get_beliefs()),"
         " len(s.get_goals()), len(s.get_drives()), len(s.get_relationships()), len(s.list_playbooks()))"],
        env=kernle.env(device_b, stack="acceptance"), cwd=device_b, capture_output=True, text=True, timeout=120)
    assert dump.returncode == 0, dump.stdout + dump.stderr
    assert dump.stdout.split() == ["2", "1", "1", "1", "1", "1", "1", "1"], dump.stdout

    # §10.5: an empty device finds the pushed memories on the server.
    device_c = kernle.new_data_dir()
    kernle.run("auth", "login", "--api-key", api_key, "--backend-url", kernle_server, "--json", data_dir=device_c)
    found = kernle.run("search", "searchable", data_dir=device_c, stack="acceptance")
    assert found.returncode == 0, _out(found)
    assert "Acceptance notes are searchable" in found.stdout, _out(found)
    lesson = kernle.run("search", "migrations", data_dir=device_c, stack="acceptance")
    assert "Deployed the acceptance build" in lesson.stdout, _out(lesson)

    # §10.6: env-only mode with the raw API key as Bearer, and a bad token (401 → exit 1).
    env_only = kernle.run("sync", "pull", "--full", "--json", data_dir=kernle.new_data_dir(), stack="acceptance",
                          env={"KERNLE_BACKEND_URL": kernle_server, "KERNLE_AUTH_TOKEN": api_key})
    assert env_only.returncode == 0, _out(env_only)
    assert kernle.json(env_only)["pulled"] == 9
    bad = kernle.run("sync", "pull", data_dir=kernle.new_data_dir(), stack="acceptance",
                     env={"KERNLE_BACKEND_URL": kernle_server,
                          "KERNLE_AUTH_TOKEN": "knl_sk_00000000000000000000000000000000"})
    assert bad.returncode == 1, _out(bad)
    assert Memory.objects.filter(stack=stack).count() == 9  # nothing duplicated by any of the pulls
