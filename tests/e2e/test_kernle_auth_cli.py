"""The real kernle 0.15.0 CLI against a live MemoryHub: register, login and the key lifecycle
(docs/kernle-protocol.md §10.2 and §10.3)."""

from __future__ import annotations

import pytest

from accounts.models import ApiKey, AuditEvent, User
from stacks.models import Stack

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _out(result) -> str:
    return f"exit={result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


def test_register_login_and_key_lifecycle_with_the_real_cli(kernle, kernle_server) -> None:
    device_a = kernle.new_data_dir()
    email = "acceptance@example.test"

    # Register: the stored secret is a real API key; the server created user, stack and key.
    registered = kernle.run("auth", "register", "--email", email, "--backend-url", kernle_server, "--json",
                            data_dir=device_a, stack="acceptance")
    assert registered.returncode == 0, _out(registered)
    body = kernle.json(registered)
    assert body["status"] == "success"
    assert body["backend_url"] == kernle_server
    assert body["user_id"].startswith("usr_")
    credentials = kernle.credentials(device_a)
    api_key = credentials["api_key"]
    assert api_key.startswith("knl_sk_") and len(api_key) == 39
    assert credentials["auth_token"]
    user = User.objects.get(public_id=body["user_id"])
    assert user.email == email
    stack = Stack.objects.get(organization__memberships__user=user, slug="acceptance")
    assert stack.organization.kind == "personal"
    assert ApiKey.objects.get(user=user).stack_id == stack.pk  # the register key is stack-bound

    status = kernle.run("auth", "status", "--json", data_dir=device_a, stack="acceptance")
    assert status.returncode == 0, _out(status)
    status_body = kernle.json(status)
    assert status_body["authenticated"] is True and status_body["token_valid"] is True

    # Duplicate email (case-insensitive) from another device: 409 → exit 1 with the message.
    duplicate = kernle.run("auth", "register", "--email", email.upper(), "--backend-url", kernle_server,
                           data_dir=kernle.new_data_dir(), stack="other")
    assert duplicate.returncode == 1, _out(duplicate)
    assert "Email already registered" in duplicate.stdout
    assert User.objects.filter(email__iexact=email).count() == 1
    assert not Stack.objects.filter(slug="other").exists()

    # Login on a second device with the key.
    device_b = kernle.new_data_dir()
    login = kernle.run("auth", "login", "--api-key", api_key, "--backend-url", kernle_server, "--json",
                       data_dir=device_b)
    assert login.returncode == 0, _out(login)
    login_body = kernle.json(login)
    assert login_body["status"] == "success"
    assert login_body["user_id"] == body["user_id"]
    assert login_body["token_expires"].endswith("+00:00")

    # Create a key (not bound to a stack), list it in text and JSON modes.
    created = kernle.run("auth", "keys", "create", "--name", "ci", "--json", data_dir=device_a)
    assert created.returncode == 0, _out(created)
    created_body = kernle.json(created)
    key_id, old_key = created_body["id"], created_body["key"]
    assert created_body["name"] == "ci" and old_key.startswith("knl_sk_")
    assert ApiKey.objects.get(public_id=key_id).stack_id is None

    listed_text = kernle.run("auth", "keys", "list", data_dir=device_a)
    assert listed_text.returncode == 0, _out(listed_text)
    assert "ci" in listed_text.stdout and key_id in listed_text.stdout
    assert old_key not in listed_text.stdout  # never the secret again
    listed_json = kernle.run("auth", "keys", "list", "--json", data_dir=device_a)
    assert listed_json.returncode == 0, _out(listed_json)
    keys = kernle.json(listed_json)
    assert isinstance(keys, list)
    assert {k["id"] for k in keys} == {key_id, ApiKey.objects.get(user=user, name="register").public_id}

    # Cycle: flat new id/key plus old_key_id; the old key stops working, the new one works.
    cycled = kernle.run("auth", "keys", "cycle", key_id, "--force", "--json", data_dir=device_a)
    assert cycled.returncode == 0, _out(cycled)
    cycled_body = kernle.json(cycled)
    new_id, new_key = cycled_body["id"], cycled_body["key"]
    assert new_id != key_id and new_key.startswith("knl_sk_") and new_key != old_key
    assert cycled_body.get("old_key_id", key_id) == key_id
    old_login = kernle.run("auth", "login", "--api-key", old_key, "--backend-url", kernle_server,
                           data_dir=kernle.new_data_dir())
    assert old_login.returncode == 1, _out(old_login)
    assert "Invalid API key" in old_login.stdout
    new_login = kernle.run("auth", "login", "--api-key", new_key, "--backend-url", kernle_server, "--json",
                           data_dir=kernle.new_data_dir())
    assert new_login.returncode == 0, _out(new_login)

    # The revoked (cycled-out) key is listed as REVOKED in text mode.
    relisted = kernle.run("auth", "keys", "list", data_dir=device_a)
    assert relisted.returncode == 0, _out(relisted)
    assert "REVOKED" in relisted.stdout

    # Revoke the new key: the CLI reports success and the key no longer logs in.
    revoked = kernle.run("auth", "keys", "revoke", new_id, "--force", "--json", data_dir=device_a)
    assert revoked.returncode == 0, _out(revoked)
    assert kernle.json(revoked) == {"status": "success", "key_id": new_id, "action": "revoked"}
    after = kernle.run("auth", "login", "--api-key", new_key, "--backend-url", kernle_server,
                       data_dir=kernle.new_data_dir())
    assert after.returncode == 1, _out(after)

    # Revoking someone else's / an unknown key is "not found", exit 1.
    unknown = kernle.run("auth", "keys", "revoke", "key_doesnotexist", "--force", data_dir=device_a)
    assert unknown.returncode == 1, _out(unknown)
    assert "Key not found" in unknown.stdout

    actions = set(AuditEvent.objects.filter(organization=stack.organization).values_list("action", flat=True))
    assert {"key.issued", "key.cycled", "key.revoked", "stack.created", "login.succeeded"} <= actions


def test_register_with_a_bad_email_exits_1_with_the_servers_detail_and_stores_nothing(kernle, kernle_server) -> None:
    # The CLI validates stack ids itself but sends any email: the server's 400 `detail` is shown.
    bad = kernle.run("auth", "register", "--email", "not-an-email", "--backend-url", kernle_server,
                     data_dir=kernle.new_data_dir(), stack="fine-stack")
    assert bad.returncode == 1, _out(bad)
    assert "Registration failed: Invalid email address." in bad.stdout
    assert not User.objects.exists()
    assert not Stack.objects.exists()
