"""The real kernle 0.15.0 CLI's push is named as its own (docs/privacy.md "Provenance"): the key by
its id and name, the kernle path, and never the key's secret."""

from __future__ import annotations

import json

import pytest

from accounts.models import ApiKey
from memories.models import Memory

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_kernle_push_names_its_key_and_path_and_no_secret(kernle, kernle_server) -> None:
    device = kernle.new_data_dir()

    def run(*args: str, **kwargs):
        result = kernle.run(*args, data_dir=device, stack="provenance", **kwargs)
        assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
        return result

    run("auth", "register", "--email", "provenance@example.test", "--backend-url", kernle_server, "--json")
    secret = kernle.credentials(device)["api_key"]
    run("raw", "capture", "--stdin", "--quiet", input="A thought on the device\n")
    raw_id = kernle.json(run("raw", "list", "--json"))[0]["id"]
    run("note", "Written on the device and pushed", "--derived-from", f"raw:{raw_id}")
    assert kernle.json(run("sync", "push", "--json"))["synced"] == 1
    memory = Memory.objects.get(stack__slug="provenance", kind="note")
    key = ApiKey.objects.get(public_id=memory.written_by["key_id"])
    assert memory.written_by["path"] == "kernle" and memory.written_by["key_name"] == key.name
    assert memory.written_by["user"] == "provenance@example.test"
    assert secret not in json.dumps(memory.written_by)
